"""Creating a session: the workspace captured, the overlay, keys and identity files, the VM booted, its egress
opened. On any failure or interrupt (Ctrl-C, SIGTERM), nothing is left behind."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from vmsandbox import paths, pids, ui
from vmsandbox.confine import access, accounts, beneath
from vmsandbox.egress import control, policy, ports
from vmsandbox.egress.policy import Request
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest import bootfiles, ssh
from vmsandbox.guest.bootfiles import GuestUser
from vmsandbox.image import blueprint, store
from vmsandbox.image.blueprint import Blueprint
from vmsandbox.session.options import Options
from vmsandbox.session.place import choose, pins
from vmsandbox.session.place.hostspec import HostSpec
from vmsandbox.session.place.interface import Host
from vmsandbox.session.record import Phase, Record, default_name, validate_name
from vmsandbox.session.running import logins
from vmsandbox.session.settings import Settings
from vmsandbox.session.start.project import opened
from vmsandbox.sync.inward import capture
from vmsandbox.vm import accel


def create(opts: Options) -> Record:
    """Create a session and boot its VM; on any failure or interrupt, nothing is left behind. The project is opened
    and checked once, and captured from that descriptor (project.opened)."""
    with opened(opts.project) as tree:
        return _create(opts, tree)


def _create(opts: Options, tree: beneath.Root) -> Record:
    project = tree.path
    name = validate_name(opts.name) if opts.name else default_name(project)
    settings = opts.settings
    policy.check_secrets(settings.network, settings.secrets, quiet=True)  # the command line said it already
    bp = opts.blueprint or blueprint.load("base")
    image = opts.image or store.current_image()
    if opts.ssh_agent:
        if not os.environ.get("SSH_AUTH_SOCK"):
            raise VmsandboxError("--ssh-agent: no ssh-agent here (SSH_AUTH_SOCK is not set)", hint="start one first")
        ui.warn("--ssh-agent: the guest can use your SSH keys (not read them) while the session runs")
    with choose.host(choose.spec_for(opts.host, settings.libvirt_uri)) as host:
        host.libvirt()  # fails early, before anything is made, if libvirt is down
        choice = _accel(opts, host)
        files = paths.session_paths(name)
        accounts.state_dirs()
        try:
            make_dir(files)
        except FileExistsError:
            raise VmsandboxError(
                f"a session named {name} already exists",
                hint=f"pick another --name, or `vmsandbox rm {name}`",
            ) from None
        user = GuestUser("root", 0, 0) if opts.build_disk else GuestUser.of_host()
        record = _new_record(name, project, image, choice, settings, user, bp, opts, host.spec)
        try:
            record.save()
            pins.pin(name, image.version, None)
            record.publish = ports.choose(opts.publish)
            _prepare(record, user, settings, bp, opts, tree)
            spawned: list[control.Spawned] = []

            def launched() -> None:  # the egress daemon starts while the guest boots, and waits for its sshd
                if record.wants_daemon:
                    spawned[:] = [control.spawn(daemon_spec(record, fresh=True), files)]

            host.boot(record, image, cold=opts.cold, timeout=settings.boot_timeout, launched=launched)
            pins.pin(name, image.version, record.template)
            _open_egress(record, settings, spawned[0] if spawned else None)
            record.status = Phase.READY
            record.save()
        except BaseException:
            control.stop(files)
            host.forget(files.root, record.domain)
            shutil.rmtree(files.root, ignore_errors=True)
            pins.unpin(name)
            raise
    return record


def _accel(opts: Options, host: Host) -> accel.Choice:
    """The accelerator the host allows, once it has room for the session under its limits."""
    requested = opts.settings.accel
    choice = host.admit(requested, opts.settings.memory_mib)
    if choice.accel is accel.Accel.TCG and requested is accel.Accel.AUTO:
        ui.warn(choice.reason)
    return choice


def _new_record(
    name: str,
    project: Path,
    image: store.Image,
    choice: accel.Choice,
    settings: Settings,
    user: GuestUser,
    bp: Blueprint,
    opts: Options,
    there: HostSpec,
) -> Record:
    return Record(
        name=name,
        project=str(project),
        image_version=image.version,
        accel=choice.accel.value,
        accel_reason=choice.reason,
        cpus=settings.cpus,
        memory_mib=settings.memory_mib,
        disk_mib=settings.disk_mib,
        ssh_port=0,
        user=user.name,
        uid=user.uid,
        gid=user.gid,
        libvirt_uri=there.uri,
        host=there.name,
        network=settings.network,
        blueprint=bp.name,
        ssh_agent=opts.ssh_agent,
        credentials=list(bp.credentials),
        disk=str(opts.build_disk) if opts.build_disk else None,
        keep=opts.keep,
        group=opts.group,
        owner_pid=os.getpid(),
        owner_start=pids.process_start(os.getpid()),
    )


def _prepare(
    record: Record, user: GuestUser, settings: Settings, bp: Blueprint, opts: Options, tree: beneath.Root
) -> None:
    files = record.files
    if opts.baseline_from is None:
        with ui.step(f"Capturing {record.project} (baseline and workspace disk)"):
            record.baseline_entries = len(capture.capture(tree, files, leave_out=opts.leave_out))
    else:
        with ui.step("Copying the capture of the project"):
            record.baseline_entries = len(
                capture.copy_from(paths.SessionPaths(opts.baseline_from), files, opts.baseline_from / capture.PRISTINE)
            )
    record.workspace_bytes = files.workspace_disk.stat().st_size  # as the host made it: copies take no more
    with ui.step("Preparing the session (keys, identity)"):
        write_identity(files, record.name, f"vmsandbox-{record.name}", user, record.project)
        fw = files.fwcfg_dir
        request = Request(
            settings.network,
            settings.rules(),
            settings.allow_networks,
            settings.secrets,
            any_network=opts.trusted_build,
        )
        placeholders = policy.prepare(record.name, files, request)
        (fw / "env").write_text(bootfiles.env_lines({**bp.env, **placeholders}))
        bundle, notes = bootfiles.build(user, bp.copy, git=opts.git_identity, more=lambda b: logins.add_to(b, bp))
        if bundle is not None:
            (fw / "files").write_bytes(bundle)
    for note in notes:
        ui.info(f"  into the guest: {note}")
    record.save()


def make_dir(files: paths.SessionPaths) -> None:
    """A new session directory, private: QEMU's user reaches the disks, the guest-data account the mirror
    (FileExistsError if it is there)."""
    files.root.mkdir(mode=0o700)
    accounts.private_dir(files.root)
    if os.geteuid() != 0:
        access.inherit_for_me(files.root)


def write_identity(files: paths.SessionPaths, name: str, hostname: str, user: GuestUser, workdir: str | None) -> None:
    """The session's SSH keys and the identity files the guest reads (fw_cfg at a cold boot, the identity port
    after a warm start): no `workdir`, and the guest mounts no workspace by itself."""
    client_pub = ssh.generate_key(files.client_key, f"vmsandbox-{name}")
    ssh.generate_key(files.host_key, f"vmsandbox-{name}-host")
    fw = files.fwcfg_dir
    fw.mkdir(mode=0o700)
    (fw / "template").write_text("1\n")  # read only by a restored template's domain (local.start.spec)
    (fw / "hostname").write_text(hostname + "\n")
    (fw / "user").write_text(f"{user.name} {user.uid} {user.gid}\n")
    if workdir is not None:
        (fw / "workdir").write_text(workdir + "\n")
    (fw / "authorized_keys").write_text(client_pub + "\n")
    shutil.copyfile(files.host_key, fw / "host_key")


def daemon_spec(record: Record, *, fresh: bool = False) -> control.Spec:
    return control.Spec(
        record.name, record.ssh_port, record.network.has_door, record.publish, record.libvirt_uri, record.domain, fresh
    )


def open_egress(record: Record) -> None:
    """Start (or restart) the session's egress daemon and wait until the guest's door is open."""
    control.start(daemon_spec(record), record.files)


def _open_egress(record: Record, settings: Settings, spawned: control.Spawned | None) -> None:
    if not settings.network.has_door:
        ui.info("No network for this session (--network none)")
    if not record.wants_daemon:
        return
    label = settings.network.label(len(settings.allow)) if settings.network.has_door else "the guest's published ports"
    with ui.step(f"Opening the guest's egress proxy ({label})"), ssh.login_ahead(record.endpoint()):
        if spawned is None:
            open_egress(record)
        else:
            control.wait_open(daemon_spec(record), record.files, spawned)
    for p in record.publish:
        ui.info(f"Guest port {p.guest} is published on {', '.join(p.places())}")
