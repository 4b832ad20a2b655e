"""One vmsandbox at a time on a session's files. `pull`, `recover`, `push`, `destroy`, `gc` and the end of
`run` hold the session's lock (an flock, which the kernel drops when its holder dies, even by SIGKILL: a
killed command never leaves a stale lock). A second command is told who holds it instead of interleaving
with it: two pulls would otherwise race to write the same files, and a destroy would pull the VM away from
under a pull."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator

from vmsandbox.errors import VmsandboxError
from vmsandbox.paths import SessionPaths

LOCK_FILE = "session.lock"


class BusyError(VmsandboxError):
    pass


@contextlib.contextmanager
def held(files: SessionPaths, name: str, doing: str) -> Iterator[None]:
    """Hold session `name`'s lock while `doing` (e.g. "pulling"); BusyError at once if another holds it."""
    try:
        fd = os.open(files.root / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileNotFoundError:
        raise VmsandboxError(f"no session named {name!r}", hint="list sessions with `vmsandbox ls`") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip()
            raise BusyError(
                f"session {name} is busy: {holder or 'another vmsandbox command is using it'}",
                hint="wait for that command to finish, then run this one again",
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"vmsandbox (pid {os.getpid()}) is {doing} it".encode(), 0)
        yield
    finally:
        os.close(fd)
