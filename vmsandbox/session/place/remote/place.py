"""Another libvirt host as the place a session's VM lives: its disks, identity files, saves and checkpoints are
volumes in that host's pool (remote.vm, remote.save, remote.checkpoint), its templates too (remote.template),
and its SSH is reached through a tunnel from this machine's loopback (remote.tunnel); the egress daemon, the
proxy's secrets, the baseline and the mirror stay on this machine."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

from vmsandbox import ui
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest.ssh import Endpoint
from vmsandbox.image import store
from vmsandbox.session.place import checkpoints, room
from vmsandbox.session.place.checkpoints import Checkpoint
from vmsandbox.session.place.interface import VM, Abilities, Host, Launched, SavedVM, SaveVolume, Snapshots, Tidy
from vmsandbox.session.place.remote import checkpoint, fork, gc, images, log, save, start, template, vm
from vmsandbox.session.place.templates import Shape
from vmsandbox.session.record import Record
from vmsandbox.vm import accel
from vmsandbox.vm.memory.usage import Usage
from vmsandbox.vm.node import Node


def _volume(memory: SavedVM) -> str:
    if not isinstance(memory, SaveVolume):
        raise TypeError(f"a session on another host is saved in a volume there, not {memory}")
    return memory.volume


def _chains(record: Record) -> list[list[str]]:
    return [c.chain for c in checkpoints.listed(record.files)]


class RemoteHost(Host):
    # the chain is not folded there (that takes qemu-img on the host): a session takes at most MAX_CHAIN overlays
    abilities = Abilities(elsewhere=True, tunnelled=True, holds_images=True, chain_limit=checkpoint.MAX_CHAIN)

    def admit(self, requested: accel.Accel, memory_mib: int) -> accel.Choice:
        hv = self.libvirt()
        room.check(hv, self.spec, memory_mib)
        return accel.choose(requested, problem=hv.node().kvm_problem(), probe=False)

    def boot(self, record: Record, image: store.Image, *, cold: bool, timeout: int, launched: Launched) -> VM:
        start.boot(record, image, self.libvirt(), self.spec, cold_start=cold, boot_timeout=timeout)
        launched()  # the egress daemon reaches the guest through the tunnel, which is open only now
        return self.vm(record)

    def warm_template(self, image: store.Image, shape: Shape, timeout: int) -> str:
        images.ensure(self.libvirt(), self.spec, image)
        return template.ensure(image, shape, self.libvirt(), self.spec, timeout).name

    def hold_image(self, image: store.Image) -> str:
        what = "sent" if images.ensure(self.libvirt(), self.spec, image) else "already there"
        return f"{what} (pool {images.POOL} at {self.spec.pool_path})"

    def images_held(self) -> list[str]:
        return list(images.ready(self.libvirt()))

    def accelerator(self, node: Node) -> str:
        return node.accel

    def kvm_problem(self, node: Node) -> str | None:
        return node.kvm_problem()

    def memory_problem(self, node: Node) -> str | None:
        return start.UNSHARED

    def sweep(self, mine: Path, tidy: Tidy) -> Iterator[str]:
        yield from gc.sweep(self.libvirt, self.spec, mine, tidy)

    def vm(self, record: Record) -> VM:
        return RemoteVM(self, record)

    def forget(self, root: Path, domain: str) -> None:
        gc.drop(self.libvirt(), domain, root)


class RemoteVM(VM):
    def memory_use(self) -> Usage | None:
        return None  # its QEMU runs on the other host: this machine's /proc does not hold it

    def reach(self, *, answering: bool = False) -> Endpoint:
        vm.ensure_tunnel(self.record, answering=answering)
        return self.record.endpoint()

    def console(self, *, follow: bool) -> Path:
        log.refresh(self.record, self.host.libvirt(), follow=follow)
        return self.record.files.console_log

    def save(self, *, deadline: float | None = None) -> None:
        with ui.step(f"Saving {self.record.domain} (memory and devices) on host {self.record.host}"):
            save.save(self.record, self.host.libvirt(), deadline=deadline)

    def holds_save(self) -> bool:
        return save.holds(self.record, self.host.libvirt())

    def stopped(self) -> SavedVM:
        return SaveVolume(save.name(self.record))

    def saved_words(self) -> str:
        return f"its memory saved on host {self.record.host}"

    def restore(self, memory: SavedVM) -> None:
        save.restore(self.record, self.host.libvirt(), _volume(memory))

    def discard_save(self) -> None:
        save.restored(self.record, self.host.libvirt())
        self.record.files.saved_memory.unlink(missing_ok=True)

    def workspace_disk(self) -> Path:
        vm.fetch_workspace(self.record, self.host.libvirt())
        return self.record.files.workspace_disk

    @property
    def snapshots(self) -> Snapshots:
        return RemoteSnapshots(self)


class RemoteSnapshots(Snapshots):
    def freeze(self, cp: Checkpoint, staging: Path, publish: Launched) -> None:
        checkpoint.freeze(self.vm.record, self.vm.host.libvirt(), cp.label, publish)

    def memory_of(self, cp: Checkpoint) -> SavedVM:
        return SaveVolume(checkpoint.volume(self.vm.record, cp.label, "save"))

    def leave_stopped(self, memory: SavedVM) -> None:
        checkpoint.leave_stopped(self.vm.record, self.vm.host.libvirt(), _volume(memory))

    def rewind(self, cp: Checkpoint) -> None:
        record = self.vm.record
        checkpoint.rewind(record, self.vm.host.libvirt(), cp.label, _chains(record))

    def drop(self, label: str, *, live: bool) -> None:
        record = self.vm.record
        checkpoint.drop(record, self.vm.host.libvirt(), label, _chains(record))

    def sizes(self, found: list[Checkpoint]) -> dict[str, int]:
        record = self.vm.record
        try:
            return checkpoint.sizes(record, self.vm.host.libvirt(), {c.label: c.overlay for c in found})
        except VmsandboxError as exc:
            raise VmsandboxError(
                f"host {record.host} did not say what the checkpoints hold there: {exc.message}"
            ) from exc

    def fork_port(self) -> int:
        return 0  # a tunnel of its own, opened when its VM runs

    def share(self, cp: Checkpoint) -> AbstractContextManager[str]:
        return contextlib.nullcontext(f"each restores a copy of the memory ({start.UNSHARED})")

    def copy_disks(self, cp: Checkpoint, fork_record: Record) -> Path | None:
        fork.copy_disks(self.vm.record, cp, fork_record, self.vm.host.libvirt())
        return None  # made there, beside the system disk

    def restore_fork(self, cp: Checkpoint, fork_record: Record) -> VM:
        fork.restore(self.vm.record, cp, fork_record, self.vm.host.libvirt())
        return self.vm.host.vm(fork_record)
