"""A session: one disposable VM over a per-session overlay, and the directory that records it.

libvirt is the source of truth for what runs; the session record (session.json) lets `ls`, `destroy`
and `gc` find what a crashed or killed `vmsandbox` left behind.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pwd
import re
import secrets
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vmsandbox import confine, paths, proc, ui
from vmsandbox.egress import policy as egress
from vmsandbox.egress.netpolicy import Mode
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest import files as guestfiles
from vmsandbox.guest import ssh
from vmsandbox.guest.files import GuestUser
from vmsandbox.image import blueprint as blueprint_mod
from vmsandbox.image import store as image_mod
from vmsandbox.image.blueprint import Blueprint
from vmsandbox.session.config import Settings
from vmsandbox.sync import workspace
from vmsandbox.vm import accel as accel_mod
from vmsandbox.vm import qemuimg
from vmsandbox.vm.domain import DomainSpec, Forward, build_xml, session_of
from vmsandbox.vm.virt import DomainInfo, Hypervisor

DOMAIN_PREFIX = "vmsandbox-"
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,30}$")
PORT_ATTEMPTS = 4
CONSOLE_TAIL_LINES = 30
CONSOLE_TAIL_BYTES = 64 * 1024  # the guest writes the console: read only its end


@dataclass
class Record:
    name: str
    project: str
    image_version: str
    accel: str
    accel_reason: str
    cpus: int
    memory_mib: int
    disk_mib: int
    ssh_port: int
    user: str
    uid: int
    gid: int
    libvirt_uri: str
    created: float = field(default_factory=time.time)
    keep: bool = False
    owner_pid: int | None = None
    owner_start: str | None = None
    status: str = "creating"  # creating -> ready
    boot_seconds: float | None = None
    baseline_entries: int = 0
    unsynced: int | None = None  # pending changes at the last review (None: never reviewed)
    exported: bool = False  # the VM is gone; its unsynced changes wait in the outbox
    network: str = "allowlist"  # allowlist | open | none
    blueprint: str = "base"
    publish: list[dict[str, Any]] = field(default_factory=list)  # {"guest": 3000, "host": 8080, "addresses": [...]}
    ssh_agent: bool = False  # the host's ssh-agent is forwarded into the guest (opt-in)
    credentials: list[str] = field(default_factory=list)  # home-relative files `clean` wipes (the blueprint's)
    disk: str | None = None  # the system disk when it is not the session's overlay (image builds)

    @property
    def domain(self) -> str:
        return DOMAIN_PREFIX + self.name

    @property
    def files(self) -> paths.SessionPaths:
        return paths.session_paths(self.name)

    def endpoint(self, user: str | None = None) -> ssh.Endpoint:
        return ssh.Endpoint(self.name, self.ssh_port, user or self.user, self.files, self.ssh_agent)

    def save(self) -> None:
        paths.write_atomically(self.files.record, json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, name: str) -> Record:
        record_file = paths.session_paths(name).record
        try:
            data = json.loads(record_file.read_text())
        except FileNotFoundError:
            raise VmsandboxError(f"no session named {name!r}", hint="list sessions with `vmsandbox ls`") from None
        except ValueError as exc:
            raise VmsandboxError(
                f"the record of session {name} is damaged: {exc}",
                hint=f"remove it with `vmsandbox destroy {name} --force`",
            ) from exc
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def wants_daemon(self) -> bool:
        """Whether the session's proxy daemon should run: for egress, or to serve published ports."""
        return self.network != "none" or bool(self.publish)

    def owner_alive(self) -> bool:
        return self.owner_pid is not None and proc.process_start(self.owner_pid) == self.owner_start


def validate_project(path: Path) -> Path:
    if not path.exists():
        raise VmsandboxError(f"{path} does not exist", hint="give the path of a project directory")
    if not path.is_dir():
        raise VmsandboxError(f"{path} is not a directory", hint="give the path of a project directory")
    resolved = path.resolve()
    if resolved == Path("/") or resolved == Path.home().resolve():
        raise VmsandboxError(
            f"refusing to sandbox {resolved}: it is too broad", hint="run vmsandbox inside a project directory"
        )
    return resolved


def validate_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise VmsandboxError(
            f"invalid session name {name!r}",
            hint="use 1-31 lowercase letters, digits and dashes, starting with a letter or digit",
        )
    return name


