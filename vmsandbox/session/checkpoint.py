"""Checkpoints: a session's whole state — memory (its processes), system disk and workspace — kept at one moment,
so that `rollback` returns the session there and `fork` copies it.

A checkpoint is a directory in the session's: memory.save (libvirt's save image of the VM), workspace.raw (a
copy of the workspace disk; a reflink where the file system has them) and checkpoint.json. The system disk is
not copied: the overlay the VM wrote until then is frozen, the checkpoint names it, and a new overlay above it
takes the VM's writes from then on (session.chain keeps that chain short). Taking one saves the VM and
restores it from the very file that is kept: the guest stops for a few seconds and carries on. A session on
another host keeps the same, as volumes there (remotecheckpoint.py).

A rollback never loses work silently: what is unsynced in the session when it rolls back is exported first,
outbox-style (changes.patch, the changed files, the guest's commits), to rolled-back/LABEL-TIME.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmsandbox import access, paths, ui
from vmsandbox.egress import control
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest import commands
from vmsandbox.session import chain, lifecycle, lock, remotecheckpoint, suspend
from vmsandbox.session.hostspec import is_remote
from vmsandbox.session.record import Record, State
from vmsandbox.session.state import status
from vmsandbox.sync import capture, changes, delta, journal, outbox
from vmsandbox.vm import qemuimg
from vmsandbox.vm.virt import Hypervisor

MEMORY = "memory.save"
WORKSPACE = "workspace.raw"
META = "checkpoint.json"
MAX_CHECKPOINTS = 16
MAX_DEPTH = 3 + MAX_CHECKPOINTS + 2  # base, layer, template; a frozen overlay per checkpoint; the top
LABEL_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,39}$")
SYNC_TIMEOUT = 120


@dataclass(frozen=True)
class Checkpoint:
    label: str
    created: float
    chain: list[str]  # the overlays the system disk read then, oldest first; the last is frozen for this one
    path: Path

    @property
    def overlay(self) -> str:
        return self.chain[-1]

    @property
    def memory(self) -> Path:
        return self.path / MEMORY

    @property
    def workspace(self) -> Path:
        return self.path / WORKSPACE

    def size(self) -> int:
        """Bytes on disk: the saved memory, the workspace copy and the frozen overlay."""
        kept = (self.memory, self.workspace, self.path.parent.parent / self.overlay)
        return sum(f.stat().st_blocks * 512 for f in kept if f.exists())

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, "created": self.created, "overlay": self.overlay, "bytes": self.size()}

    def write(self) -> None:
        data = {"label": self.label, "created": self.created, "chain": self.chain}
        paths.write_atomically(self.path / META, json.dumps(data, indent=1))


def listed(files: paths.SessionPaths) -> list[Checkpoint]:
    """The session's checkpoints, oldest first (ones being taken, `.tmp-*`, are not)."""
    found = []
    if files.checkpoints.is_dir():
        for d in files.checkpoints.iterdir():
            if d.name.startswith(".") or not (d / META).is_file():
                continue
            try:
                data = json.loads((d / META).read_text())
                found.append(Checkpoint(str(data["label"]), float(data["created"]), list(data["chain"]), d))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                ui.warn(f"checkpoint {d} is damaged ({exc}); `rm -r` it to drop it")
    return sorted(found, key=lambda c: c.created)


def find(files: paths.SessionPaths, name: str, label: str) -> Checkpoint:
    for c in listed(files):
        if c.label == label:
            return c
    labels = ", ".join(c.label for c in listed(files)) or "none"
    raise VmsandboxError(
        f"session {name} has no checkpoint {label!r} (it has: {labels})",
        hint=f"`vmsandbox checkpoint {name} LABEL` takes one",
    )


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
    with lock.held(record.files, name, "taking a checkpoint"), Hypervisor(record.libvirt_uri) as hv:
        record = Record.load(name)
        must_run(record, hv, "checkpointed")
        have = listed(record.files)
        if any(c.label == label for c in have):
            raise VmsandboxError(f"session {name} already has a checkpoint {label!r}", hint="pick another label")
        if len(have) >= MAX_CHECKPOINTS:
            raise VmsandboxError(
                f"session {name} has {len(have)} checkpoints, the most it keeps",
                hint=f"remove one with `vmsandbox checkpoint rm {name} LABEL`",
            )
        remotecheckpoint.check_room(record)
        return take_locked(record, hv, label)


