"""Checkpoints of a session on another host. The checkpoint's record (checkpoint.json: label, time, the chain
of overlays) is here, in the session's checkpoints directory, as for a local one; what it keeps is on the host,
as volumes beside the session's: `DOMAIN.cp.LABEL.save` (the VM saved there) and `DOMAIN.cp.LABEL.workspace.raw`
(a copy of the workspace disk, made by that host). The system disk is not copied: the top overlay is frozen
and a new overlay volume above it takes the VM's writes, as here.

Unlike a local session's, the chain is not folded (that takes `qemu-img` on the host): overlays no chain needs
are deleted, the others stay, and a session takes at most MAX_CHAIN of them (its host's abilities say so).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

from vmsandbox import ui
from vmsandbox.errors import VmsandboxError
from vmsandbox.session.place.remote import save
from vmsandbox.session.place.remote.images import POOL
from vmsandbox.session.record import Record
from vmsandbox.vm import storage
from vmsandbox.vm.virt import Hypervisor

MAX_CHAIN = 18  # overlays above the image: every checkpoint and rollback adds one


def volume(record: Record, label: str, what: str) -> str:
    """A checkpoint's volume: `save` or `workspace.raw`."""
    return f"{record.domain}.cp.{label}.{what}"


def copy_workspace(hv: Hypervisor, source: str, name: str) -> None:
    """A copy of workspace volume SOURCE as NAME, on its host. libvirt copies raw to raw byte by byte, holes too
    (a workspace disk is gigabytes of headroom around megabytes of data: ~20 s for 8 GiB on a slow host), and any
    other format with `qemu-img convert`, which skips holes: so raw -> qcow2 -> raw, in about a second. A host
    without qemu-img refuses the qcow2 copy; there it is copied byte by byte."""
    between = f"{name}.copying.qcow2"
    hv.delete_volume(POOL, between)  # a leftover of a copy that was interrupted
    try:
        hv.clone_volume(POOL, source, between, fmt="qcow2")
    except VmsandboxError:
        hv.clone_volume(POOL, source, name)
        return
    try:
        hv.clone_volume(POOL, between, name, fmt="raw")
    finally:
        hv.delete_volume(POOL, between)


def freeze(record: Record, hv: Hypervisor, label: str, publish: Callable[[], None]) -> None:
    """The VM (its file systems flushed, its egress stopped) saved into the checkpoint's volume, its workspace disk
    copied there, a new top overlay. The VM is down after (checkpoint.wake restores it). `publish` writes the
    checkpoint's record here once its volumes are whole; on failure the session is left stopped."""
    saved = volume(record, label, "save")
    with ui.step(f"Saving {record.domain} (memory and devices) on host {record.host}"):
        save.save(record, hv, saved)
    try:
        with ui.step(f"Keeping the workspace disk (a copy on host {record.host})"):
            copy_workspace(hv, f"{record.domain}.workspace.raw", volume(record, label, "workspace.raw"))
        publish()
        new_top(record, hv)
    except BaseException:
        leave_stopped(record, hv, saved)
        hv.delete_volume(POOL, volume(record, label, "workspace.raw"))
        hv.delete_volume(POOL, saved)
        raise


def new_top(record: Record, hv: Hypervisor) -> None:
    """Freeze the VM's top overlay and put a new overlay volume above it (the VM must be down)."""
    below = hv.volumes(POOL)[record.overlays[-1]]
    top = f"{record.domain}.overlay-{secrets.token_hex(4)}.qcow2"
    hv.create_volume(POOL, storage.volume_xml(top, record.disk_mib * 1024 * 1024, mode="0600", backing=below))
    record.overlays.append(top)
    record.save()


def rewind(record: Record, hv: Hypervisor, label: str, chains: list[list[str]]) -> None:
    """Rollback's disks, the VM down and record.overlays set to the checkpoint's chain: a new top overlay above
    it, the workspace disk replaced by the checkpoint's copy, a stopped session's save and the overlays no chain
    needs deleted."""
    hv.delete_volume(POOL, save.name(record))
    new_top(record, hv)
    with ui.step(f"Restoring the workspace disk (on host {record.host})"):
        workspace = f"{record.domain}.workspace.raw"
        hv.delete_volume(POOL, workspace)
        copy_workspace(hv, volume(record, label, "workspace.raw"), workspace)
    record.files.workspace_disk.unlink(missing_ok=True)  # a copy a pull of the stopped VM fetched: stale now
    tidy(record, hv, chains)


def tidy(record: Record, hv: Hypervisor, chains: list[list[str]]) -> None:
    """Delete the session's overlay volumes that neither the VM (record.overlays) nor a checkpoint reads."""
    needed = {*record.overlays, *(name for c in chains for name in c)}
    for name in hv.volumes(POOL):
        if name.startswith(f"{record.domain}.overlay") and name not in needed:
            hv.delete_volume(POOL, name)


def drop(record: Record, hv: Hypervisor, label: str, chains: list[list[str]]) -> None:
    """A removed checkpoint's volumes deleted there, with the overlays no chain needs any more (`chains`: the
    remaining checkpoints')."""
    for what in ("save", "workspace.raw"):
        hv.delete_volume(POOL, volume(record, label, what))
    tidy(record, hv, chains)


def sizes(record: Record, hv: Hypervisor, kept: dict[str, str]) -> dict[str, int]:
    """What each checkpoint (label: its frozen overlay) keeps on the session's host, in bytes: its save, its copy
    of the workspace disk and the overlay (which later checkpoints may share)."""
    used = hv.allocations(POOL)
    return {
        label: sum(used.get(v, 0) for v in (volume(record, label, "save"), volume(record, label, "workspace.raw"), top))
        for label, top in kept.items()
    }


def leave_stopped(record: Record, hv: Hypervisor, saved: str) -> None:
    """A checkpoint or rollback failed with the VM down: leave the session stopped on that save (a copy of it,
    as `vmsandbox stop` would have left it), so that `vmsandbox start` resumes it."""
    if saved not in hv.volumes(POOL):
        return
    hv.delete_volume(POOL, save.name(record))
    hv.clone_volume(POOL, saved, save.name(record))
    record.saved = True
    record.save()
    ui.warn(f"session {record.name} is stopped; `vmsandbox start {record.name}` resumes it")
