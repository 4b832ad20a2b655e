"""Where a session's VM lives, as small interfaces, each one concern, bound once when made — lima's driver in
spirit (Lifecycle, Snapshots, GuestAgent):

- Host: one libvirt host (this machine, or another one named under `hosts:`) on the one connection an operation
  uses; it admits, boots and sweeps sessions, gives the VM of one and forgets one. Reached from it:
  - Images (`Host.images`): the images it holds and their warm-start templates;
  - Facts (`Host.facts`): what it offers a session, as `doctor` and `host ls` show it.
- VM: one session's VM on that connection: what libvirt says of it, reaching its guest, its console, a dead
  VM's disk. Reached from it:
  - Saved (`VM.saved`): the VM saved where a stopped session keeps it, and restored from a save;
  - Snapshots (`VM.snapshots`): its checkpoints;
  - Forks (`VM.forks`): the sessions made from a checkpoint of it.

What a kind of place can do is data (Abilities), read by policy instead of asking where a VM lives: a step one
place takes and another does not is an ability, never a method that does nothing. A place answers with data;
the words a person reads are its caller's. Two implementations: this machine (local/) and another libvirt host
(remote/), chosen in one place (choose.py), sharing what they do the same way (common.py). A new place (a KVM
node under a cluster manager) is one more sub-package implementing these, its Abilities, and one line in
choose.py (docs/architecture.md says how).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

from vmsandbox.guest.freeze import Holding
from vmsandbox.guest.ssh import Endpoint
from vmsandbox.image import store
from vmsandbox.session.place.checkpoints import Checkpoint
from vmsandbox.session.place.hostspec import HostSpec
from vmsandbox.session.place.templates import Shape
from vmsandbox.session.record import Record
from vmsandbox.vm import accel
from vmsandbox.vm.memory.usage import Usage
from vmsandbox.vm.node import DomainInfo, Node
from vmsandbox.vm.virt import Hypervisor

Launched = Callable[[], None]  # called once the VM runs on its SSH port (create spawns the egress daemon)
Still = Callable[[], AbstractContextManager[Holding | None]]  # the guest's workspace held frozen (guest.freeze)


class Tidy(Protocol):
    """What gc does with what it finds (session.end.gc makes it): `tidy(verb, what, do)` calls `do` and says
    what was done, a line; in a dry run (`dry`) it only says what would be."""

    @property
    def dry(self) -> bool: ...

    def __call__(self, verb: str, what: str, do: Callable[[], object]) -> str: ...


@dataclass(frozen=True)
class SavedVM:
    """A VM's memory and devices saved by libvirt (a stopped session's, a checkpoint's): where depends on the
    place, and only that place reads it (each narrows it to its own kind)."""


@dataclass(frozen=True)
class Sharing:
    """What the VMs restored from one checkpoint share of its memory: `mapped` bytes of it, mapped copy-on-write,
    one copy for all; or None, and each loads a copy, for the reason `unshared` gives."""

    mapped: int | None
    unshared: str | None = None


@dataclass(frozen=True)
class Abilities:
    """What a kind of place can do. Policy reads these instead of asking where a VM lives."""

    elsewhere: bool  # another machine: messages say " on host NAME"; it may not answer while this one does (then
    # `destroy --discard` forgets a session there here, and gc sweeps it there once the host answers)
    tunnelled: bool  # its guests' SSH is reached through a tunnel from this machine's loopback (remote.tunnel): its
    # libvirt URI must be an ssh one, and a session's tunnel closes with it
    holds_images: bool  # images are sent to it and held there (`host prepare`); else it uses them where they are
    chain_limit: int | None  # the most overlays a session's disk chain takes there (a checkpoint past it is
    # refused); None: the chain is folded (place.chain), so it never grows past a few


class Host(abc.ABC):
    """One libvirt host (`spec`: its name, `local` for this machine, and its URI) on the one connection an
    operation uses: opened at its first use, closed when the operation ends (choose.py makes and closes it)."""

    abilities: ClassVar[Abilities]

    def __init__(self, spec: HostSpec) -> None:
        self.spec = spec

    @abc.abstractmethod
    def libvirt(self) -> Hypervisor:
        """The host's libvirt connection: opened at the first call (raises UnreachableError, with the fix, when
        it does not answer), the same one after."""

    @abc.abstractmethod
    def close(self) -> None:
        """The connection closed, if it was opened."""

    @abc.abstractmethod
    def admit(self, requested: accel.Accel, memory_mib: int) -> accel.Choice:
        """The accelerator a session gets there, after checking the host has room for it under its limits."""

    @abc.abstractmethod
    def boot(self, record: Record, image: store.Image, *, cold: bool, timeout: int, launched: Launched) -> VM:
        """Start the session's VM (warm from a template when one serves, else cold), `launched` called once it
        runs, and wait for its sshd; record.start and record.start_note say how it started."""

    @abc.abstractmethod
    def vm(self, record: Record) -> VM:
        """The session's VM there, on this host's connection."""

    @abc.abstractmethod
    def forget(self, root: Path, domain: str) -> None:
        """The VM of the session whose directory is `root` destroyed, with what the host keeps of it beside that
        directory (a tunnel, volumes): for a session whose record may not be readable."""

    @abc.abstractmethod
    def sweep(self, mine: Path, tidy: Tidy) -> Iterator[str]:
        """gc there: domains and files of this machine's sessions that are gone, templates no session rests
        on that are interrupted, failed or stale. What `tidy` says of each thing done (or, in a dry run, to do)."""

    @property
    @abc.abstractmethod
    def images(self) -> Images:
        """The host's images and warm-start templates."""

    @property
    @abc.abstractmethod
    def facts(self) -> Facts:
        """What the host offers a session."""


