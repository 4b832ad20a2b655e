"""Checkpoints: a session's whole state — memory (its processes), system disk and workspace — kept at one moment,
so that `rollback` returns the session there and `fork` copies it.

A checkpoint is a directory in the session's: memory.save (libvirt's save image of the VM), workspace.raw (a
copy of the workspace disk; a reflink where the file system has them) and checkpoint.json. The system disk is
not copied: the overlay the VM wrote until then is frozen, the checkpoint names it, and a new overlay above it
takes the VM's writes from then on (session.place.chain keeps that chain short). Taking one saves the VM's
memory while it runs (`freeze_live`: its guest stops for the save's last pass only — for the save, in the same
QEMU, where passes would miss its writes: vm.livesave — and writes into its workspace wait while the disk is
copied); where that cannot be done (see `take_locked`) the VM is saved and restored from
the very file that is kept: the guest stops for a few seconds and carries on. A session on another host keeps the
same, as volumes there: how is the place's (session.place), what is kept is here.

A rollback never loses work silently: what is unsynced in the session when it rolls back is exported first,
outbox-style (changes.patch, the changed files, the guest's commits), to rolled-back/LABEL-TIME.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from vmsandbox import ui
from vmsandbox.egress import control
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest import commands
from vmsandbox.guest.freeze import Holding, held
from vmsandbox.session import lock
from vmsandbox.session.end import lifecycle
from vmsandbox.session.moments import suspend
from vmsandbox.session.place import choose
from vmsandbox.session.place.checkpoints import MOST, Checkpoint, find, listed
from vmsandbox.session.place.interface import VM
from vmsandbox.session.record import Record, State
from vmsandbox.session.state import runs, status, where
from vmsandbox.sync.fetch import delta, journal
from vmsandbox.sync.land import outbox
from vmsandbox.sync.review import gather

LABEL_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,39}\Z")
SYNC_TIMEOUT = 120
LIVE_SWITCH = "VMSANDBOX_LIVE_SAVE"  # "0": checkpoints and forks save the VM and resume it (paused throughout)


def _check_label(label: str) -> str:
    if not LABEL_RE.match(label):
        raise VmsandboxError(
            f"invalid checkpoint label {label!r}",
            hint="use 1-40 lowercase letters, digits, dots, dashes and underscores",
        )
    return label


def take(name: str, label: str | None = None) -> Checkpoint:
    """Checkpoint a running session (it pauses for a save and a restore)."""
    label = _check_label(label or time.strftime("cp-%Y%m%d-%H%M%S"))
    record = Record.load(name)
    with lock.held(record.files, name, "taking a checkpoint of"), choose.host_of(record) as host:
        record = Record.load(name)
        vm = host.vm(record)
        must_run(vm, "checkpointed")
        have = listed(record.files)
        if any(c.label == label for c in have):
            raise VmsandboxError(f"session {name} already has a checkpoint {label!r}", hint="pick another label")
        if len(have) >= MOST:
            raise VmsandboxError(
                f"session {name} has {len(have)} checkpoints, the most it keeps",
                hint=f"remove one with `vmsandbox checkpoint rm {name} LABEL`",
            )
        check_room(vm)
        return take_locked(vm, label)


def check_room(vm: VM) -> None:
    """Before a checkpoint: the session's disk chain has room for one more overlay (where its host does not fold
    chains, its abilities say how many it takes)."""
    most, record = vm.host.abilities.chain_limit, vm.record
    if most is not None and len(record.overlays) >= most:
        raise VmsandboxError(
            f"session {record.name} runs{where(vm.host)} over {len(record.overlays)} overlays, the most a "
            "session there takes (its chain is not folded on another host yet)",
            hint=f"`vmsandbox create --from {record.name}:LABEL --name NEW` makes a session there on one disk again "
            "(a copy of that checkpoint's), or pull its work and start a new session",
        )


def must_run(vm: VM, what: str) -> None:
    """A kept, running session (the VM is saved and restored: a `run` would lose its command); else why not."""
    record = vm.record
    if not record.keep:
        raise VmsandboxError(
            f"session {record.name} belongs to a running `vmsandbox run` (it ends with that command)",
            hint=f"only sessions started with --keep can be {what}",
        )
    current = status(vm).state
    if current is State.STOPPED:
        raise VmsandboxError(f"session {record.name} is stopped", hint=f"`vmsandbox start {record.name}` first")
    if current is not State.RUNNING:
        raise VmsandboxError(
            f"session {record.name} is {current}: only a running session can be {what}",
            hint="`vmsandbox ls` shows what each session is doing",
        )


def take_locked(vm: VM, label: str) -> Checkpoint:
    """Take a checkpoint of a running session whose lock is held: while it runs on, else (its place or its guest
    cannot, LIVE_SWITCH is off, or the live save failed with the VM running on as it was) saved and resumed."""
    cp = live(vm, label, listed=True)
    if cp is None:
        cp = freeze(vm, label)
        wake(vm, cp)
    return cp


def live(vm: VM, label: str, *, listed: bool) -> Checkpoint | None:
    """`freeze_live`, unless LIVE_SWITCH says no; a live save that failed while the VM runs on is said, and None
    returned (the caller saves and resumes it instead)."""
    if os.environ.get(LIVE_SWITCH, "1").strip().lower() in ("0", "off", "no", "false"):
        return None
    try:
        return freeze_live(vm, label, listed=listed)
    except VmsandboxError as exc:
        if not runs(vm):
            raise
        ui.warn(f"the live save failed ({exc.message}): session {vm.record.name} pauses for it instead")
        return None


def freeze(vm: VM, label: str) -> Checkpoint:
    """The first half of a checkpoint: the VM saved into it, its workspace copied, a new top overlay. The VM is
    down until `wake`."""
    record = vm.record
    files = record.files
    staging = _staging(record, label)
    with ui.step("Flushing the guest's file systems"):
        commands.run_as_root(record.endpoint(), "sync", timeout=SYNC_TIMEOUT)
    control.stop(files)
    cp = Checkpoint(label, time.time(), list(record.overlays), files.checkpoints / label)

    def publish() -> None:  # once what it keeps is whole
        Checkpoint(cp.label, cp.created, cp.chain, staging).write()
        staging.rename(cp.path)

    try:
        vm.snapshots.freeze(cp, staging, publish)
    except BaseException:
        for d in (staging, cp.path):
            shutil.rmtree(d, ignore_errors=True)
        raise
    # as published: the freeze may have folded the overlays below it that no checkpoint needed any more (a
    # former fork's), and its chain names what is left
    return find(files, record.name, label)


def freeze_live(vm: VM, label: str, *, listed: bool) -> Checkpoint | None:
    """A checkpoint of a running session, taken while it runs on (its guest paused for the last pass of the save
    only; its workspace frozen while its disk is copied); None where its place or its guest cannot (nothing was
    changed: `freeze` then). Its memory holds the workspace frozen, which a VM restored from it with another
    hostname (a fork) thaws by itself, and a rollback thaws (guest.freeze.end_restored). `listed`: published as
    the session's checkpoint; else (a fork's) it stays in its staging directory, never listed, removed by the
    fork, or by the next checkpoint taken should the fork's command die."""
    record = vm.record
    files = record.files
    staging = _staging(record, label)
    cp = Checkpoint(label, time.time(), list(record.overlays), files.checkpoints / label if listed else staging, True)

    def publish() -> None:
        Checkpoint(cp.label, cp.created, cp.chain, staging, cp.live).write()
        if listed:
            staging.rename(cp.path)

    def still() -> AbstractContextManager[Holding | None]:
        return held(record.endpoint(), record.project)

    try:
        done = vm.snapshots.freeze_live(cp, staging, publish, still)
    except BaseException:
        for d in (staging, cp.path):
            shutil.rmtree(d, ignore_errors=True)
        raise
    if not done:
        shutil.rmtree(staging, ignore_errors=True)
        return None
    return cp


