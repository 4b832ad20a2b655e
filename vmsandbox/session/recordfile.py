"""The file a session's record is kept in (session.json; record.py says what it holds): read never through a
link and bounded, its copy beside it, and one save at a time."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from vmsandbox import filewrite, paths
from vmsandbox.errors import VmsandboxError

MAX_RECORD_BYTES = 1024**2
SAVE_LOCK = "session.json.lock"
SAVE_WAIT = 30.0  # seconds a save waits for another (each holds it for a read and a write)


def read_text(path: Path) -> str:
    """A record file's text, never through a symlink, and bounded."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_RECORD_BYTES + 1)
    if len(data) > MAX_RECORD_BYTES:
        raise ValueError(f"the record is larger than {MAX_RECORD_BYTES} bytes")
    return data.decode()


def copy_of(record_file: Path) -> Path:
    """The record's copy beside it (written after it at each save: one of the two is whole)."""
    return record_file.with_name(record_file.name + ".copy")


@contextlib.contextmanager
def saving(files: paths.SessionPaths, name: str) -> Iterator[None]:
    """One save at a time of a session's record (an flock on a file of its own beside it, held for a read and a
    write: waited for SAVE_WAIT seconds at most, should its holder be stopped)."""
    fd = os.open(files.root / SAVE_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        if not filewrite.locked_within(fd, SAVE_WAIT, poll=0.01):
            raise VmsandboxError(
                f"the record of session {name} was held by another command for {SAVE_WAIT:.0f} s",
                hint="a vmsandbox command stopped (Ctrl-Z) while it saved? `fg` it, then run this again",
            )
        yield
    finally:
        os.close(fd)
