"""`stop` and `start` of a session on another host. Its VM is saved there, into the host's pool as
`DOMAIN.save` beside its disks (libvirt writes it; nothing travels), and restored from it there: a stopped
remote session holds no CPU and no RAM on its host, survives a restart of that host's libvirtd, and needs no
connection while stopped. Its tunnel closes at `stop` and opens again at `start`; `pull` and `diff` of a
stopped session fetch its workspace disk from the host (vm.fetch_workspace).
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Callable
from pathlib import Path

from vmsandbox import filewrite
from vmsandbox.errors import VmsandboxError
from vmsandbox.session.place.remote import tunnel, vm
from vmsandbox.session.place.remote.images import POOL
from vmsandbox.session.record import Record
from vmsandbox.vm import domain, savefile, storage
from vmsandbox.vm.domain import DomainSpec
from vmsandbox.vm.virt import Hypervisor

HEAD_BYTES = 1024 * 1024  # a save image's header and domain XML (libvirt pads them to 64 KiB)


def name(record: Record) -> str:
    """The volume a stopped session's VM is saved in, on its host."""
    return f"{record.domain}.save"


def holds(record: Record, hv: Hypervisor) -> bool:
    """Whether the session's host holds its saved VM (`hv` is a connection to that host)."""
    return record.files.saved_memory.exists() or name(record) in hv.volumes(POOL)


def save(record: Record, hv: Hypervisor, into: str | None = None, *, deadline: float | None = None) -> None:
    """Save the VM into its host's pool (as `into`: a checkpoint's; else the stopped session's) and close its
    tunnel; on failure, nothing half-saved is left. The volume is made through libvirt first (then written by
    the save), so that the pool lists it even when another session's upload keeps libvirt from rescanning it."""
    into = into or name(record)
    hv.delete_volume(POOL, into)  # a leftover of a save that failed: the VM runs, so it is not needed
    target = hv.create_volume(POOL, storage.volume_xml(into, 0, mode="0600"))
    try:
        hv.save(record.domain, target, here=False, deadline=deadline)
    except VmsandboxError as exc:
        hv.delete_volume(POOL, into)
        raise VmsandboxError(
            f"{exc.message} (on host {record.host})",
            hint=f"free space in that host's pool directory ({target.rsplit('/', 1)[0]}), then try again",
        ) from exc
    tunnel.close(record.files.root)


def restore(record: Record, hv: Hypervisor, saved: str) -> None:
    """Restore the VM there from a save (the stopped session's, or a checkpoint's) over the session's top overlay,
    on its SSH port (or another one if something took it there), and open its tunnel."""
    vols = hv.volumes(POOL)
    if saved not in vols:
        raise VmsandboxError(
            f"the saved VM of session {record.name} ({saved}) is not on host {record.host} any more",
            hint=f"`vmsandbox pull {record.name}` brings its unsynced work back from its disk, "
            f"`vmsandbox rm {record.name}` removes it",
        )
    found = header_of(record, hv, saved)
    system = Path(vols[record.overlays[-1]])
    vm.on_a_free_port(
        record,
        lambda: hv.restore(vols[saved], domain.with_disks(found.xml, system, record.remote_port)),
        first=record.remote_port,
    )
    record.save()
    vm.open_tunnel(record)


def header_of(record: Record, hv: Hypervisor, saved: str) -> savefile.Saved:
    """The header of save volume `saved` on the session's host (its first HEAD_BYTES, fetched and parsed)."""
    head = hv.download(POOL, saved, keep=HEAD_BYTES, length=HEAD_BYTES)
    return savefile.parse(io.BytesIO(bytes(head.kept)), f"{saved} on host {record.host}")


def restore_as(
    record: Record, hv: Hypervisor, saved_volume: str, saved: savefile.Saved, spec_of: Callable[[], DomainSpec]
) -> None:
    """Restore another domain's save volume there (a checkpoint's, a template's) as this session's VM, on a free
    port of the host's loopback: from a copy whose header carries the session's domain (`spec_of()`, under its
    own name and UUID: two domains with one UUID cannot run at once), deleted once restored."""
    new_uuid, copy = str(uuid.uuid4()), f"{record.domain}.restore"
    made: list[str] = []

    def launch() -> None:
        try:
            xml = savefile.renamed(domain.for_restore(saved.xml, spec_of()), record.domain, new_uuid)
        except ValueError as exc:
            raise VmsandboxError(f"{saved_volume} cannot be restored as session {record.name}'s VM: {exc}") from exc
        if not made:  # once: a retry on another port changes only the XML given with the restore
            made.append(hv.clone_volume(POOL, saved_volume, copy, head=header(saved, xml)))
        filewrite.write_atomically(record.files.domain_xml, xml)
        hv.restore(made[0], xml)

    try:
        vm.on_a_free_port(record, launch, first=None)
    finally:
        hv.delete_volume(POOL, copy)
    record.save()


def header(saved: savefile.Saved, xml: str) -> bytes:
    """The save image's header carrying `xml`, the same length as the one it replaces (the memory that follows
    stays where it is)."""
    head = savefile.header_for(saved, xml)
    if len(head) != saved.stream_offset:
        raise VmsandboxError(
            f"the session's domain XML ({len(xml)} bytes) does not fit in the save image's header "
            f"({saved.stream_offset} bytes)",
            hint="libvirt pads that header to 64 KiB: this save image was not written by it; "
            "make it again (`vmsandbox checkpoint create`, or `vmsandbox rm --stale` for a template) and retry",
        )
    return head


def restored(record: Record, hv: Hypervisor) -> None:
    """After a good start: the save deleted there, and the copy of the workspace disk a stopped session's pull
    fetched deleted here (the guest writes the disk on its host again)."""
    hv.delete_volume(POOL, name(record))
    record.files.workspace_disk.unlink(missing_ok=True)
