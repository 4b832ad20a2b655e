"""The files a session's egress daemon shares with the commands that drive it, read and written in place.

The daemon parses what the guest sends, so it does not run as root: it opens these files while it still is,
becomes an account that owns nothing (egress.account.become) and from then on reaches them only through the
descriptors it holds. So they are never replaced by a rename (the new file would be one the daemon cannot
open): a writer rewrites one in place under an exclusive flock, a reader reads it under a shared one, and
neither ever sees half of the other's text.
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

_OPEN = os.O_NOFOLLOW | os.O_CLOEXEC


def rewrite(path: Path, text: str, *, mode: int = 0o600) -> None:
    """Replace the text of `path` (made with `mode` if there is none) in place."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | _OPEN, mode)
    try:
        Held(fd).write(text)
    finally:
        os.close(fd)


def read(path: Path) -> str:
    """The text of `path`, never half written (FileNotFoundError when there is none)."""
    fd = os.open(path, os.O_RDONLY | _OPEN)
    try:
        return Held(fd).text()
    finally:
        os.close(fd)


class Held:
    """One such file, open."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._lock = threading.Lock()  # flock excludes other processes: this, the holder's other threads

    @classmethod
    def open(cls, path: Path, *, writable: bool = False) -> Held:
        """Open `path` (a writable one is made, 0600, if there is none)."""
        flags = (os.O_RDWR | os.O_CREAT) if writable else os.O_RDONLY
        return cls(os.open(path, flags | _OPEN, 0o600))

    def text(self) -> str:
        with self._lock:
            return self._text()

    def _text(self) -> str:
        fcntl.flock(self.fd, fcntl.LOCK_SH)
        try:
            chunks, offset = [], 0
            while chunk := os.pread(self.fd, 1 << 16, offset):
                chunks.append(chunk)
                offset += len(chunk)
            return b"".join(chunks).decode()
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def write(self, text: str) -> None:
        with self._lock:
            self._write(text.encode())

    def _write(self, data: bytes) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            os.ftruncate(self.fd, 0)
            done = 0
            while done < len(data):
                done += os.pwrite(self.fd, data[done:], done)
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def version(self) -> tuple[int, int]:
        """Changes when the file is rewritten (its modification time and size)."""
        st = os.fstat(self.fd)
        return st.st_mtime_ns, st.st_size

    @property
    def removed(self) -> bool:
        """The file was deleted (its session removed): no name leads to it any more."""
        return os.fstat(self.fd).st_nlink == 0

    def close(self) -> None:
        os.close(self.fd)
