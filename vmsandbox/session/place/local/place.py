"""This machine as the place a session's VM lives: its files in the session's directory, its SSH forwarded
straight to this machine's loopback, its templates beside the image (local.template), its checkpoints' chains
folded (local.disks)."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from vmsandbox import filewrite, paths, ui
from vmsandbox.guest.ssh import Endpoint
from vmsandbox.image import layers, store
from vmsandbox.session.place import pins, room
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
from vmsandbox.session.place.local import disks, owned, sharing, start, template
from vmsandbox.session.place.templates import Shape
from vmsandbox.session.record import DOMAIN_PREFIX, Record, orphaned, readable
from vmsandbox.vm import accel, domain, rambackend, savefile
from vmsandbox.vm.domain import session_of
from vmsandbox.vm.memory import usage
from vmsandbox.vm.node import Node
from vmsandbox.vm.virt import DEFAULT_URI


@dataclass(frozen=True)
class SaveFile(SavedVM):
    """A save image in a file on this machine."""

    path: Path


def _file(memory: SavedVM) -> Path:
    if not isinstance(memory, SaveFile):
        raise TypeError(f"a session on this machine is saved in a file, not {memory}")
    return memory.path


class LocalHost(Connection, Host):
    # QEMU forwards the guest's SSH to this machine's loopback itself; the images are used where they are
    abilities = Abilities(elsewhere=False, tunnelled=False, holds_images=False, chain_limit=None)

    def admit(self, requested: accel.Accel, memory_mib: int) -> accel.Choice:
        room.check(self.libvirt(), self.spec, memory_mib)
        return accel.choose(requested)

    def boot(self, record: Record, image: store.Image, *, cold: bool, timeout: int, launched: Launched) -> VM:
        # an account of its own for each session's QEMU; not for an image build's (its disk becomes an image) nor a
        # reader's (it reads a dead session's disk through an ACL entry for libvirt's account: diskreader)
        owned.own_account(record, lease=record.disk is None and not record.name.startswith(paths.READER_PREFIX))
        start.boot(record, image, self.libvirt(), cold_start=cold, boot_timeout=timeout, launched=launched)
        return self.vm(record)

    def sweep(self, mine: Path, tidy: Tidy) -> Iterator[str]:
        hv = self.libvirt()
        for info in list(hv.domains(DOMAIN_PREFIX)):
            xml = hv.xml(info.name)
            owner = session_of(xml) if xml else None
            # a session of this account's sessions directory whose directory is gone (not a domain that merely
            # shares the prefix, nor another account's session)
            if owner is not None and orphaned(owner[1], mine):
                what = f"domain {info.name} (its session directory is gone)"
                yield tidy("destroy", what, functools.partial(hv.destroy, info.name))
        images = [*store.list_images(), *layers.list_layers()]
        yield from template.collect(hv, images, _templates_in_use(), tidy)
        yield from sharing.sweep(hv, tidy)

    def vm(self, record: Record) -> VM:
        return LocalVM(self, record)

    def forget(self, root: Path, domain: str) -> None:
        self.libvirt().destroy(domain)  # nothing is kept beside the domain but the session's directory

    @property
    def images(self) -> Images:
        return LocalImages(self)

    @property
    def facts(self) -> Facts:
        return LocalFacts(self)


class LocalImages(Images):
    def template(self, image: store.Image, shape: Shape, timeout: int) -> str:
        return str(template.ensure(image, shape, self.host.libvirt(), timeout).path)

    def hold(self, image: store.Image) -> bool:
        raise TypeError("this machine holds no images sent to it (its abilities say so): nothing asks it to")

    def held(self) -> list[str]:
        return [i.path.name for i in [*store.list_images(), *layers.list_layers()]]


class LocalFacts(Facts):
    def accelerator(self, node: Node) -> str:
        return accel.choose(accel.Accel.AUTO).accel.value  # the same answer a session here gets

    def kvm_problem(self, node: Node) -> str | None:
        return accel.kvm_problem()

    def memory_problem(self, node: Node) -> str | None:
        return sharing.problem(self.host.libvirt(), self.accelerator(node))


class LocalVM(Domain, VM):
    def memory_use(self) -> usage.Usage | None:
        # the system libvirt's pid files say which process is the domain's QEMU (a session daemon's: not read)
        return usage.of_domain(self.record.domain) if self.record.libvirt_uri == DEFAULT_URI else None

    def reach(self, *, answering: bool = False) -> Endpoint:
        return self.record.endpoint()

    def console(self, *, follow: bool) -> Path:
        return self.record.files.console_log  # virtlogd writes it there

    def workspace_disk(self) -> Path:
        return self.record.files.workspace_disk  # the VM wrote it in the session's directory

    @property
    def saved(self) -> Saved:
        return LocalSaved(self)

    @property
    def snapshots(self) -> Snapshots:
        return LocalSnapshots(self)

    @property
    def forks(self) -> Forks:
        return LocalForks(self)


class LocalSaved(Saved):
    def take(self, *, deadline: float | None = None) -> None:
        record = self.vm.record
        with ui.step(f"Saving {record.domain} (memory and devices) to disk"):
            self.vm.host.libvirt().save(record.domain, str(record.files.saved_memory), deadline=deadline)

    def held(self) -> bool:
        return self.vm.record.files.saved_memory.exists()

    def memory(self) -> SavedVM:
        return SaveFile(self.vm.record.files.saved_memory)

    def size(self) -> int | None:
        saved = self.vm.record.files.saved_memory
        return saved.stat().st_size if saved.exists() else None

    def restore(self, memory: SavedVM) -> None:
        record, saved = self.vm.record, _file(memory)
        saved_xml = savefile.read(saved).xml
        filewrite.own_file(record.files.console_log)
        shared = sharing.split_of(saved)  # a fork's checkpoint: the source maps what its forks map
        hv = self.vm.host.libvirt()
        # on the session's SSH port, or on another one if something took it while the VM was down

        def launch() -> None:
            xml = domain.with_disks(saved_xml, record.system_disk, record.ssh_port, owned.chain_of(record))
            if shared is not None:
                start.restore_shared(record, hv, shared, xml, saved)
                return
            if rambackend.memory_of(saved_xml) is not None:
                # a session that mapped shared memory, saved whole: its memory is its own from now on
                xml = rambackend.with_memory(xml, None)
            hv.restore(str(saved), xml)
            record.memory, record.memory_note = None, "restored from a save of its own: its memory is its own"

        start.on_a_free_port(record, launch, keep=True)
        record.save()

    def discard(self) -> None:
        self.vm.record.files.saved_memory.unlink(missing_ok=True)


class LocalSnapshots(Snapshots):
    def freeze(self, cp: Checkpoint, staging: Path, publish: Launched) -> None:
        disks.freeze(self.vm.record, self.vm.host.libvirt(), cp, staging, publish)

    def freeze_live(self, cp: Checkpoint, staging: Path, publish: Launched, still: Still) -> bool:
        return disks.freeze_live(self.vm.record, self.vm.host.libvirt(), cp, staging, publish, still)

    def memory_of(self, cp: Checkpoint) -> SavedVM:
        return SaveFile(cp.memory)

    def leave_stopped(self, memory: SavedVM) -> None:
        disks.leave_stopped(self.vm.record, _file(memory))

    def rewind(self, cp: Checkpoint) -> None:
        disks.rewind(self.vm.record, cp)

    def drop(self, label: str, *, live: bool) -> None:
        # a running VM reads every overlay of its chain: those are folded at the next checkpoint or rollback
        disks.tidy(self.vm.record, live=live)

    def sizes(self, found: list[Checkpoint]) -> dict[str, int]:
        return {c.label: c.size() for c in found}


class LocalForks(Forks):
    def ssh_port(self) -> int:
        return self.vm.record.ssh_port

    def share(self, cp: Checkpoint) -> AbstractContextManager[Sharing]:
        what = f"the memory of {self.vm.record.name} at its checkpoint {cp.label} (sealed, in memory)"
        record = self.vm.record
        return sharing.of_checkpoint(cp.memory, what, self.vm.host.libvirt(), record.accel, record.account)

    def copy_disks(self, cp: Checkpoint, fork: Record) -> Path | None:
        disks.copy_for_fork(self.vm.record, cp, fork)
        return cp.workspace

    def restore(self, cp: Checkpoint, fork: Record) -> VM:
        owned.own_account(fork)  # its own: never its source's
        saved = savefile.read(cp.memory)
        # its source's memory, relayed to its account alone: never to libvirt's, which every other QEMU runs as
        shared = sharing.split_of(cp.memory) if fork.account is not None else None
        if shared is None:
            fork.memory_note = "its memory is a copy of its source's"

        def launch() -> None:
            spec = start.spec(fork, domain.boot_of(saved.xml), warm=True, workspace=True)
            xml = domain.for_restore(saved.xml, spec)
            if shared is None and rambackend.memory_of(saved.xml) is not None:
                xml = rambackend.with_memory(xml, None)
            start.restore_shared(fork, self.vm.host.libvirt(), shared, xml, cp.memory)

        start.on_a_free_port(fork, launch)
        return self.vm.host.vm(fork)


def _templates_in_use() -> set[Path]:
    """The templates a session's disk rests on (its own, or a pinned one of another account's)."""
    used = {Path(r.template) for r in readable() if r.template}
    return used | {Path(p.template) for p in pins.of_others() if p.template}
