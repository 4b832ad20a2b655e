"""One vmsandbox at a time on a session's files. `pull`, `recover`, `push`, `destroy`, `gc`, checkpoints, forks,
`stop`, `start`, the end of `run` and its background teardown hold the session's lock (an flock, which the kernel
drops when its holder dies, even by SIGKILL: a killed command never leaves a stale lock). A second command is told
who holds it instead of interleaving with it: two pulls would otherwise race to write the same files, and a
destroy would pull the VM away from under a pull. Only a teardown is waited for: it is short, and it is how `run`
ends.

Whoever holds the lock reads the session's record again inside it: the holder before may have changed it. A
record's save writes only what it changed (session.record), so a command that changes a field of a session
without its lock (`port publish` its ports) loses nothing to one that holds it, nor it to that one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator

from vmsandbox import ui
from vmsandbox.errors import VmsandboxError
from vmsandbox.paths import SessionPaths

LOCK_FILE = "session.lock"
TEARDOWN = "tearing down"
TEARDOWN_WAIT = 120.0  # seconds a command waits for a teardown before it says the session is busy


class BusyError(VmsandboxError):
    pass


class GoneError(VmsandboxError):
    """The session ended (its directory went) before or while its lock was waited for."""


@contextlib.contextmanager
def held(files: SessionPaths, name: str, doing: str, *, wait: bool = False, never_wait: bool = False) -> Iterator[None]:
    """Hold session `name`'s lock while `doing` (e.g. "pulling"). Another holder: BusyError at once, but a
    teardown is waited for (and with `wait`, any holder; with `never_wait`, none)."""
    gone = GoneError(f"no session named {name!r} (any more)", hint="list sessions with `vmsandbox ls`")
    try:
        fd = os.open(files.root / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileNotFoundError:
        raise gone from None
    try:
        if not _take(fd):
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip()
            if never_wait or (not wait and TEARDOWN not in holder):
                raise BusyError(
                    f"session {name} is busy: {holder or 'another vmsandbox command is using it'}",
                    hint="wait for that command to finish, then run this one again",
                )
            if not wait:
                ui.info(f"Waiting for the VM of session {name} to be destroyed…")
            _wait(fd, name, holder, None if wait else TEARDOWN_WAIT)
        if not files.record.exists():
            raise gone
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"vmsandbox (pid {os.getpid()}) is {doing} it".encode(), 0)
        yield
    finally:
        os.close(fd)


def _take(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _wait(fd: int, name: str, holder: str, timeout: float | None) -> None:
    deadline = None if timeout is None else time.monotonic() + timeout
    while not _take(fd):
        if deadline is not None and time.monotonic() > deadline:
            raise BusyError(f"session {name} is still busy: {holder}", hint="run this again in a moment")
        time.sleep(0.1)