def default_name(project: Path) -> str:
    stem = re.sub(r"[^a-z0-9-]+", "-", project.name.lower()).strip("-")[:20] or "session"
    return f"{stem}-{secrets.token_hex(2)}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((ssh.LOOPBACK, 0))
        return int(s.getsockname()[1])


def console_tail(name: str, lines: int = CONSOLE_TAIL_LINES) -> str:
    log_file = paths.session_paths(name).console_log
    try:
        with log_file.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - CONSOLE_TAIL_BYTES))
            text = f.read().decode(errors="replace")
    except OSError:
        return "(no console output)"
    tail = [line.rstrip() for line in text.splitlines() if line.strip()][-lines:]
    return "\n".join(tail) or "(no console output)"


def names() -> list[str]:
    root = paths.sessions_dir()
    if not root.is_dir():
        return []
    return sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))


@dataclass(frozen=True)
class Publish:
    guest: int
    host: int | None = None  # None: a free port
    addresses: tuple[str, ...] = ("127.0.0.1", "::1")


@dataclass(frozen=True)
class Options:
    project: Path
    name: str | None
    settings: Settings
    keep: bool = False
    blueprint: Blueprint | None = None  # None: base
    image: image_mod.Image | None = None  # None: the blueprint's built image (or the current base)
    publish: tuple[Publish, ...] = ()
    ssh_agent: bool = False
    git_identity: bool = False
    build_disk: Path | None = None  # image builds: boot this disk read-write (no overlay), as root
    trusted_build: bool = False  # image builds: allowed names may resolve to private addresses (not loopback)


def create(opts: Options) -> Record:
    """Create a session and boot its VM; on any failure or interrupt, nothing is left behind."""
    project = validate_project(opts.project)
    name = validate_name(opts.name) if opts.name else default_name(project)
    settings = opts.settings
    egress.check_secrets(settings, quiet=True)  # the command line checked (and said) it already
    bp = opts.blueprint or blueprint_mod.load("base")
    choice = accel_mod.choose(settings.accel)
    if choice.accel is accel_mod.Accel.TCG and settings.accel is accel_mod.Accel.AUTO:
        ui.warn(choice.reason)
    image = opts.image or image_mod.current_image()
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
        record = Record(
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
            network=settings.network.value,
            blueprint=bp.name,
            ssh_agent=opts.ssh_agent,
            credentials=list(bp.credentials),
            disk=str(opts.build_disk) if opts.build_disk else None,
            keep=opts.keep,
            owner_pid=os.getpid(),
            owner_start=proc.process_start(os.getpid()),
        )
        try:
            record.save()
            record.publish = _pick_ports(opts.publish)
            _prepare(record, image, user, settings, bp, git_identity=opts.git_identity, trusted=opts.trusted_build)
            _boot(record, image, hv, settings.boot_timeout)
            _open_egress(record, settings)
            record.status = "ready"  # usable: booted, and its egress (if any) open
            record.save()
        except BaseException:
            egress.stop(files)
            hv.destroy(record.domain)
            shutil.rmtree(files.root, ignore_errors=True)
            raise
    return record


def listener(address: str, port: int) -> socket.socket:
    """A listening TCP socket on address:port (IPv4 or IPv6, v6 only), as published ports use."""
    s = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if ":" in address:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        s.bind((address, port))
        s.listen(64)
    except BaseException:
        s.close()
        raise
    return s


def published_at(entry: dict[str, Any]) -> list[str]:
    """Where a published port (a record's `publish` entry) answers: 127.0.0.1:PORT, [::1]:PORT."""
    return [f"[{a}]:{entry['host']}" if ":" in a else f"{a}:{entry['host']}" for a in entry["addresses"]]


def _pick_ports(publish: tuple[Publish, ...]) -> list[dict[str, Any]]:
    """Host ports for --publish: the one asked for, or one free on every address; checked before boot."""
    chosen = []
    for p in publish:
        port = p.host if p.host is not None else free_port()
        addresses = []
        for address in p.addresses:
            try:
                listener(address, port).close()
            except OSError as exc:
                if address == "::1" and p.addresses == Publish.addresses and exc.errno in _NO_IPV6:
                    continue  # a host without IPv6 loopback: 127.0.0.1 only
                raise VmsandboxError(
                    f"--publish: cannot listen on {address} port {port}: {exc.strerror}",
                    hint="pick another host port (HOST_PORT:GUEST_PORT)",
                ) from None
            addresses.append(address)
        chosen.append({"guest": p.guest, "host": port, "addresses": addresses})
    return chosen


