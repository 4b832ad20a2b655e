"""What a session is doing now, asked of libvirt (the source of truth for what runs) and of the record:
its state for `ls`, whether its VM runs, and the end of its serial console."""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmsandbox import paths, ui
from vmsandbox.egress import control
from vmsandbox.egress.control import Door
from vmsandbox.errors import VmsandboxError
from vmsandbox.session.place import choose, console
from vmsandbox.session.place.interface import VM, Host
from vmsandbox.session.record import Phase, Record, State, names
from vmsandbox.vm.memory.usage import Usage
from vmsandbox.vm.node import UnreachableError, gone


@dataclass(frozen=True)
class Status:
    record: Record
    state: State
    memory: Usage | None = None  # what its running VM takes of its machine now (None: not running, or not known)

    @property
    def door(self) -> Door:
        if self.state in (State.EXPORTED, State.STOPPED, State.EXITED, State.ENDING):
            return Door.STOPPED if self.record.wants_daemon else Door.OFF
        return control.status(self.record.files, wanted=self.record.wants_daemon)

    def as_dict(self) -> dict[str, Any]:
        r = self.record
        return {
            "name": r.name,
            "state": self.state.value,
            "host": r.host,
            "created": r.created,
            "age_seconds": round(time.time() - r.created),
            "project": r.project,
            "accel": r.accel,
            "ports": {"ssh": r.ssh_port},
            "cpus": r.cpus,
            "memory_mib": r.memory_mib,
            "image": r.image_version,
            "keep": r.keep,
            "domain": r.domain,
            "unsynced": r.unsynced,
            "network": r.network.value,
            "blueprint": r.blueprint,
            "publish": [p.as_dict() for p in r.publish],
            "egress": self.door.value,
            "start": r.start,
            "group": r.group,
            "forked_from": r.forked_from,
            "disk_bytes": disk_bytes(r),
            "memory": None if self.memory is None else self.memory.as_dict(),
        }


def disk_bytes(record: Record) -> int:
    """What the session holds on disk: its top-level files (overlays, workspace disk, saved memory) and its
    checkpoints, allocated."""
    total = 0
    for where in (record.files.root, record.files.checkpoints, *_subdirs(record.files.checkpoints)):
        try:
            for entry in os.scandir(where):
                if entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_blocks * 512
        except OSError:
            continue
    return total


def _subdirs(directory: Path) -> list[Path]:
    try:
        return [Path(e.path) for e in os.scandir(directory) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def status(vm: VM) -> Status:
    record = vm.record
    if record.ending is not None:
        return Status(record, State.ENDING)
    if record.exported:
        return Status(record, State.EXPORTED)
    if record.status is not Phase.READY and record.owner_alive():  # being made (its domain may not exist yet)
        return Status(record, State.BOOTING)
    info = vm.info()
    if info is None or gone(info):
        saved = record.saved and vm.saved.held()
        return Status(record, State.STOPPED if saved else State.EXITED)
    # orphaned: the command that made it died before it was ready, or the `run` it belongs to did
    orphaned = record.status is not Phase.READY or (not record.keep and not record.owner_alive())
    if orphaned:
        return Status(record, State.ORPHANED)
    return Status(record, State.PAUSED if info.state in ("paused", "suspended") else State.RUNNING)


def measured(found: Status, vm: VM) -> Status:
    """`found` with what its VM takes of its machine's memory now, when it runs (a listing shows it)."""
    if found.state not in (State.RUNNING, State.PAUSED, State.ORPHANED, State.BOOTING):
        return found
    return dataclasses.replace(found, memory=vm.memory_use())


@dataclass(frozen=True)
class Damaged:
    """A session whose record cannot be read: listed, never hidden (`destroy NAME --discard` removes it)."""

    name: str
    problem: str
    hint: str | None

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "state": "damaged", "problem": self.problem, "hint": self.hint}


def all_status(uri: str) -> list[Status]:
    return listing(uri)[0]


