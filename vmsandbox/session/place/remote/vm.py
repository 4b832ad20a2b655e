"""A session on another libvirt host. Its disks are volumes in that host's pool `vmsandbox`, named after its
domain: `DOMAIN.overlay.qcow2` (backed by the image's volume), `DOMAIN.workspace.raw` (the workspace disk,
made here and sent), `DOMAIN.fw.KEY` (its identity files, read by QEMU as fw_cfg), `DOMAIN.owner` (this
machine and the session's directory, for gc), `DOMAIN.save` while it is stopped (save.py), and the
serial console `DOMAIN.console.log`, which virtlogd writes there (log.py). Its SSH is forwarded to the
host's 127.0.0.1 only and reached through a tunnel (tunnel.py); the egress daemon, the proxy's secrets, the
baseline and the mirror stay on this machine. Its VM is restored from a template there or boots cold
(start.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vmsandbox import filewrite, paths, ui
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest import ssh
from vmsandbox.image import store
from vmsandbox.session.place.hostspec import HostSpec
from vmsandbox.session.place.remote import images, log, tunnel
from vmsandbox.session.place.remote.images import POOL, volume
from vmsandbox.session.record import Record
from vmsandbox.vm import accel, domain, storage
from vmsandbox.vm.domain import DomainSpec, Forward
from vmsandbox.vm.node import PortTakenError, gone
from vmsandbox.vm.virt import Hypervisor

PORT_RANGE = (20000, 60999)  # the guest's SSH forward on the host's 127.0.0.1 (QEMU says when one is taken)
PORT_ATTEMPTS = 6
OWNER = "owner"
OWNER_LIMIT = 64 * 1024
WARM_MARKER = "template"  # the fw_cfg file that has the guest wait for its identity (a warm start's)


def client_id() -> str:
    """This machine, as the domains it starts on other hosts name it (its gc sweeps only its own there)."""
    try:
        machine = Path("/etc/machine-id").read_text().strip()
    except OSError:
        machine = ""
    return f"{socket.gethostname()}/{machine}"


def kernel_of(image: store.Image) -> str:
    """The image whose volumes hold the kernel and initrd (a layer's base)."""
    return (images.base_of(image) or image).path.name


@dataclass(frozen=True)
class Sent:
    """Where a session's disks and identity files are on its host."""

    overlay: str
    workspace: str
    fwcfg: dict[str, Path]
    console: str


def send(record: Record, image: store.Image, hv: Hypervisor, host: HostSpec, backing: str | None = None) -> Sent:
    """The session's workspace disk and identity sent there, and its system disk made there: an overlay of
    `backing` (a template's disk), or of the image's volume."""
    files = record.files
    prefix = f"{record.domain}."
    with ui.step(f"Sending the workspace disk and identity to host {host.name}"):
        send_owner(record, hv)  # first: gc there can tell this machine's volumes by it (sweep)
        hv.upload(POOL, prefix + "workspace.raw", files.workspace_disk, mode="0600", hashed=False)
        fwcfg, console = send_identity(record, hv)
        overlay = new_overlay(record, image, hv, backing)
    vols = hv.volumes(POOL)
    record.workspace_bytes = files.workspace_disk.stat().st_size
    record.overlays = [prefix + "overlay.qcow2"]  # volumes there (checkpoints add more: checkpoint.py)
    record.save()
    files.workspace_disk.unlink()  # its host has it; a VM that dies there has it fetched back (fetch_workspace)
    return Sent(overlay, vols[prefix + "workspace.raw"], fwcfg, console)


def new_overlay(record: Record, image: store.Image, hv: Hypervisor, backing: str | None = None) -> str:
    """The session's system disk there (replacing one of a warm start that failed): a qcow2 overlay of `backing`,
    or of the image's volume; its path there."""
    name = f"{record.domain}.overlay.qcow2"
    hv.delete_volume(POOL, name)
    backing = backing or hv.volumes(POOL)[volume(image.path.name, paths.IMAGE_DISK)]
    size = record.disk_mib * 1024 * 1024
    return hv.create_volume(POOL, storage.volume_xml(name, size, mode="0600", backing=backing))


def send_identity(record: Record, hv: Hypervisor) -> tuple[dict[str, Path], str]:
    """The session's identity files sent as `DOMAIN.fw.KEY` volumes (their paths there, by key) and its console
    volume made (its path there). `template` among them is read by a VM restored from a template (the session's
    own, or a checkpoint of it: a fork's), never by a cold boot."""
    fwcfg: dict[str, str] = {}
    for f in sorted(record.files.fwcfg_dir.iterdir()):
        fwcfg[f.name] = f"{record.domain}.fw.{f.name}"
        hv.upload(POOL, fwcfg[f.name], f, mode="0600", hashed=False)
    # made through libvirt, not by virtlogd: listed even while another upload keeps the pool from a rescan
    console = hv.create_volume(POOL, storage.volume_xml(f"{record.domain}.console.log", 0, mode="0600"))
    vols = hv.volumes(POOL)
    return {k: Path(vols[v]) for k, v in fwcfg.items()}, console


def send_owner(record: Record, hv: Hypervisor) -> None:
    """`DOMAIN.owner`: which machine's session, in which directory, the volumes of this domain are."""
    note = record.files.root / OWNER
    filewrite.write_atomically(note, json.dumps({"client": client_id(), "session": str(record.files.root)}) + "\n")
    try:
        hv.upload(POOL, f"{record.domain}.{OWNER}", note, mode="0600", hashed=False)
    finally:
        note.unlink()


def spec(record: Record, sent: Sent, boot: tuple[Path, Path, str]) -> DomainSpec:
    """The session's VM there: its volumes (`sent`), the kernel, initrd and command line it boots (`boot`), its
    SSH on the host's loopback at record.remote_port."""
    kernel, initrd, cmdline = boot
    return DomainSpec(
        name=record.domain,
        session=record.name,
        session_dir=record.files.root,
        accel=accel.Accel(record.accel),
        cpus=record.cpus,
        memory_mib=record.memory_mib,
        disk=Path(sent.overlay),
        kernel=kernel,
        initrd=initrd,
        cmdline=cmdline,
        console_log=Path(sent.console),
        forwards=(Forward(record.remote_port, 22),),
        fwcfg_files=sent.fwcfg,
        workspace_disk=Path(sent.workspace),
        client=client_id(),
    )


def cold(record: Record, image: store.Image, hv: Hypervisor, host: HostSpec, sent: Sent, boot_timeout: int) -> None:
    """Boot the VM there from what was sent, open the tunnel, and wait for the guest's sshd."""
    vols, kernel = hv.volumes(POOL), kernel_of(image)
    boot_files = (
        Path(vols[volume(kernel, paths.IMAGE_KERNEL)]),
        Path(vols[volume(kernel, paths.IMAGE_INITRD)]),
        image.kernel_cmdline,
    )

    booted = dataclasses.replace(sent, fwcfg={k: v for k, v in sent.fwcfg.items() if k != WARM_MARKER})

    def launch() -> None:
        xml = domain.build_xml(spec(record, booted, boot_files))
        filewrite.write_atomically(record.files.domain_xml, xml)
        try:
            hv.create(xml)
        except PortTakenError:
            raise
        except VmsandboxError as exc:  # its QEMU, its libvirt: that host's doctor is `virsh` there
            raise VmsandboxError(
                f"{exc.message} (on host {host.name})",
                hint=f"check that host's QEMU and libvirt: `virsh -c '{host.uri}' domcapabilities`, "
                "`vmsandbox host ls`",
            ) from exc

    on_a_free_port(record, launch, first=None)
    record.start = "cold"
    record.memory, record.memory_note = None, "a cold boot: its memory is its own"
    record.save()
    with ui.step(f"Booting {record.domain} on host {host.name} ({record.accel.upper()}, {record.cpus} vCPU)"):
        open_tunnel(record)
        waited = wait_for_sshd(record, hv, host, boot_timeout)
    record.boot_seconds = round(waited, 1)
    record.save()


def wait_for_sshd(record: Record, hv: Hypervisor, host: HostSpec, boot_timeout: int) -> float:
    """The seconds until the guest's sshd answers through the tunnel (reopened if it dies meanwhile)."""
    try:
        return ssh.wait_for_banner(record.ssh_port, timeout=boot_timeout, alive=lambda: _alive(hv, record))
    except VmsandboxError as exc:
        log.fetch(record, hv)
        raise VmsandboxError(
            f"{exc.message} (on host {host.name})", hint=f"`vmsandbox logs {record.name}` shows its console"
        ) from exc


def on_a_free_port(record: Record, launch: Callable[[], None], *, first: int | None) -> None:
    """Start the VM there (`launch`) with its SSH forwarded to `first` on the host's loopback, or to a random port
    (another one each time QEMU finds the port taken)."""
    record.remote_port = first or random.randint(*PORT_RANGE)  # noqa: S311 - a port, not a secret
    for _attempt in range(PORT_ATTEMPTS):
        try:
            launch()
        except PortTakenError:
            record.remote_port = random.randint(*PORT_RANGE)  # noqa: S311
            continue
        return
    raise VmsandboxError(f"host {record.host} had no free port for the guest's SSH after {PORT_ATTEMPTS} tries")


def _alive(hv: Hypervisor, record: Record) -> str | None:
    if gone(hv.info(record.domain)):
        return "the VM powered off or crashed"
    ensure_tunnel(record)
    return None


def open_tunnel(record: Record) -> None:
    """(Re)open the session's tunnel: on its port if that is free, else on a new one (pinned and configured)."""
    files = record.files
    if record.ssh_port == 0 or not tunnel.port_free(record.ssh_port):
        from vmsandbox.egress import ports

        record.ssh_port = ports.free_port()
        ssh.write_known_hosts(files, record.ssh_port, files.host_key.with_suffix(".pub").read_text())
        record.endpoint().write_config()
        record.save()
    tunnel.open_(files.root, record.libvirt_uri, record.ssh_port, record.remote_port)


def ensure_tunnel(record: Record, *, answering: bool = False) -> None:
    """Before a command reaches a remote session's guest: its tunnel runs (opened again if it died). With
    `answering` (the guest runs, its sshd is up), the tunnel must also carry the guest's SSH banner: an ssh
    that was just killed still holds its port for a moment, and a command let through then is refused."""
    if not record.remote_port:
        return
    down = not tunnel.alive(record.files.root) or tunnel.port_free(record.ssh_port)  # or between two tries
    if down or (answering and not ssh.answers(record.ssh_port, timeout=5)):
        open_tunnel(record)


def fetch_workspace(record: Record, hv: Hypervisor) -> None:
    """A remote session whose VM is not running: the workspace disk as the VM left it on its host, brought
    here (its changes are read from the disk)."""
    name = f"{record.domain}.workspace.raw"
    if name not in hv.volumes(POOL):
        return
    with ui.step(f"Fetching the workspace disk of {record.name} from host {record.host}"):
        fd = os.open(record.files.workspace_disk, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            hv.download(POOL, name, into=fd, length=record.workspace_bytes)  # what was sent, no more
        finally:
            os.close(fd)


def forget(hv: Hypervisor, root: Path, domain_name: str) -> None:
    """The remote session's tunnel closed and its volumes deleted (its domain is destroyed by the caller)."""
    tunnel.close(root)
    for name in hv.volumes(POOL):
        if name.startswith(f"{domain_name}."):
            hv.delete_volume(POOL, name)
