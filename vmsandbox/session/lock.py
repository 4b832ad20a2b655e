"""One vmsandbox at a time on a session's files. `pull`, `recover`, `push`, `destroy`, `gc`, checkpoints, forks,
`stop`, `start`, `port publish` and `port rm`, the end of `run` and its background teardown hold the session's lock
(an flock, which the kernel drops when its holder dies, even by SIGKILL: a killed command never leaves a stale
lock). A second command is told who holds it instead of interleaving with it: two pulls would otherwise race to
write the same files, and a destroy would pull the VM away from under a pull. A teardown is waited for (it is
short, and it is how `run` ends), and a command with patience (a port's change) waits a while for any holder.

Whoever holds the lock reads the session's record again inside it: the holder before may have changed it. A
record's save writes only what that command changed (session.record), so one that saves without the lock
(a fork's new record, a tunnel's port) loses nothing to one that holds it, nor it to that one.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from vmsandbox import filewrite, ui
from vmsandbox.errors import VmsandboxError
from vmsandbox.paths import SessionPaths

LOCK_FILE = "session.lock"
TEARDOWN = "tearing down"
REVIEWING = "reviewing the changes of"  # a review: a person decides, and the page of it may publish a port
TEARDOWN_WAIT = 120.0  # seconds a command waits for a teardown before it says the session is busy
PATIENCE = 60.0  # seconds a short change (a port, the egress daemon started again) waits for another command
_HELD: dict[Path, str] = {}  # the sessions whose lock this process holds (their directories), and for what


class BusyError(VmsandboxError):
    pass


class GoneError(VmsandboxError):
    """The session ended (its directory went) before or while its lock was waited for."""


def briefly(files: SessionPaths, name: str, doing: str) -> contextlib.AbstractContextManager[None]:
    """The lock for a short change another command's work must not meet halfway (a port, the egress daemon
    started again): another holder is waited for PATIENCE seconds, and a review in this very process (whose page
    publishes a port) lets it through."""
    return held(files, name, doing, patience=PATIENCE, beside=REVIEWING)


@contextlib.contextmanager
def held(
    files: SessionPaths,
    name: str,
    doing: str,
    *,
    wait: bool = False,
    never_wait: bool = False,
    patience: float = 0.0,
    beside: str | None = None,
) -> Iterator[None]:
    """Hold session `name`'s lock while `doing` (e.g. "pulling"). Another holder: BusyError at once, but a
    teardown is waited for (and with `wait`, any holder; with `patience`, any holder for that many seconds; with
    `never_wait`, none). With `beside`, a holder in this very process `beside` that (a review, whose page publishes
    a port) lets this command go on under its lock."""
    gone = GoneError(f"no session named {name!r} (any more)", hint="list sessions with `vmsandbox ls`")
    if beside is not None and _HELD.get(files.root) == beside:
        yield
        return
    try:
        fd = os.open(files.root / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileNotFoundError:
        raise gone from None
    try:
        if not _take(fd):
            holder = _holder(fd)
            teardown = TEARDOWN in holder
            if never_wait or (not wait and not teardown and patience <= 0):
                raise BusyError(
                    f"session {name} is busy: {holder}", hint="wait for that command to finish, then run this one again"
                )
            if teardown and not wait:
                ui.info(f"Waiting for the VM of session {name} to be destroyed…")
            elif not wait:
                ui.info(f"Waiting for session {name}: {holder}…")
            _wait(fd, name, None if wait else TEARDOWN_WAIT if teardown else patience)
        if not files.record.exists():
            raise gone
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"vmsandbox (pid {os.getpid()}) is {doing} it".encode(), 0)
        _HELD[files.root] = doing
        try:
            yield
        finally:
            _HELD.pop(files.root, None)
    finally:
        os.close(fd)


def _holder(fd: int) -> str:
    """Who holds the lock, in words (as the holder wrote it)."""
    return os.pread(fd, 200, 0).decode(errors="replace").strip() or "another vmsandbox command is using it"


def _take(fd: int) -> bool:
    return filewrite.locked_within(fd, 0)


def _wait(fd: int, name: str, timeout: float | None) -> None:
    if not filewrite.locked_within(fd, timeout):
        raise BusyError(f"session {name} is still busy: {_holder(fd)}", hint="run this again in a moment")
