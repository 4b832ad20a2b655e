"""Another libvirt host as the place a session's VM lives: its disks, identity files, saves and checkpoints are
volumes in that host's pool (remote.vm, remote.save, remote.checkpoint), its templates too (remote.template),
and its SSH is reached through a tunnel from this machine's loopback (remote.tunnel); the egress daemon, the
proxy's secrets, the baseline and the mirror stay on this machine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from vmsandbox import ui
from vmsandbox.errors import VmsandboxError
from vmsandbox.image import store
from vmsandbox.session.place import checkpoints
from vmsandbox.session.place.checkpoints import Checkpoint
from vmsandbox.session.place.interface import Launched, Place, SavedVM, SaveVolume, Tidy
from vmsandbox.session.place.remote import checkpoint, fork, gc, images, log, save, start, template, tunnel, vm
from vmsandbox.session.place.templates import Shape
from vmsandbox.session.record import Record
from vmsandbox.vm import accel
from vmsandbox.vm.node import Node, UnreachableError
from vmsandbox.vm.virt import Hypervisor


def _volume(memory: SavedVM) -> str:
    if not isinstance(memory, SaveVolume):
        raise TypeError(f"a session on another host is saved in a volume there, not {memory}")
    return memory.volume


def _chains(record: Record) -> list[list[str]]:
    return [c.chain for c in checkpoints.listed(record.files)]


class RemotePlace(Place):
    @property
    def where(self) -> str:
        return f" on host {self.name}"

    def libvirt_for(self, here: str) -> str:
        return self.uri

    def admit(self, hv: Hypervisor, requested: accel.Accel, memory_mib: int) -> accel.Choice:
        vm.check_room(hv, self.spec, memory_mib)
        return accel.choose(requested, problem=hv.node().kvm_problem(), probe=False)

    def boot(
        self, record: Record, image: store.Image, hv: Hypervisor, *, cold: bool, timeout: int, launched: Launched
    ) -> None:
        start.boot(record, image, hv, self.spec, cold_start=cold, boot_timeout=timeout)
        launched()  # the egress daemon reaches the guest through the tunnel, which is open only now

    def warm_template(self, image: store.Image, shape: Shape, hv: Hypervisor, timeout: int) -> str:
        images.ensure(hv, self.spec, image)
        return template.ensure(image, shape, hv, self.spec, timeout).name

    def reach(self, record: Record, *, answering: bool = False) -> None:
        vm.ensure_tunnel(record, answering=answering)

    def refresh_console(self, record: Record, *, follow: bool) -> None:
        log.refresh(record, follow=follow)

    def save(self, record: Record, hv: Hypervisor) -> None:
        with ui.step(f"Saving {record.domain} (memory and devices) on host {record.host}"):
            save.save(record, hv)

    def stopped(self, record: Record) -> SavedVM:
        return SaveVolume(save.name(record))

    def holds_save(self, record: Record, hv: Hypervisor) -> bool:
        return save.holds(record, hv)

    def saved_words(self, record: Record) -> str:
        return f"its memory saved on host {record.host}"

    def restore(self, record: Record, hv: Hypervisor, memory: SavedVM) -> None:
        save.restore(record, hv, _volume(memory))

    def started(self, record: Record, hv: Hypervisor) -> None:
        save.restored(record, hv)

    def check_room(self, record: Record) -> None:
        checkpoint.check_room(record)

    def freeze(self, record: Record, hv: Hypervisor, cp: Checkpoint, staging: Path, publish: Launched) -> None:
        checkpoint.freeze(record, hv, cp.label, publish)

    def memory_of(self, record: Record, cp: Checkpoint) -> SavedVM:
        return SaveVolume(checkpoint.volume(record, cp.label, "save"))

    def leave_stopped(self, record: Record, hv: Hypervisor, memory: SavedVM) -> None:
        checkpoint.leave_stopped(record, hv, _volume(memory))

    def rewind(self, record: Record, hv: Hypervisor, cp: Checkpoint) -> None:
        checkpoint.rewind(record, hv, cp.label, _chains(record))

    def drop(self, record: Record, hv: Hypervisor, label: str, *, live: bool) -> None:
        checkpoint.drop(record, hv, label, _chains(record))

    def sizes(self, record: Record, found: list[Checkpoint]) -> dict[str, int]:
        try:
            return checkpoint.sizes(record, {c.label: c.overlay for c in found})
        except VmsandboxError as exc:
            raise VmsandboxError(
                f"host {record.host} did not say what the checkpoints hold there: {exc.message}"
            ) from exc

    def fork_port(self, source: Record) -> int:
        return 0  # a tunnel of its own, opened when its VM runs

    def copy_disks(self, source: Record, cp: Checkpoint, record: Record, hv: Hypervisor) -> Path | None:
        fork.copy_disks(source, cp, record, hv)
        return None

    def restore_fork(self, source: Record, cp: Checkpoint, record: Record, hv: Hypervisor) -> None:
        fork.restore(source, cp, record, hv)

    def fetch_workspace(self, record: Record) -> None:
        vm.fetch_workspace(record)

    def forget(self, root: Path, domain_name: str) -> None:
        vm.forget(root, self.uri, domain_name)

    @staticmethod
    def release(root: Path) -> None:
        tunnel.close(root)

    def unanswered(self, record: Record, exc: UnreachableError) -> VmsandboxError:
        return VmsandboxError(
            f"host {record.host} does not answer, so the changes of session {record.name} cannot be read: "
            f"{exc.message}",
            hint=f"try again once it answers; `vmsandbox destroy {record.name} --discard` forgets the session here "
            "(its unsynced changes too) and `vmsandbox gc` removes its VM and volumes there when the host is back",
        )

    def forget_unanswered(self, record: Record, exc: UnreachableError) -> bool:
        tunnel.close(record.files.root)
        ui.warn(
            f"host {record.host} does not answer ({exc.message}): session {record.name} is forgotten here; "
            f"`vmsandbox gc` removes its VM and volumes there once the host answers"
        )
        return True

    def sweep(self, mine: Path, tidy: Tidy) -> Iterator[str]:
        yield from gc.sweep(self.spec, mine, tidy)

    def check(self) -> None:
        tunnel.ssh_argv(self.uri)  # an ssh URI, or the error that says so

    def check_holds_images(self) -> None:
        return None

    def hold_image(self, hv: Hypervisor, image: store.Image) -> str:
        what = "sent" if images.ensure(hv, self.spec, image) else "already there"
        return f"{what} (pool {images.POOL} at {self.spec.pool_path})"

    def images_held(self, hv: Hypervisor) -> list[str]:
        return list(images.ready(hv))

    def accel_of(self, node: Node) -> str:
        return node.accel

    def kvm_problem(self, node: Node) -> str | None:
        return node.kvm_problem()