def _staging(record: Record, label: str) -> Path:
    """A new, empty directory for checkpoint `label` to be made in. Under the session's lock: any other one there
    is what a command that died left (a save's memory, a workspace's copy), removed."""
    files = record.files
    files.checkpoints.mkdir(mode=0o700, exist_ok=True)
    for left in files.checkpoints.glob(".tmp-*"):
        shutil.rmtree(left, ignore_errors=True)
    staging = files.checkpoints / f".tmp-{label}"
    staging.mkdir(mode=0o700)
    return staging


def wake(vm: VM, cp: Checkpoint) -> None:
    """The second half: the VM resumed from the checkpoint's memory (left stopped on it if that fails)."""
    _resume(vm, cp, f"Resuming {vm.record.domain}")


def _resume(vm: VM, cp: Checkpoint, title: str) -> None:
    """The VM resumed from checkpoint `cp`'s memory (one taken live: its workspace thawed, and the SSH sessions it
    held ended, before its egress link is made); if that fails, the session is left stopped on it (as `vmsandbox
    stop` would have left it), so that `vmsandbox start` resumes it (and thaws it too)."""
    memory = vm.snapshots.memory_of(cp)
    try:
        suspend.resume(vm, memory, title, restored=suspend.thawing(vm.record) if cp.live else None)
    except BaseException:
        vm.snapshots.leave_stopped(memory)
        if cp.live:
            suspend.held_still(vm.record.files).touch()
        raise


