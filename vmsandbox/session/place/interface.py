"""The place a session's VM lives: one interface, two implementations — this machine (session.local) and another
libvirt host (session.remote) — chosen in one place (session.places) from the record or the host named.

Policy (create, lifecycle, suspend, checkpoint, fork, fanout, gc, state) says *what* happens to a session and
calls a Place for *how* it happens where the VM is: booting it cold or warm, saving and restoring its memory,
freezing, rewinding and dropping its disks, forking them, reaching its sshd, reading a dead VM's workspace,
refreshing its console, forgetting it and sweeping what a killed command left. Policy never asks where a VM
lives; a new place (a cloud host, a machine in a cluster) is one more sub-package with a Place of its own and
one line in session.places (docs/architecture.md says how).
"""

from __future__ import annotations

import abc
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from vmsandbox import ui
from vmsandbox.errors import VmsandboxError
from vmsandbox.image import store
from vmsandbox.session.place.checkpoints import Checkpoint
from vmsandbox.session.place.hostspec import HostSpec
from vmsandbox.session.place.templates import Shape
from vmsandbox.session.record import Record
from vmsandbox.vm import accel
from vmsandbox.vm.node import Node, UnreachableError, gone
from vmsandbox.vm.virt import Hypervisor

T = TypeVar("T")
Launched = Callable[[], None]  # called once the VM runs on its SSH port (create spawns the egress daemon)
IDENTITY_TIMEOUT = 60  # a warm-started guest takes its identity in a second or two, even under TCG


def nothing() -> None:
    return None


PAST = {"remove": "removed", "destroy": "destroyed", "finish": "finished", "delete": "deleted"}


@dataclass(frozen=True)
class Tidy:
    """What gc does with what it finds: does it and says so, or in a dry run (`gc --dry-run`) only says what
    it would do."""

    dry: bool = False

    def __call__(self, verb: str, what: str, do: Callable[[], object]) -> str:
        if self.dry:
            return f"would {verb} {what}"
        do()
        return f"{PAST[verb]} {what}"


def alive(hv: Hypervisor, name: str) -> str | None:
    """None while the domain runs, else why it stopped (for ssh.wait_for_banner)."""
    return "the VM powered off or crashed" if gone(hv.info(name)) else None


def template_for(record: Record, ensure: Callable[[], T], *, cold: bool, unbuilt: str) -> T | None:
    """The template a session starts from (`ensure()` finds or builds it), or None — and record.start_note says
    why — for a cold boot: --cold, an image build, or `unbuilt` and the reason the template could not be had."""
    if cold or record.disk is not None:
        record.start_note = "--cold" if cold else "an image build boots its disk cold"
        return None
    try:
        return ensure()
    except VmsandboxError as exc:
        record.start_note = f"{unbuilt}: {exc.message}"
        ui.warn(f"{record.start_note}; booting cold")
        return None


def warm_or_cold(record: Record, warm_start: Callable[[], None], undo: Callable[[VmsandboxError], None]) -> bool:
    """Whether `warm_start` started the session's VM (its time recorded); when it failed, `undo(why)` has cleared
    it away, and the caller boots cold."""
    started = time.monotonic()
    try:
        warm_start()
    except VmsandboxError as exc:
        undo(exc)
        return False
    record.boot_seconds = round(time.monotonic() - started, 1)
    record.save()
    return True


@dataclass(frozen=True)
class SavedVM:
    """A VM's memory and devices saved by libvirt (a stopped session's, a checkpoint's): where depends on the
    place, and only that place reads it (each narrows it to its own kind)."""


@dataclass(frozen=True)
class SaveFile(SavedVM):
    """A save image in a file on this machine."""

    path: Path


@dataclass(frozen=True)
class SaveVolume(SavedVM):
    """A save image in a volume of the session's host's pool."""

    volume: str