_NO_IPV6 = (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT)


def _prepare(
    record: Record,
    image: image_mod.Image,
    user: GuestUser,
    settings: Settings,
    bp: Blueprint,
    *,
    git_identity: bool,
    trusted: bool = False,
) -> None:
    files = record.files
    with ui.step(f"Capturing {record.project} (baseline and workspace disk)"):
        manifest = workspace.capture(Path(record.project), files)
    record.baseline_entries = len(manifest)
    with ui.step("Preparing the session (overlay, keys)"):
        if record.disk is None:
            qemuimg.create_overlay(image.disk, files.overlay, record.disk_mib * 1024 * 1024, layer_ok=True)
            files.overlay.chmod(0o600)
        client_pub = ssh.generate_key(files.client_key, f"vmsandbox-{record.name}")
        ssh.generate_key(files.host_key, f"vmsandbox-{record.name}-host")
        fw = files.fwcfg_dir
        fw.mkdir(mode=0o700)
        (fw / "hostname").write_text(f"vmsandbox-{record.name}\n")
        (fw / "user").write_text(f"{user.name} {user.uid} {user.gid}\n")
        (fw / "workdir").write_text(record.project + "\n")
        (fw / "authorized_keys").write_text(client_pub + "\n")
        shutil.copyfile(files.host_key, fw / "host_key")
        placeholders = egress.prepare(record.name, files, settings, trusted=trusted)
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
    try:
        qemu = pwd.getpwnam("libvirt-qemu")
    except KeyError:
        return
    if os.geteuid() != 0:
        return
    os.chown(directory, qemu.pw_uid, qemu.pw_gid)
    for f in directory.iterdir():
        os.chown(f, qemu.pw_uid, qemu.pw_gid)
        f.chmod(0o400)


def _boot(record: Record, image: image_mod.Image, hv: Hypervisor, boot_timeout: int) -> None:
    files = record.files
    last_error: VmsandboxError | None = None
    for _attempt in range(PORT_ATTEMPTS):
        record.ssh_port = free_port()
        ssh.write_known_hosts(files, record.ssh_port, files.host_key.with_suffix(".pub").read_text())
        record.endpoint().write_config()
        spec = DomainSpec(
            name=record.domain,
            session=record.name,
            session_dir=files.root,
            accel=accel_mod.Accel(record.accel),
            cpus=record.cpus,
            memory_mib=record.memory_mib,
            disk=Path(record.disk) if record.disk else files.overlay,
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
        except VmsandboxError as exc:
            if "host forwarding" in exc.message or "Address already in use" in exc.message:
                last_error = exc  # lost a race for the port: pick another
                continue
            raise
        break
    else:
        raise VmsandboxError(
            f"no free port for SSH after {PORT_ATTEMPTS} tries: {last_error}",
            hint="too many ports on 127.0.0.1 are taken; free some and retry",
        )
    record.save()

    def alive() -> str | None:
        if vm_gone(hv.info(record.domain)):
            return "the VM powered off or crashed"
        return None

    with ui.step(f"Booting {record.domain} ({record.accel.upper()}, {record.cpus} vCPU, {record.memory_mib} MiB)"):
        try:
            record.boot_seconds = round(ssh.wait_for_banner(record.ssh_port, timeout=boot_timeout, alive=alive), 1)
        except VmsandboxError as exc:
            raise VmsandboxError(
                f"{exc.message}. Last lines of the console:\n{console_tail(record.name)}",
                hint=f"the full console log is in {files.console_log}",
            ) from exc
    record.save()


def _open_egress(record: Record, settings: Settings) -> None:
    if settings.network is Mode.NONE:
        ui.info("No network for this session (--network none)")
    if not record.wants_daemon:
        return
    what = "any public host" if settings.network is Mode.OPEN else f"{len(settings.allow)} allowed hosts"
    label = "the guest's published ports" if settings.network is Mode.NONE else f"{settings.network.value}: {what}"
    with ui.step(f"Opening the guest's egress proxy ({label})"):
        egress.start(record.name, record.files)
    for p in record.publish:
        ui.info(f"Guest port {p['guest']} is published on {', '.join(published_at(p))}")


def remove(record: Record) -> None:
    """Destroy the VM and delete the session directory."""
    egress.stop(record.files)
    with Hypervisor(record.libvirt_uri) as hv:
        hv.destroy(record.domain)
    shutil.rmtree(record.files.root, ignore_errors=True)


def retire(record: Record) -> None:
    """Destroy the VM and everything but what a later `recover` needs: the record, the baseline, the review
    state and the outbox of unsynced changes."""
    egress.stop(record.files)
    with Hypervisor(record.libvirt_uri) as hv:
        hv.destroy(record.domain)
    files = record.files
    for f in (files.overlay, files.workspace_disk, files.client_key, files.client_key.with_suffix(".pub")):
        f.unlink(missing_ok=True)
    for d in (files.fwcfg_dir, files.guest_tree):
        shutil.rmtree(d, ignore_errors=True)
    record.exported = True
    record.save()


@dataclass(frozen=True)
class Status:
    record: Record
    state: str  # running | booting | stopped | orphaned

    def as_dict(self) -> dict[str, Any]:
        r = self.record
        return {
            "name": r.name,
            "state": self.state,
            "created": r.created,
            "age_seconds": round(time.time() - r.created),
            "project": r.project,
            "accel": r.accel,
            "ports": {"ssh": r.ssh_port},
            "cpus": r.cpus,
            "memory_mib": r.memory_mib,
            "image": r.image_version,
            "keep": r.keep,
            "domain": r.domain,
            "unsynced": r.unsynced,
            "network": r.network,
            "blueprint": r.blueprint,
            "publish": r.publish,
            "egress": egress.status(r.files, wanted=r.wants_daemon)
            if self.state not in ("exported", "stopped")
            else "stopped",
        }


def status(record: Record, hv: Hypervisor) -> Status:
    if record.exported:
        return Status(record, "exported")
    info = hv.info(record.domain)
    if info is None or vm_gone(info):
        return Status(record, "stopped")
    if record.status != "ready":
        return Status(record, "booting" if record.owner_alive() else "orphaned")
    if not record.keep and not record.owner_alive():
        return Status(record, "orphaned")
    return Status(record, info.state)


def vm_gone(info: DomainInfo | None) -> bool:
    """No domain, or one that powered off or crashed: the VM is not coming back."""
    return info is None or info.state in ("shutoff", "crashed")


def is_running(record: Record) -> bool:
    with Hypervisor(record.libvirt_uri) as hv:
        info = hv.info(record.domain)
    return info is not None and info.state == "running"


def stops_within(record: Record, *, seconds: float) -> bool:
    """Whether the VM stops (or is already gone) within `seconds`: tells a guest shutting itself down
    from a dropped connection."""
    deadline = time.monotonic() + seconds
    with Hypervisor(record.libvirt_uri) as hv:
        while True:
            if vm_gone(hv.info(record.domain)):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.5)


