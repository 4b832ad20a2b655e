"""Creating a session: the workspace captured, the overlay, keys and identity files, the VM booted, its egress
opened. On any failure or interrupt (Ctrl-C, SIGTERM), nothing is left behind."""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path

from vmsandbox import confine, failpoint, paths, pids, ui
from vmsandbox.egress import control, policy, ports
from vmsandbox.egress.policy import Request
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest import files as guestfiles
from vmsandbox.guest import ssh
from vmsandbox.guest.files import GuestUser
from vmsandbox.image import blueprint as blueprint_mod
from vmsandbox.image import store
from vmsandbox.image.blueprint import Blueprint
from vmsandbox.session import boot
from vmsandbox.session.config import Settings
from vmsandbox.session.options import Options
from vmsandbox.session.record import Phase, Record, default_name, validate_name, validate_project
from vmsandbox.session.state import console_tail
from vmsandbox.sync import capture
from vmsandbox.vm import accel as accel_mod
from vmsandbox.vm import qemuimg
from vmsandbox.vm.domain import DomainSpec, Forward, build_xml
from vmsandbox.vm.virt import Hypervisor, PortTakenError, gone

PORT_ATTEMPTS = 4
BOOT_TAIL_LINES = 15


def create(opts: Options) -> Record:
    """Create a session and boot its VM; on any failure or interrupt, nothing is left behind."""
    project = validate_project(opts.project)
    name = validate_name(opts.name) if opts.name else default_name(project)
    settings = opts.settings
    policy.check_secrets(settings.network, settings.secrets, quiet=True)  # the command line said it already
    bp = opts.blueprint or blueprint_mod.load("base")
    choice = accel_mod.choose(settings.accel)
    if choice.accel is accel_mod.Accel.TCG and settings.accel is accel_mod.Accel.AUTO:
        ui.warn(choice.reason)
    image = opts.image or store.current_image()
    if opts.ssh_agent:
        if not os.environ.get("SSH_AUTH_SOCK"):
            raise VmsandboxError("--ssh-agent: no ssh-agent here (SSH_AUTH_SOCK is not set)", hint="start one first")
        ui.warn("--ssh-agent: the guest can use your SSH keys (not read them) while the session runs")
    with Hypervisor(settings.libvirt_uri) as hv:  # fails early, before anything is made, if libvirt is down
        files = paths.session_paths(name)
        confine.state_dirs()
        try:
            files.root.mkdir(mode=0o700)
        except FileExistsError:
            raise VmsandboxError(
                f"a session named {name} already exists",
                hint=f"pick another --name, or `vmsandbox destroy {name}`",
            ) from None
        confine.private_dir(files.root)  # QEMU's user reaches the disks, the guest-data account the mirror
        user = GuestUser("root", 0, 0) if opts.build_disk else GuestUser.of_host()
        record = _new_record(name, project, image, choice, settings, user, bp, opts)
        try:
            record.save()
            record.publish = ports.choose(opts.publish)
            _prepare(record, image, user, settings, bp, git_identity=opts.git_identity, trusted=opts.trusted_build)
            _boot(record, image, hv, settings.boot_timeout)
            _open_egress(record, settings)
            record.status = Phase.READY
            record.save()
        except BaseException:
            control.stop(files)
            hv.destroy(record.domain)
            shutil.rmtree(files.root, ignore_errors=True)
            raise
    return record


def _new_record(
    name: str,
    project: Path,
    image: store.Image,
    choice: accel_mod.Choice,
    settings: Settings,
    user: GuestUser,
    bp: Blueprint,
    opts: Options,
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
        libvirt_uri=settings.libvirt_uri,
        network=settings.network,
        blueprint=bp.name,
        ssh_agent=opts.ssh_agent,
        credentials=list(bp.credentials),
        disk=str(opts.build_disk) if opts.build_disk else None,
        keep=opts.keep,
        owner_pid=os.getpid(),
        owner_start=pids.process_start(os.getpid()),
    )


def _prepare(
    record: Record,
    image: store.Image,
    user: GuestUser,
    settings: Settings,
    bp: Blueprint,
    *,
    git_identity: bool,
    trusted: bool = False,
) -> None:
    files = record.files
    with ui.step(f"Capturing {record.project} (baseline and workspace disk)"):
        manifest = capture.capture(Path(record.project), files)
    record.baseline_entries = len(manifest)
    with ui.step("Preparing the session (overlay, keys)"):
        if record.disk is None:
            qemuimg.create_overlay(image.disk, record.system_disk, record.disk_mib * 1024 * 1024, layer_ok=True)
            record.system_disk.chmod(0o600)
        client_pub = ssh.generate_key(files.client_key, f"vmsandbox-{record.name}")
        ssh.generate_key(files.host_key, f"vmsandbox-{record.name}-host")
        fw = files.fwcfg_dir
        fw.mkdir(mode=0o700)
        (fw / "hostname").write_text(f"vmsandbox-{record.name}\n")
        (fw / "user").write_text(f"{user.name} {user.uid} {user.gid}\n")
        (fw / "workdir").write_text(record.project + "\n")
        (fw / "authorized_keys").write_text(client_pub + "\n")
        shutil.copyfile(files.host_key, fw / "host_key")
        request = Request(
            settings.network, settings.rules(), settings.allow_networks, settings.secrets, any_network=trusted
        )
        placeholders = policy.prepare(record.name, files, request)
        (fw / "env").write_text(guestfiles.env_lines({**bp.env, **placeholders}))
        bundle, notes = guestfiles.build(user, bp.copy, git=git_identity)
        if bundle is not None:
            (fw / "files").write_bytes(bundle)
        _give_to_qemu(fw)
    for note in notes:
        ui.info(f"  into the guest: {note}")
    record.save()