def must_run(record: Record, hv: Hypervisor, what: str) -> None:
    """A kept, running session (the VM is saved and restored: a `run` would lose its command); else why not."""
    if not record.keep:
        raise VmsandboxError(
            f"session {record.name} belongs to a running `vmsandbox run` (it ends with that command)",
            hint=f"only sessions started with --keep can be {what}",
        )
    current = status(record, hv).state
    if current is State.STOPPED:
        raise VmsandboxError(f"session {record.name} is stopped", hint=f"`vmsandbox start {record.name}` first")
    if current is not State.RUNNING:
        raise VmsandboxError(
            f"session {record.name} is {current}: only a running session can be {what}",
            hint="`vmsandbox ls` shows what each session is doing",
        )


def take_locked(record: Record, hv: Hypervisor, label: str) -> Checkpoint:
    """Take a checkpoint of a running session whose lock is held."""
    cp = freeze(record, hv, label)
    wake(record, hv, cp)
    return cp


def freeze(record: Record, hv: Hypervisor, label: str) -> Checkpoint:
    """The first half of a checkpoint: the VM saved into it, its workspace copied, a new top overlay. The VM is
    down until `wake`."""
    files = record.files
    files.checkpoints.mkdir(mode=0o700, exist_ok=True)
    staging = files.checkpoints / f".tmp-{label}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(mode=0o700)
    with ui.step("Flushing the guest's file systems"):
        commands.run_as_root(record.endpoint(), "sync", timeout=SYNC_TIMEOUT)
    control.stop(files)
    cp = Checkpoint(label, time.time(), list(record.overlays), files.checkpoints / label)

    def publish() -> None:  # once what it keeps is whole
        Checkpoint(cp.label, cp.created, cp.chain, staging).write()
        staging.rename(cp.path)

    if is_remote(record.libvirt_uri):
        remotecheckpoint.freeze(record, hv, label, publish, leftovers=(staging, cp.path))
        return cp
    memory = staging / MEMORY
    with ui.step(f"Saving {record.domain} (memory and devices)"):
        hv.save(record.domain, str(memory))
    try:
        with ui.step("Keeping the workspace disk"):
            capture.copy_disk(files.workspace_disk, staging / WORKSPACE)
        publish()
        memory = cp.memory
        new_top(record)
        tidy(record, live=False)
    except BaseException:
        _leave_stopped(record, hv, memory)
        for d in (staging, cp.path):
            shutil.rmtree(d, ignore_errors=True)
        raise
    return cp


def wake(record: Record, hv: Hypervisor, cp: Checkpoint) -> None:
    """The second half: the VM resumed from the checkpoint's memory (left stopped on it if that fails)."""
    try:
        suspend.resume(record, hv, _memory(record, cp), f"Resuming {record.domain}")
    except BaseException:
        _leave_stopped(record, hv, _memory(record, cp))
        raise


def _memory(record: Record, cp: Checkpoint) -> Path | str:
    """Where a checkpoint keeps the VM: its file here, or a volume on the session's host."""
    return remotecheckpoint.volume(record, cp.label, "save") if is_remote(record.libvirt_uri) else cp.memory


