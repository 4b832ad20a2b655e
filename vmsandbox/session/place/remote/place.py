"""Another libvirt host as the place a session's VM lives: its disks, identity files, saves and checkpoints are
volumes in that host's pool (remote.vm, remote.save, remote.checkpoint), its templates too (remote.template),
and its SSH is reached through a tunnel from this machine's loopback (remote.tunnel); the egress daemon, the
proxy's secrets, the baseline and the mirror stay on this machine."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from vmsandbox import ui
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest.ssh import Endpoint
from vmsandbox.image import store
from vmsandbox.session.place import checkpoints, room
from vmsandbox.session.place.checkpoints import Checkpoint
from vmsandbox.session.place.common import Connection, Domain
from vmsandbox.session.place.interface import (
    VM,
    Abilities,
    Facts,
    Forks,
    Host,
    Images,
    Launched,
    Saved,
    SavedVM,
    Sharing,
    Snapshots,
    Still,
    Tidy,
)
from vmsandbox.session.place.remote import checkpoint, fork, gc, images, log, save, start, template, vm
from vmsandbox.session.place.templates import Shape
from vmsandbox.session.record import Record
from vmsandbox.vm import accel
from vmsandbox.vm.memory.usage import Usage
from vmsandbox.vm.node import Node


@dataclass(frozen=True)
class SaveVolume(SavedVM):
    """A save image in a volume of the session's host's pool."""

    volume: str


def _volume(memory: SavedVM) -> str:
    if not isinstance(memory, SaveVolume):
        raise TypeError(f"a session on another host is saved in a volume there, not {memory}")
    return memory.volume


def _chains(record: Record) -> list[list[str]]:
    return [c.chain for c in checkpoints.listed(record.files)]


class RemoteHost(Connection, Host):
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

    def sweep(self, mine: Path, tidy: Tidy) -> Iterator[str]:
        yield from gc.sweep(self.libvirt, self.spec, mine, tidy)

    def vm(self, record: Record) -> VM:
        return RemoteVM(self, record)

    def forget(self, root: Path, domain: str) -> None:
        gc.drop(self.libvirt(), domain, root)

    @property
    def images(self) -> Images:
        return RemoteImages(self)

    @property
    def facts(self) -> Facts:
        return RemoteFacts(self)


class RemoteImages(Images):
    def template(self, image: store.Image, shape: Shape, timeout: int) -> str:
        host = self.host
        images.ensure(host.libvirt(), host.spec, image)
        return template.ensure(image, shape, host.libvirt(), host.spec, timeout).name

    def hold(self, image: store.Image) -> bool:
        return images.ensure(self.host.libvirt(), self.host.spec, image)

    def held(self) -> list[str]:
        return list(images.ready(self.host.libvirt()))


class RemoteFacts(Facts):
    def accelerator(self, node: Node) -> str:
        return node.accel

    def kvm_problem(self, node: Node) -> str | None:
        return node.kvm_problem()

    def memory_problem(self, node: Node) -> str | None:
        return start.UNSHARED


class RemoteVM(Domain, VM):
    def memory_use(self) -> Usage | None:
        return None  # its QEMU runs on the other host: this machine's /proc does not hold it

    def reach(self, *, answering: bool = False) -> Endpoint:
        vm.ensure_tunnel(self.record, answering=answering)
        return self.record.endpoint()

    def console(self, *, follow: bool) -> Path:
        log.refresh(self.record, self.host.libvirt(), follow=follow)
        return self.record.files.console_log

    def workspace_disk(self) -> Path:
        vm.fetch_workspace(self.record, self.host.libvirt())
        return self.record.files.workspace_disk

    @property
    def saved(self) -> Saved:
        return RemoteSaved(self)

    @property
    def snapshots(self) -> Snapshots:
        return RemoteSnapshots(self)

    @property
    def forks(self) -> Forks:
        return RemoteForks(self)


class RemoteSaved(Saved):
    def take(self, *, deadline: float | None = None) -> None:
        record = self.vm.record
        with ui.step(f"Saving {record.domain} (memory and devices) on host {record.host}"):
            save.save(record, self.vm.host.libvirt(), deadline=deadline)

    def held(self) -> bool:
        return save.holds(self.vm.record, self.vm.host.libvirt())

    def memory(self) -> SavedVM:
        return SaveVolume(save.name(self.vm.record))

    def size(self) -> int | None:
        return self.vm.host.libvirt().allocations(images.POOL).get(save.name(self.vm.record))

    def restore(self, memory: SavedVM) -> None:
        save.restore(self.vm.record, self.vm.host.libvirt(), _volume(memory))

    def discard(self) -> None:
        save.restored(self.vm.record, self.vm.host.libvirt())
        self.vm.record.files.saved_memory.unlink(missing_ok=True)


class RemoteSnapshots(Snapshots):
    def freeze(self, cp: Checkpoint, staging: Path, publish: Launched) -> None:
        checkpoint.freeze(self.vm.record, self.vm.host.libvirt(), cp.label, publish)

    def freeze_live(self, cp: Checkpoint, staging: Path, publish: Launched, still: Still) -> bool:
        return False  # (its disks are volumes there: a live switch of them is not built yet; it pauses)

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


class RemoteForks(Forks):
    def ssh_port(self) -> int:
        return 0  # a tunnel of its own, opened when its VM runs

    def share(self, cp: Checkpoint) -> AbstractContextManager[Sharing]:
        return contextlib.nullcontext(Sharing(None, start.UNSHARED))

    def copy_disks(self, cp: Checkpoint, fork_record: Record) -> Path | None:
        fork.copy_disks(self.vm.record, cp, fork_record, self.vm.host.libvirt())
        return None  # made there, beside the system disk

    def restore(self, cp: Checkpoint, fork_record: Record) -> VM:
        fork.restore(self.vm.record, cp, fork_record, self.vm.host.libvirt())
        return self.vm.host.vm(fork_record)