class Images(abc.ABC):
    """The images a host (`host`) holds and their warm-start templates there."""

    def __init__(self, host: Host) -> None:
        self.host = host

    @abc.abstractmethod
    def template(self, image: store.Image, shape: Shape, timeout: int) -> str:
        """The warm-start template of `image` in `shape` there (built unless it exists): where it is (its path
        or its name there)."""

    @abc.abstractmethod
    def hold(self, image: store.Image) -> bool:
        """`image` sent there unless it is there whole already: whether it was sent. Only a host whose abilities
        say `holds_images` takes one; another refuses."""

    @abc.abstractmethod
    def held(self) -> list[str]:
        """The images the host holds whole (or uses where they are), by directory name."""


class Facts(abc.ABC):
    """What a host (`host`) offers a session, as its libvirt's `node` describes it."""

    def __init__(self, host: Host) -> None:
        self.host = host

    @abc.abstractmethod
    def accelerator(self, node: Node) -> str:
        """The accelerator a session there would get."""

    @abc.abstractmethod
    def kvm_problem(self, node: Node) -> str | None:
        """Why KVM cannot be used there (None: it can)."""

    @abc.abstractmethod
    def memory_problem(self, node: Node) -> str | None:
        """Why sessions there cannot map their template's memory, sharing it (each loads a copy); None: they can."""


class VM(abc.ABC):
    """One session's VM (`record`) on its host's connection (`host`)."""

    def __init__(self, host: Host, record: Record) -> None:
        self.host = host
        self.record = record

    @abc.abstractmethod
    def info(self) -> DomainInfo | None:
        """What libvirt says of the VM now (None: there is no such domain)."""

    @abc.abstractmethod
    def memory_use(self) -> Usage | None:
        """What the running VM's process takes of its machine's memory now, shared and private (None: not running,
        or not something this machine can read)."""

    @abc.abstractmethod
    def reach(self, *, answering: bool = False) -> Endpoint:
        """The running guest's SSH endpoint, leading there from this machine's loopback (with `answering`, it
        carries the guest's SSH banner)."""

    @abc.abstractmethod
    def console(self, *, follow: bool) -> Path:
        """The VM's serial console as a file here, up to date (with `follow`, kept so while this command runs)."""

    @abc.abstractmethod
    def workspace_disk(self) -> Path:
        """A VM that is not running: its workspace disk as the VM left it, as a file here (a reader VM mounts it
        there), fetched from the host that keeps it."""

    @property
    @abc.abstractmethod
    def saved(self) -> Saved:
        """The VM saved and restored."""

    @property
    @abc.abstractmethod
    def snapshots(self) -> Snapshots:
        """The VM's checkpoints."""

    @property
    @abc.abstractmethod
    def forks(self) -> Forks:
        """The sessions made from the VM's checkpoints."""