def listing(uri: str) -> tuple[list[Status], list[Damaged]]:
    """Every session's status: this machine's asked of `uri`, another host's of its own. Without libvirt (or
    a host that does not answer), the sessions are still listed (state `unknown`), with a warning that says
    how to bring libvirt back. Sessions whose record is damaged come second, each said in a warning."""
    silent: set[str] = set()  # the hosts that did not answer (said once)

    def connected(asked: choose.Hosts, record: Record) -> VM | None:
        there = asked.of(record)
        if there.spec.uri in silent:
            return None
        try:
            there.libvirt()
        except UnreachableError as exc:
            said = f"{exc.message}{where(there)}"
            ui.warn(f"{said}: session states are unknown ({exc.hint})" if exc.hint else said)
            silent.add(there.spec.uri)
            return None
        return there.vm(record)

    found: list[Status] = []
    damaged: list[Damaged] = []
    with choose.hosts(uri) as asked:
        for name in names():
            try:
                record = Record.load(name)
                vm = connected(asked, record)
                found.append(measured(status(vm), vm) if vm is not None else Status(record, State.UNKNOWN))
            except VmsandboxError as exc:  # a damaged session is never hidden (one being made is skipped)
                if paths.session_paths(name).record.exists():
                    ui.warn(f"{exc.message} ({exc.hint})" if exc.hint else exc.message)
                    damaged.append(Damaged(name, exc.message, exc.hint))
    return found, damaged


def memory_use(record: Record) -> dict[str, int] | None:
    """What the session's running VM takes of its machine's memory now, shared and private (None: it does not
    run, or its place cannot tell)."""
    with choose.vm_of(record) as vm:
        used = vm.memory_use()
    return None if used is None else used.as_dict()


def where(host: Host) -> str:
    """Words for messages about a session there: "" for this machine, " on host NAME" for another."""
    return f" on host {host.spec.name}" if host.abilities.elsewhere else ""


def down(vm: VM) -> str | None:
    """None while the VM runs, else why it stopped, in words (for ssh.wait_for_banner's `alive`)."""
    return "the VM powered off or crashed" if gone(vm.info()) else None


def runs(vm: VM) -> bool:
    info = vm.info()
    return info is not None and info.state == "running"


def is_running(record: Record) -> bool:
    with choose.vm_of(record) as vm:
        return runs(vm)


def stops_within(record: Record, *, seconds: float) -> bool:
    """Whether the VM stops (or is already gone) within `seconds`: tells a guest shutting itself down
    from a dropped connection."""
    deadline = time.monotonic() + seconds
    with choose.vm_of(record) as vm:
        while True:
            if gone(vm.info()):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.5)


def console_tail(name: str, lines: int = console.CONSOLE_TAIL_LINES) -> str:
    return console.tail_of(paths.session_paths(name).console_log, lines)


def refresh_console(record: Record, *, follow: bool) -> None:
    """The session's console log here brought up to date (with `follow`, kept so while the command runs)."""
    with choose.vm_of(record) as vm:
        vm.console(follow=follow)


def usable(record: Record) -> str | None:
    """Raise (with the fix) unless the session's VM can take a command. Why its egress daemon must be started
    again (create.open_egress), so that the guest has a network (control.needs_restart), or None."""
    try:
        with choose.vm_of(record) as vm:
            current = status(vm).state
            if current is State.RUNNING:
                vm.reach(answering=True)
    except UnreachableError as exc:  # QEMU runs on without libvirtd: the guest may well answer
        if record.exported or record.status is not Phase.READY:
            raise
        ui.warn(f"{exc.message}; trying session {record.name} anyway")
        current = State.RUNNING
    if current is State.EXPORTED:
        raise VmsandboxError(
            f"session {record.name} has no VM any more; its unsynced changes wait in its outbox",
            hint=f"review them with `vmsandbox pull {record.name}`",
        )
    if current is State.STOPPED:
        raise VmsandboxError(
            f"session {record.name} is stopped", hint=f"resume it with `vmsandbox start {record.name}`"
        )
    if current in (State.EXITED, State.BOOTING, State.ENDING):
        raise VmsandboxError(
            f"session {record.name} is {current}",
            hint=f"see `vmsandbox logs {record.name}`; `vmsandbox pull {record.name}` reviews its changes, "
            f"`vmsandbox rm {record.name}` removes it",
        )
    return control.needs_restart(record.files, wanted=record.wants_daemon)