def all_status(uri: str) -> list[Status]:
    found: list[Status] = []
    with Hypervisor(uri) as hv:
        for name in names():
            with contextlib.suppress(VmsandboxError):
                found.append(status(Record.load(name), hv))
    return found


def _no_guard(_record: Record, _state: str) -> str | None:
    return None


def gc(uri: str, guard: Callable[[Record, str], str | None] = _no_guard) -> Iterator[str]:
    """Remove sessions whose VM is gone or whose owning `vmsandbox run` died, and vmsandbox domains
    whose session directory is gone. Yields a line per thing done.

    `guard(record, state)` may keep a session (returning why): sessions holding unsynced work are never
    removed here."""
    with Hypervisor(uri) as hv:
        for name in names():
            files = paths.session_paths(name)
            try:
                record = Record.load(name)
            except VmsandboxError:
                if time.time() - files.root.stat().st_mtime > 60:  # not one being created right now
                    shutil.rmtree(files.root, ignore_errors=True)
                    yield f"removed damaged session directory {files.root}"
                continue
            state = status(record, hv).state
            if state in ("stopped", "orphaned"):
                kept = guard(record, state)
                if kept is not None:
                    yield f"kept session {name} ({state}): {kept}"
                    continue
                egress.stop(files)
                hv.destroy(record.domain)
                shutil.rmtree(files.root, ignore_errors=True)
                yield f"removed session {name} ({state})"
        for info in list(hv.domains(DOMAIN_PREFIX)):
            xml = hv.xml(info.name)
            owner = session_of(xml) if xml else None
            if owner is None:
                continue  # not ours: a domain that merely shares the prefix
            if not (owner[1] / paths.SESSION_RECORD).exists():
                hv.destroy(info.name)
                yield f"destroyed domain {info.name} (its session directory is gone)"
