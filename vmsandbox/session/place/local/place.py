"""This machine as the place a session's VM lives: its files in the session's directory, its SSH forwarded
straight to this machine's loopback, its templates beside the image (local.template)."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

from vmsandbox import paths, ui
from vmsandbox.errors import VmsandboxError
from vmsandbox.image import layers, store
from vmsandbox.session.place import pins
from vmsandbox.session.place.checkpoints import Checkpoint
from vmsandbox.session.place.interface import Launched, Place, SavedVM, SaveFile, Tidy
from vmsandbox.session.place.local import disks, start, template
from vmsandbox.session.place.templates import Shape
from vmsandbox.session.record import DOMAIN_PREFIX, Record, orphaned, readable
from vmsandbox.vm import accel, domain, savefile
from vmsandbox.vm.domain import session_of
from vmsandbox.vm.node import Node, UnreachableError
from vmsandbox.vm.virt import Hypervisor


def _file(memory: SavedVM) -> Path:
    if not isinstance(memory, SaveFile):
        raise TypeError(f"a session on this machine is saved in a file, not {memory}")
    return memory.path


class LocalPlace(Place):
    @property
    def where(self) -> str:
        return ""

    def libvirt_for(self, here: str) -> str:
        return here  # the session's record may name the URI of an older config: this machine's is asked

    def admit(self, hv: Hypervisor, requested: accel.Accel, memory_mib: int) -> accel.Choice:
        return accel.choose(requested)

    def boot(
        self, record: Record, image: store.Image, hv: Hypervisor, *, cold: bool, timeout: int, launched: Launched
    ) -> None:
        start.boot(record, image, hv, cold_start=cold, boot_timeout=timeout, launched=launched)

    def warm_template(self, image: store.Image, shape: Shape, hv: Hypervisor, timeout: int) -> str:
        return str(template.ensure(image, shape, hv, timeout).path)

    def reach(self, record: Record, *, answering: bool = False) -> None:
        return None  # QEMU forwards the guest's SSH to this machine's loopback itself

    def refresh_console(self, record: Record, *, follow: bool) -> None:
        return None  # virtlogd writes it in the session's directory

    def save(self, record: Record, hv: Hypervisor) -> None:
        with ui.step(f"Saving {record.domain} (memory and devices) to disk"):
            hv.save(record.domain, str(record.files.saved_memory))

    def stopped(self, record: Record) -> SavedVM:
        return SaveFile(record.files.saved_memory)

    def holds_save(self, record: Record, hv: Hypervisor) -> bool:
        return record.files.saved_memory.exists()

    def saved_words(self, record: Record) -> str:
        return f"{record.files.saved_memory.stat().st_size / 1024**2:.0f} MiB of memory saved"

    def restore(self, record: Record, hv: Hypervisor, memory: SavedVM) -> None:
        saved = _file(memory)
        saved_xml = savefile.read(saved).xml
        paths.own_file(record.files.console_log)
        # on the session's SSH port, or on another one if something took it while the VM was down

        def launch() -> None:
            hv.restore(str(saved), domain.with_disks(saved_xml, record.system_disk, record.ssh_port))

        start.on_a_free_port(record, launch, keep=True)
        record.save()

    def started(self, record: Record, hv: Hypervisor) -> None:
        return None

    def check_room(self, record: Record) -> None:
        return None  # the chain is folded (session.chain): it never grows past MAX_DEPTH

    def freeze(self, record: Record, hv: Hypervisor, cp: Checkpoint, staging: Path, publish: Launched) -> None:
        disks.freeze(record, hv, cp, staging, publish)

    def memory_of(self, record: Record, cp: Checkpoint) -> SavedVM:
        return SaveFile(cp.memory)

    def leave_stopped(self, record: Record, hv: Hypervisor, memory: SavedVM) -> None:
        disks.leave_stopped(record, _file(memory))

    def rewind(self, record: Record, hv: Hypervisor, cp: Checkpoint) -> None:
        disks.rewind(record, cp)

    def drop(self, record: Record, hv: Hypervisor, label: str, *, live: bool) -> None:
        # a running VM reads every overlay of its chain: those are folded at the next checkpoint or rollback
        disks.tidy(record, live=live)

    def sizes(self, record: Record, found: list[Checkpoint]) -> dict[str, int]:
        return {c.label: c.size() for c in found}

    def fork_port(self, source: Record) -> int:
        return source.ssh_port

    def copy_disks(self, source: Record, cp: Checkpoint, record: Record, hv: Hypervisor) -> Path | None:
        disks.copy_for_fork(source, cp, record)
        return cp.workspace

    def restore_fork(self, source: Record, cp: Checkpoint, record: Record, hv: Hypervisor) -> None:
        saved = savefile.read(cp.memory)

        def launch() -> None:
            spec = start.spec(record, domain.boot_of(saved.xml), warm=True, workspace=True)
            start.restore_as(record, hv, cp.memory, domain.for_restore(saved.xml, spec))

        start.on_a_free_port(record, launch)

    def fetch_workspace(self, record: Record) -> None:
        return None  # it is in the session's directory

    def forget(self, root: Path, domain_name: str) -> None:
        return None  # nothing is kept beside the domain but the session's directory

    @staticmethod
    def release(root: Path) -> None:
        return None  # nothing runs here for a session but its VM and its egress daemon (the caller's)

    def unanswered(self, record: Record, exc: UnreachableError) -> VmsandboxError:
        return exc

    def forget_unanswered(self, record: Record, exc: UnreachableError) -> bool:
        return False  # this machine's libvirt: start it (the error says how) rather than lose track of a VM

    def sweep(self, mine: Path, tidy: Tidy) -> Iterator[str]:
        with Hypervisor(self.uri) as hv:
            for info in list(hv.domains(DOMAIN_PREFIX)):
                xml = hv.xml(info.name)
                owner = session_of(xml) if xml else None
                # a session of this account's sessions directory whose directory is gone (not a domain that
                # merely shares the prefix, nor another account's session)
                if owner is not None and orphaned(owner[1], mine):
                    what = f"domain {info.name} (its session directory is gone)"
                    yield tidy("destroy", what, functools.partial(hv.destroy, info.name))
            images = [*store.list_images(), *layers.list_layers()]
            yield from template.collect(hv, images, _templates_in_use(), tidy)

    def check(self) -> None:
        return None

    def check_holds_images(self) -> None:
        raise VmsandboxError(
            f"host {self.name} is this machine: its images are used where they are", hint="name another host"
        )

    def hold_image(self, hv: Hypervisor, image: store.Image) -> str:
        self.check_holds_images()
        return ""

    def images_held(self, hv: Hypervisor) -> list[str]:
        return [i.path.name for i in [*store.list_images(), *layers.list_layers()]]

    def accel_of(self, node: Node) -> str:
        return accel.choose(accel.Accel.AUTO).accel.value  # the same answer a session here gets

    def kvm_problem(self, node: Node) -> str | None:
        return accel.kvm_problem()


def _templates_in_use() -> set[Path]:
    """The templates a session's disk rests on (its own, or a pinned one of another account's)."""
    used = {Path(r.template) for r in readable() if r.template}
    return used | {Path(p.template) for p in pins.of_others() if p.template}
