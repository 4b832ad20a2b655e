"""`vmsandbox rm --stale`: sessions whose VM is gone or whose `run` died are removed — unless they may hold unsynced
work (then kept, a stopped VM's work exported to its outbox) —, teardowns that were interrupted are finished,
and what is left of sessions whose directory is gone (domains, reader VMs, pins, volumes on other hosts, the
captures of killed fan-outs) is swept. With `dry`, each line says what it would do, and nothing is done.
"""

from __future__ import annotations

import functools
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from vmsandbox import paths
from vmsandbox.errors import VmsandboxError
from vmsandbox.session import lock
from vmsandbox.session.end import diskreader, lifecycle
from vmsandbox.session.place import choose, hostspec, pins
from vmsandbox.session.place.hostspec import HostSpec
from vmsandbox.session.place.interface import Tidy
from vmsandbox.session.record import Phase, Record, State, names
from vmsandbox.session.state import status
from vmsandbox.sync.land import outbox
from vmsandbox.vm.node import UnreachableError

STALE_CAPTURE_SECONDS = 3600  # a fan-out copies its capture as its sessions start: one this old is left over
PAST = {"remove": "removed", "destroy": "destroyed", "finish": "finished", "delete": "deleted", "stop": "stopped"}


@dataclass(frozen=True)
class Tidier:
    """gc's Tidy (place.interface): does what it finds to do and says so, or in a dry run (`gc --dry-run`) only
    says what it would do."""

    dry: bool = False

    def __call__(self, verb: str, what: str, do: Callable[[], object]) -> str:
        if self.dry:
            return f"would {verb} {what}"
        do()
        return f"{PAST[verb]} {what}"


def gc(uri: str, *, limit: int, hosts: tuple[HostSpec, ...] = (), dry: bool = False) -> Iterator[str]:
    """Yields a line per thing done (with `dry`, per thing it would do)."""
    mine = paths.sessions_dir().resolve()
    tidy = Tidier(dry=dry)
    everywhere = hostspec.every(uri, hosts)  # this machine first
    with choose.hosts(uri, everywhere) as asked:  # each host connected once, at its first question
        here = asked.at(everywhere[0])
        here.libvirt()  # fails early, before anything is done, if this machine's libvirt is down
        for name in names():
            yield from _session(name, asked, uri, limit, tidy)
        yield from diskreader.sweep(mine, here.libvirt(), tidy)
        for session in pins.collect(dry=dry):
            yield f"{'would remove' if dry else 'removed'} the pin of session {session} (its directory is gone)"
        for spec in everywhere:
            yield from asked.at(spec).sweep(mine, tidy)
    yield from _stale_captures(mine, tidy)


def _session(name: str, asked: choose.Hosts, uri: str, limit: int, tidy: Tidy) -> Iterator[str]:
    """gc of one session: removed if its VM is gone or its `run` died, unless it holds work."""
    files = paths.session_paths(name)
    try:
        record = Record.load(name)
    except VmsandboxError as exc:
        if files.workspace_disk.exists():  # it may hold the guest's work: a person decides
            yield f"kept damaged session {name}: {exc.message}; `vmsandbox rm {name} --discard` removes it"
        elif time.time() - files.root.stat().st_mtime > 60:  # not one being created right now
            what = f"damaged session directory {files.root}"
            yield tidy("remove", what, lambda: lifecycle.remove_damaged(name, uri))
        return
    try:
        state = status(asked.vm(record)).state
    except UnreachableError as exc:  # another host that does not answer: its sessions wait for it
        yield f"skipped session {name}: host {record.host} does not answer ({exc.message})"
        return
    if state not in (State.EXITED, State.ORPHANED, State.ENDING):
        return
    if tidy.dry:  # what a gc would do, said without the lock and without reading the guest's changes
        yield _would_collect(record, state)
        return
    try:
        with lock.held(files, name, "cleaning up"):
            record = Record.load(name)  # read again, and its state looked at again: while gc waited for the
            state = status(asked.vm(record)).state  # lock, a `start` may have booted it or a teardown ended it
            if state in (State.EXITED, State.ORPHANED, State.ENDING):
                yield _collect(record, state, limit)
    except lock.BusyError as exc:
        yield f"skipped {exc.message}"
    except lock.GoneError:  # it ended meanwhile (its teardown finished)
        return
    except VmsandboxError as exc:  # one session's trouble never stops the clean-up of the others
        yield f"could not check session {name}: {exc.message}"


def _may_hold_work(record: Record) -> bool:
    """A session that never got ready never ran a command: nothing in it is anyone's work."""
    return record.status is Phase.READY and record.files.baseline_manifest.exists()


def _collect(record: Record, state: State, limit: int) -> str:
    """gc of one stopped, orphaned or ending session (its lock held): what was done."""
    if record.ending is not None:  # its background teardown was interrupted: finish it
        lifecycle.end_now(record)
        return f"finished the teardown of session {record.name}"
    kept = _keeps_work(record, state, limit) if _may_hold_work(record) else None
    if kept is not None:
        return f"kept session {record.name} ({state}): {kept}"
    lifecycle.remove(record)
    return f"removed session {record.name} ({state})"


def _would_collect(record: Record, state: State) -> str:
    """What `_collect` would do, said from the record alone (the guest's changes are not read)."""
    if record.ending is not None:
        return f"would finish the teardown of session {record.name}"
    if _may_hold_work(record) and record.unsynced != 0:
        known = "" if record.unsynced is None else f", {record.unsynced} at the last count"
        return f"would keep session {record.name} ({state}) if it holds unsynced changes{known}, else remove it"
    return f"would remove session {record.name} ({state})"


def _keeps_work(record: Record, state: State, limit: int) -> str | None:
    """Why gc keeps this session (its unsynced changes), or None."""
    g, left = lifecycle.pending(record, limit)
    if not left:
        return None
    if state is State.EXITED and not record.exported:
        outbox.export(g)
        lifecycle.retire(record)
    return f"{len(left)} unsynced change(s); `vmsandbox pull {record.name}` reviews them"


def _stale_captures(sessions: Path, tidy: Tidy) -> Iterator[str]:
    """The captures of fan-outs killed before they cleaned up."""
    for staging in sessions.glob(paths.FANOUT_CAPTURE_PREFIX + "*"):
        if time.time() - staging.stat().st_mtime > STALE_CAPTURE_SECONDS:
            what = f"{staging} (the capture of a fan-out that did not finish)"
            yield tidy("remove", what, functools.partial(shutil.rmtree, staging, ignore_errors=True))