class Saved(abc.ABC):
    """One session's VM (`vm`) saved where a stopped session keeps it (its save), and restored from a save."""

    def __init__(self, vm: VM) -> None:
        self.vm = vm

    @abc.abstractmethod
    def take(self, *, deadline: float | None = None) -> None:
        """Save the running VM where a stopped session keeps it (nothing half-saved left on failure). `deadline`:
        seconds after which a save that has not ended is aborted (the VM runs on) and this raises."""

    @abc.abstractmethod
    def held(self) -> bool:
        """Whether the stopped session's save is there."""

    @abc.abstractmethod
    def memory(self) -> SavedVM:
        """Where the stopped session's VM is saved."""

    @abc.abstractmethod
    def size(self) -> int | None:
        """The bytes the stopped session's save takes where it is kept (None: its place does not say)."""

    @abc.abstractmethod
    def restore(self, memory: SavedVM) -> None:
        """Restore the VM from `memory` (the stopped session's save, or a checkpoint's) over the disks
        record.overlays names, on its SSH port (another if that was taken meanwhile), reachable from here."""

    @abc.abstractmethod
    def discard(self) -> None:
        """After a stopped session was restored: its save, and copies a pull of the stopped VM made, deleted."""


class Snapshots(abc.ABC):
    """One session's checkpoints, where its VM (`vm`) lives. A checkpoint's record (checkpoints.py) is on this
    machine; what it keeps is the place's."""

    def __init__(self, vm: VM) -> None:
        self.vm = vm

    @abc.abstractmethod
    def freeze(self, cp: Checkpoint, staging: Path, publish: Launched) -> None:
        """The VM (flushed, its egress stopped) saved into checkpoint `cp`, its workspace disk copied, its top
        overlay frozen under a new one; `publish` makes the checkpoint's record in `staging` whole (it becomes
        cp.path). The VM is down after. On failure the session is left stopped on what was saved."""

    @abc.abstractmethod
    def freeze_live(self, cp: Checkpoint, staging: Path, publish: Launched, still: Still) -> bool:
        """As `freeze`, with the VM running on: its memory saved while its guest runs (paused for the last pass
        only), its workspace disk copied while `still` holds the guest's workspace frozen. False where the place
        or the guest cannot (nothing was changed: the caller freezes it)."""

    @abc.abstractmethod
    def memory_of(self, cp: Checkpoint) -> SavedVM:
        """Where checkpoint `cp` keeps the VM."""

    @abc.abstractmethod
    def leave_stopped(self, memory: SavedVM) -> None:
        """A checkpoint or rollback failed with the VM down: the session is left stopped on (a copy of)
        `memory`, as `vmsandbox stop` would have left it, and says so."""

    @abc.abstractmethod
    def rewind(self, cp: Checkpoint) -> None:
        """Rollback's disks (the VM down, record.overlays set to cp.chain): a new top overlay, the workspace disk
        the checkpoint's, a stopped session's save and what no chain needs any more deleted."""

    @abc.abstractmethod
    def drop(self, label: str, *, live: bool) -> None:
        """After checkpoint `label`'s record is gone: what it kept deleted, and the overlays no chain needs (with
        `live`, the VM runs on its chain)."""

    @abc.abstractmethod
    def sizes(self, found: list[Checkpoint]) -> dict[str, int]:
        """Each checkpoint's bytes where it is kept, by label."""


class Forks(abc.ABC):
    """The sessions made from one session's checkpoints (its VM: `vm`), where that VM lives."""

    def __init__(self, vm: VM) -> None:
        self.vm = vm

    @abc.abstractmethod
    def ssh_port(self) -> int:
        """The SSH port a fork's record starts with (0: it gets one of its own when it is reached)."""

    @abc.abstractmethod
    def share(self, cp: Checkpoint) -> AbstractContextManager[Sharing]:
        """While the context lasts, the VMs restored from checkpoint `cp` (its session resuming, the forks made from
        it) map one copy of its memory and share the pages none of them writes, where the place can; each loads a
        copy where it cannot. What was done, or why it could not be."""

    @abc.abstractmethod
    def copy_disks(self, cp: Checkpoint, fork: Record) -> Path | None:
        """The fork's system disk (and, where the place keeps it, its workspace disk) made from `cp`; the
        workspace disk to copy to the fork's directory, or None when it was made there."""

    @abc.abstractmethod
    def restore(self, cp: Checkpoint, fork: Record) -> VM:
        """The fork's VM restored from the checkpoint's save as its own domain, reachable from here."""