def _leave_stopped(record: Record, hv: Hypervisor, memory: Path | str) -> None:
    """A checkpoint or rollback failed with the VM down: leave the session stopped on `memory` (as `vmsandbox
    stop` would), so that `vmsandbox start` resumes it."""
    if isinstance(memory, str):
        remotecheckpoint.leave_stopped(record, hv, memory)
    elif memory.exists():
        shutil.copyfile(memory, record.files.saved_memory)
        record.saved = True
        record.save()
        ui.warn(f"session {record.name} is stopped; `vmsandbox start {record.name}` resumes it")


def new_top(record: Record) -> None:
    """Freeze the VM's top overlay and put a new one above it (the VM must be down)."""
    if os.geteuid() != 0 and record.system_disk.stat().st_uid == os.geteuid():
        # libvirt hands a VM's backing images to QEMU's account and, unlike the top one, never hands them back:
        # an entry of our own keeps a frozen overlay ours to read, fold and copy
        access.grant(record.system_disk, os.geteuid(), 6)
    top = f"overlay-{secrets.token_hex(4)}.qcow2"
    qemuimg.create_overlay(record.system_disk, record.files.root / top, depth=MAX_DEPTH)
    (record.files.root / top).chmod(0o600)
    record.overlays.append(top)
    record.save()


def tidy(record: Record, *, live: bool) -> None:
    """Fold the overlays no checkpoint needs into the ones above, delete the unreachable ones (session.chain)."""
    files = record.files
    have = listed(files)
    chains = [record.overlays, *(c.chain for c in have)]
    named = {record.overlays[-1], *(c.overlay for c in have)}
    p = chain.plan(chains, named, chain.present(files.root), live=live)
    if not p.folds and not p.dead:
        return
    chain.apply(files.root, chains, p)
    record.save()
    for c in have:
        c.write()


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
    with lock.held(files, name, "rolling back"), Hypervisor(record.libvirt_uri) as hv:
        record = Record.load(name)
        cp = find(files, name, label)
        if not record.keep or status(record, hv).state not in (State.RUNNING, State.STOPPED, State.EXITED):
            must_run(record, hv, "rolled back")
        g = lifecycle.gather(record, limit=limit)
        left = changes.pending(g)
        box = None
        if left:
            with ui.step(f"Keeping {len(left)} unsynced change(s) before the rollback"):
                box = outbox.export(g, box=outbox.fresh_box(files.rolled_back, label))
        control.stop(files)
        hv.destroy(record.domain)
        files.saved_memory.unlink(missing_ok=True)
        record.saved = False
        record.overlays = list(cp.chain)
        if is_remote(record.libvirt_uri):
            remotecheckpoint.rewind(record, hv, label, [c.chain for c in listed(files)])
        else:
            new_top(record)
            with ui.step("Restoring the workspace disk"):
                tmp = files.root / f".{paths.SESSION_WORKSPACE_DISK}.rollback"
                capture.copy_disk(cp.workspace, tmp)
                tmp.replace(files.workspace_disk)
            tidy(record, live=False)
        # the guest's journal went back in time with it: the next pull walks the tree once
        delta.forget(files.root)
        journal.cursor_file(files.root).unlink(missing_ok=True)
        record.unsynced = None
        record.save()
        try:
            suspend.resume(record, hv, _memory(record, cp), f"Restoring {record.domain} to checkpoint {label}")
        except BaseException:
            _leave_stopped(record, hv, _memory(record, cp))
            raise
    return Rolled(cp, box, len(left))


def remove(name: str, label: str) -> Checkpoint:
    record = Record.load(name)
    with lock.held(record.files, name, "removing a checkpoint"), Hypervisor(record.libvirt_uri) as hv:
        record = Record.load(name)
        cp = find(record.files, name, label)
        shutil.rmtree(cp.path)
        if is_remote(record.libvirt_uri):
            remotecheckpoint.drop(record, hv, label, [c.chain for c in listed(record.files)])
        else:  # a running VM reads every overlay of its chain: those are folded at the next checkpoint or rollback
            tidy(record, live=status(record, hv).state is not State.STOPPED)
    return cp