class Place(abc.ABC):
    """Where one session's VM runs: `spec` names the host (`local` for this machine) and its libvirt URI."""

    def __init__(self, spec: HostSpec) -> None:
        self.spec = spec

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def uri(self) -> str:
        return self.spec.uri

    @property
    @abc.abstractmethod
    def where(self) -> str:
        """Words for messages: "" here, " on host NAME" there."""

    # -- making and starting a VM ------------------------------------------------------------------------------
    @abc.abstractmethod
    def admit(self, hv: Hypervisor, requested: accel.Accel, memory_mib: int) -> accel.Choice:
        """The accelerator a session gets here, after checking the place has room for it under its limits."""

    @abc.abstractmethod
    def boot(
        self, record: Record, image: store.Image, hv: Hypervisor, *, cold: bool, timeout: int, launched: Launched
    ) -> None:
        """Start the session's VM (warm from a template when one serves, else cold), `launched` called once it
        runs, and wait for its sshd; record.start and record.start_note say how it started."""

    @abc.abstractmethod
    def warm_template(self, image: store.Image, shape: Shape, hv: Hypervisor, timeout: int) -> str:
        """The warm-start template of `image` in `shape` there (built unless it exists): where it is, in words."""

    # -- reaching it -------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def reach(self, record: Record, *, answering: bool = False) -> None:
        """Before a command reaches the running guest: its SSH endpoint on this machine's loopback leads there
        (with `answering`, it carries the guest's SSH banner)."""

    @abc.abstractmethod
    def refresh_console(self, record: Record, *, follow: bool) -> None:
        """Bring record.files.console_log up to date with the VM's serial console."""

    # -- stop and start ----------------------------------------------------------------------------------------
    @abc.abstractmethod
    def save(self, record: Record, hv: Hypervisor) -> None:
        """Save the running VM where a stopped session keeps it (nothing half-saved left on failure)."""

    @abc.abstractmethod
    def stopped(self, record: Record) -> SavedVM:
        """Where a stopped session's VM is saved."""

    @abc.abstractmethod
    def holds_save(self, record: Record, hv: Hypervisor) -> bool:
        """Whether the stopped session's save is there."""

    @abc.abstractmethod
    def saved_words(self, record: Record) -> str:
        """What `stop` kept, and where, in words."""

    @abc.abstractmethod
    def restore(self, record: Record, hv: Hypervisor, memory: SavedVM) -> None:
        """Restore the VM from `memory` over the disks record.overlays names, on its SSH port (another if that
        was taken meanwhile), reachable from here."""

    @abc.abstractmethod
    def started(self, record: Record, hv: Hypervisor) -> None:
        """After a stopped session was restored: its save, and copies a pull of the stopped VM made, deleted."""

    # -- checkpoints -------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def check_room(self, record: Record) -> None:
        """Before a checkpoint: raise (with the fix) if the session's disk chain has no room for one more."""

    @abc.abstractmethod
    def freeze(self, record: Record, hv: Hypervisor, cp: Checkpoint, staging: Path, publish: Launched) -> None:
        """The VM (flushed, its egress stopped) saved into checkpoint `cp`, its workspace disk copied, its top
        overlay frozen under a new one; `publish` makes the checkpoint's record in `staging` whole (it becomes
        cp.path). The VM is down after. On failure the session is left stopped on what was saved."""

    @abc.abstractmethod
    def memory_of(self, record: Record, cp: Checkpoint) -> SavedVM:
        """Where checkpoint `cp` keeps the VM."""

    @abc.abstractmethod
    def leave_stopped(self, record: Record, hv: Hypervisor, memory: SavedVM) -> None:
        """A checkpoint or rollback failed with the VM down: the session is left stopped on (a copy of)
        `memory`, as `vmsandbox stop` would have left it, and says so."""

    @abc.abstractmethod
    def rewind(self, record: Record, hv: Hypervisor, cp: Checkpoint) -> None:
        """Rollback's disks (the VM down, record.overlays set to cp.chain): a new top overlay, the workspace disk
        the checkpoint's, a stopped session's save and what no chain needs any more deleted."""

    @abc.abstractmethod
    def drop(self, record: Record, hv: Hypervisor, label: str, *, live: bool) -> None:
        """After checkpoint `label`'s record is gone: what it kept deleted, and the overlays no chain needs (with
        `live`, the VM runs on its chain)."""

    @abc.abstractmethod
    def sizes(self, record: Record, found: list[Checkpoint]) -> dict[str, int]:
        """Each checkpoint's bytes where it is kept, by label."""

    # -- forks -------------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def fork_port(self, source: Record) -> int:
        """The SSH port a fork's record starts with (0: it gets one of its own when it is reached)."""

    @abc.abstractmethod
    def copy_disks(self, source: Record, cp: Checkpoint, record: Record, hv: Hypervisor) -> Path | None:
        """The fork's system disk (and, where the place keeps it, its workspace disk) made from `cp`; the
        workspace disk to copy to the fork's directory, or None when it was made there."""

    @abc.abstractmethod
    def restore_fork(self, source: Record, cp: Checkpoint, record: Record, hv: Hypervisor) -> None:
        """The fork's VM restored from the checkpoint's save as its own domain, reachable from here."""

    # -- a VM that is gone -------------------------------------------------------------------------------------
    @abc.abstractmethod
    def fetch_workspace(self, record: Record) -> None:
        """A session whose VM is not running: its workspace disk, as the VM left it, at
        record.files.workspace_disk (a reader VM mounts it there)."""

    @abc.abstractmethod
    def forget(self, root: Path, domain: str) -> None:
        """What the place keeps of a session beside its domain (tunnel, volumes) gone; the domain is the
        caller's to destroy."""

    @staticmethod
    @abc.abstractmethod
    def release(root: Path) -> None:
        """What a place of this kind runs on this machine for the session whose directory is `root` (a tunnel)
        stopped: for a session whose record cannot be read, so whose place is not known."""

    @abc.abstractmethod
    def unanswered(self, record: Record, exc: UnreachableError) -> VmsandboxError:
        """The place did not answer, so a session's changes cannot be read: the error that says what to do."""

    @abc.abstractmethod
    def forget_unanswered(self, record: Record, exc: UnreachableError) -> bool:
        """The place did not answer while a session is removed with --discard: whether it is forgotten here all
        the same (said; the place's gc sweeps it later) instead of the error raised."""

    @abc.abstractmethod
    def sweep(self, mine: Path, tidy: Tidy) -> Iterator[str]:
        """gc there: domains and files of this machine's sessions that are gone, templates no session rests
        on that are interrupted, failed or stale. A line per thing done (or, in a dry run, to do)."""

    # -- the place itself --------------------------------------------------------------------------------------
    @abc.abstractmethod
    def libvirt_for(self, here: str) -> str:
        """The libvirt URI that asks the place, where `here` is the one this machine's config names."""

    @contextlib.contextmanager
    def connected(self, here: Hypervisor) -> Iterator[Hypervisor]:
        """A connection to the place's libvirt: `here` (open to this machine's config's URI) if that is it."""
        at = self.libvirt_for(here.uri)
        if at == here.uri:
            yield here
            return
        with Hypervisor(at) as hv:
            yield hv

    @abc.abstractmethod
    def check(self) -> None:
        """Raise (with the fix) unless sessions can run there at all (e.g. another host reached over ssh)."""

    @abc.abstractmethod
    def check_holds_images(self) -> None:
        """Raise (with the fix) unless images are sent to the place (this machine uses them where they are)."""

    @abc.abstractmethod
    def hold_image(self, hv: Hypervisor, image: store.Image) -> str:
        """`image` sent there unless it is there whole already: what was done, in words."""

    @abc.abstractmethod
    def images_held(self, hv: Hypervisor) -> list[str]:
        """The images the place holds whole, by directory name."""

    @abc.abstractmethod
    def accel_of(self, node: Node) -> str:
        """The accelerator a session there would get, as `node` (the place's libvirt) describes it."""

    @abc.abstractmethod
    def kvm_problem(self, node: Node) -> str | None:
        """Why KVM cannot be used there (None: it can)."""
