"""One name in a directory, reached from the directory's descriptor and never through a link: a regular file
opened, its content read to a bound, a new version made beside it and renamed over it. The steps beneath.Root
takes at the end of a walk, and what a reader that holds a directory's descriptor already takes alone."""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # (a FIFO put there never blocks the open)
CHUNK = 1 << 20
TEMPORARY = ".vmsandbox-tmp-"  # what a file is made as beside its name, before it is renamed over it


def regular_at(dir_fd: int | None, name: str | Path, st: os.stat_result | None = None) -> int | None:
    """A descriptor of the regular file `name` in the directory dir_fd, never through a link; None when it is not
    a regular file any more (or not the one `st` describes)."""
    try:
        fd = os.open(name, FILE_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None
    now = os.fstat(fd)
    if not stat.S_ISREG(now.st_mode) or (st is not None and (now.st_ino, now.st_dev) != (st.st_ino, st.st_dev)):
        os.close(fd)
        return None
    return fd


def read_at_most(fd: int, limit: int) -> bytes | None:
    """The whole content of fd if it is at most `limit` bytes, else None (never reads much more)."""
    if os.fstat(fd).st_size > limit:
        return None
    data = bytearray()
    while len(data) <= limit and (chunk := os.read(fd, min(CHUNK, limit + 1 - len(data)))):
        data += chunk
    return None if len(data) > limit else bytes(data)


def replace_at(dir_fd: int, name: str, make: Callable[[int, str], None], *, temporary: str = TEMPORARY) -> None:
    """Make the new version of `name` under a temporary name beside it (`make(dir_fd, temporary_name)`), then
    rename it over name: a reader sees the old version until the rename, the new one after it. The temporary is
    removed if anything fails."""
    tmp = f"{temporary}{secrets.token_hex(6)}"
    try:
        make(dir_fd, tmp)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
