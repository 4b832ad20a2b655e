"""Writing files of ours safely: made ours before another program writes into them, or replaced whole in one
rename (a reader, or a crash, sees the old content or the new, never a part); one writer at a time, by an flock
waited for a bounded while."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path


def own_file(path: Path, *, truncate: bool = False) -> None:
    """Make `path` ours (0600) before root writes into it: virtlogd a VM's serial console, libvirtd a saved
    memory file. A file they made would be root's, 0600, which an unprivileged owner could not read back."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_TRUNC if truncate else 0)
    os.close(os.open(path, flags, 0o600))


def write_atomically(path: Path, text: str | bytes, *, mode: int = 0o600) -> None:
    """Write text through a temporary file beside path and one rename: a reader (or a crash) sees the old
    content or the new, never a part of it. `mode` is the new file's, whatever the umask (vmsandbox runs under
    077): private by default; 0o644 for what other accounts read (a template's metadata)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as f:
            f.write(text)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def locked_within(fd: int, seconds: float | None, *, poll: float = 0.1) -> bool:
    """An exclusive flock on `fd`, taken within `seconds` (None: however long it takes; 0: one try). False: another
    held it all that while."""
    deadline = None if seconds is None else time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(poll)
        else:
            return True