def _give_to_qemu(directory: Path) -> None:
    """fw_cfg files are opened by QEMU itself, which runs as libvirt's unprivileged user."""
    uid = confine.qemu_uid()
    if uid is None or os.geteuid() != 0:
        return
    gid = pwd.getpwuid(uid).pw_gid
    os.chown(directory, uid, gid)
    for f in directory.iterdir():
        os.chown(f, uid, gid)
        f.chmod(0o400)


def _boot(record: Record, image: store.Image, hv: Hypervisor, boot_timeout: int) -> None:
    files = record.files
    last_error: VmsandboxError | None = None
    for _attempt in range(PORT_ATTEMPTS):
        record.ssh_port = ports.free_port()
        ssh.write_known_hosts(files, record.ssh_port, files.host_key.with_suffix(".pub").read_text())
        record.endpoint().write_config()
        spec = DomainSpec(
            name=record.domain,
            session=record.name,
            session_dir=files.root,
            accel=accel_mod.Accel(record.accel),
            cpus=record.cpus,
            memory_mib=record.memory_mib,
            disk=record.system_disk,
            kernel=image.kernel,
            initrd=image.initrd,
            cmdline=image.kernel_cmdline,
            console_log=files.console_log,
            forwards=(Forward(record.ssh_port, 22),),
            fwcfg_files={f.name: f for f in sorted(files.fwcfg_dir.iterdir())},
            workspace_disk=files.workspace_disk,
        )
        xml = build_xml(spec)
        paths.write_atomically(files.domain_xml, xml)
        try:
            hv.create(xml)
        except PortTakenError as exc:
            last_error = exc  # lost a race for the port: pick another
            continue
        break
    else:
        raise VmsandboxError(
            f"no free port for SSH after {PORT_ATTEMPTS} tries: {last_error}",
            hint="too many ports on 127.0.0.1 are taken; free some and retry",
        )
    record.save()
    _wait_for_ssh(record, hv, boot_timeout)
    record.save()


def _wait_for_ssh(record: Record, hv: Hypervisor, boot_timeout: int) -> None:
    """Wait for the guest's sshd, showing how far the boot got; a failed boot says where it stopped, what the
    host gave it, and where its console is kept."""
    if record.accel == accel_mod.Accel.TCG.value and (busy := boot.busy_warning()):
        ui.warn(busy)
    watch = boot.Watch(record.files.console_log, hv.cpu_seconds(record.domain) or 0.0, boot_timeout)
    failpoint.hit("run.boot")
    title = f"Booting {record.domain} ({record.accel.upper()}, {record.cpus} vCPU, {record.memory_mib} MiB)"
    with ui.step(title) as detail:

        def alive() -> str | None:
            if gone(hv.info(record.domain)):
                return "the VM powered off or crashed"
            if (stage := watch.advanced()) is not None:
                detail(stage.name.lower())
            if starving := watch.starving(hv.cpu_seconds(record.domain)):
                ui.warn(f"the boot is slow: {starving}")
            if (last := watch.stalled()) is not None:
                ui.warn(
                    f"the guest stopped early in its boot ({watch.stall_limit:.0f} s without output after "
                    f"{last!r}); resetting the VM (boot {watch.resets + 2} of {boot.RESETS + 1})"
                )
                hv.reset(record.domain)
                watch.was_reset()
            return None

        try:
            record.boot_seconds = round(ssh.wait_for_banner(record.ssh_port, timeout=boot_timeout, alive=alive), 1)
        except VmsandboxError as exc:
            raise _boot_failed(record, exc, watch, watch.cpu(hv.cpu_seconds(record.domain))) from exc


def _boot_failed(record: Record, exc: VmsandboxError, watch: boot.Watch, cpu: boot.Cpu | None) -> VmsandboxError:
    text = boot.read(record.files.console_log, watch.offset)
    resets = f" (after {watch.resets} reset(s) of a stalled boot)" if watch.resets else ""
    lines = [f"{exc.message}; the boot got as far as: {boot.stage_of(text).described}{resets}"]
    if cpu is not None:
        lines.append(f"({cpu.verdict() or cpu.figures})")
    if found := boot.trouble(text):
        lines.append("The console reports:\n" + "\n".join(f"  {t}" for t in found))
    lines.append("Last lines of the console:\n" + boot.plain(console_tail(record.name, lines=BOOT_TAIL_LINES)))
    kept = boot.keep(record.files.console_log, record.name)
    where = f"the console is kept at {kept}" if kept else "the guest wrote no console"
    hint = f"{where}; on a busy host raise boot_timeout (config) or run fewer sessions at once"
    return VmsandboxError("\n".join(lines), hint=hint)


def daemon_spec(record: Record) -> control.Spec:
    return control.Spec(
        record.name, record.ssh_port, record.network.has_door, record.publish, record.libvirt_uri, record.domain
    )


def open_egress(record: Record) -> None:
    """Start (or restart) the session's egress daemon and wait until the guest's door is open."""
    control.start(daemon_spec(record), record.files)


def _open_egress(record: Record, settings: Settings) -> None:
    if not settings.network.has_door:
        ui.info("No network for this session (--network none)")
    if not record.wants_daemon:
        return
    label = settings.network.label(len(settings.allow)) if settings.network.has_door else "the guest's published ports"
    with ui.step(f"Opening the guest's egress proxy ({label})"):
        open_egress(record)
    for p in record.publish:
        ui.info(f"Guest port {p.guest} is published on {', '.join(p.places())}")
