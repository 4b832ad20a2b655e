"""`fork` of a session on another host: the fork is made there, by that host's libvirt, from the volumes of one
of the source's checkpoints (or of one taken for the fork); what travels is the fork's identity and a save
image's header.

- Its system disk, `NEW.overlay.qcow2`, is libvirt's copy of the checkpoint's frozen overlay: a copy through
  the whole chain, the image included. It rests on no other volume (the source and its checkpoints can go), and
  it costs that host the image's size again (about 1 GiB for the base) on top of what the source wrote: a fork
  here gets one overlay above the image (`qemu-img convert -B`), which libvirt's volume copy cannot make.
- Its workspace disk is a copy of the checkpoint's, made there.
- Its VM is restored there from a copy of the checkpoint's save volume whose header carries the fork's domain
  (its name and UUID: two domains with one UUID cannot run at once), written over the copy's first bytes.
"""

from __future__ import annotations

from vmsandbox.session.place.checkpoints import Checkpoint
from vmsandbox.session.place.remote import checkpoint, save, vm
from vmsandbox.session.place.remote.images import POOL
from vmsandbox.session.record import Record
from vmsandbox.vm import domain
from vmsandbox.vm.virt import Hypervisor


def copy_disks(source: Record, cp: Checkpoint, record: Record, hv: Hypervisor) -> None:
    """The fork's system and workspace disks, copied on the host from the checkpoint's volumes."""
    vm.send_owner(record, hv)  # first: gc there can tell this machine's volumes by it
    overlay = f"{record.domain}.overlay.qcow2"
    hv.clone_volume(POOL, cp.overlay, overlay)
    workspace = checkpoint.volume(source, cp.label, "workspace.raw")
    checkpoint.copy_workspace(hv, workspace, f"{record.domain}.workspace.raw")
    record.overlays = [overlay]
    record.save()


def restore(source: Record, cp: Checkpoint, record: Record, hv: Hypervisor) -> None:
    """The fork's VM restored there from the checkpoint's save, as its own domain, with its identity files, on a
    free port of the host's loopback; then its tunnel opened."""
    fwcfg, console = vm.send_identity(record, hv)
    saved_volume = checkpoint.volume(source, cp.label, "save")
    vols = hv.volumes(POOL)
    sent = vm.Sent(vols[record.overlays[-1]], vols[f"{record.domain}.workspace.raw"], fwcfg, console)
    saved = save.header_of(record, hv, saved_volume)
    boot = domain.boot_of(saved.xml)
    save.restore_as(record, hv, saved_volume, saved, lambda: vm.spec(record, sent, boot))
    vm.open_tunnel(record)