def sizes(record: Record, found: list[Checkpoint]) -> dict[str, int]:
    """Each checkpoint's bytes where its session's place keeps it (raises when that place does not say)."""
    with choose.vm_of(record) as vm:
        return vm.snapshots.sizes(found)


@dataclass(frozen=True)
class Rolled:
    checkpoint: Checkpoint
    box: Path | None  # where the unsynced work was exported, if there was any
    left: int


def rollback(name: str, label: str, *, limit: int) -> Rolled:
    """Return a session to a checkpoint: memory, processes, system disk and workspace. Unsynced work is
    exported to rolled-back/ first."""
    record = Record.load(name)
    files = record.files
    with lock.held(files, name, "rolling back"), choose.host_of(record) as host:
        record = Record.load(name)
        vm = host.vm(record)
        cp = find(files, name, label)
        if not record.keep or status(vm).state not in (State.RUNNING, State.STOPPED, State.EXITED):
            must_run(vm, "rolled back")
        g = lifecycle.gather(record, limit=limit, vm=vm)
        left = gather.pending(g)
        box = None
        if left:
            with ui.step(f"Keeping {len(left)} unsynced change(s) before the rollback"):
                box = outbox.export(g, box=outbox.fresh_box(files.rolled_back, label))
        control.stop(files)
        host.libvirt().destroy(record.domain)
        files.saved_memory.unlink(missing_ok=True)
        record.saved = False
        record.overlays = list(cp.chain)
        vm.snapshots.rewind(cp)
        # the guest's journal went back in time with it: the next pull walks the tree once
        delta.forget(files.root)
        journal.cursor_file(files.root).unlink(missing_ok=True)
        record.unsynced = None
        record.save()
        _resume(vm, cp, f"Restoring {record.domain} to checkpoint {label}")
    return Rolled(cp, box, len(left))


def remove(name: str, label: str) -> Checkpoint:
    record = Record.load(name)
    with lock.held(record.files, name, "removing a checkpoint of"), choose.host_of(record) as host:
        record = Record.load(name)
        vm = host.vm(record)
        cp = find(record.files, name, label)
        shutil.rmtree(cp.path)
        vm.snapshots.drop(label, live=status(vm).state is not State.STOPPED)
    return cp
