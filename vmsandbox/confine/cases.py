"""Whether names in a directory compare case-insensitively, as the file system it is on compares them: ext4's (or
f2fs's) casefold flag, or — on a file system without the flag (CIFS, a Mac's volume over a share, vfat) — a name
found again under its other case, as the same file.

Only names of ASCII letters are asked: every folding file system folds `a` and `A` alike, whoever chose the name.
Other letters fold differently from one file system to the next (NTFS keeps `ß` and `SS` apart, Python's fold
does not), so a name a guest landed, such as `0ß`, could otherwise make a folding file system answer no.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import struct
from pathlib import Path

from vmsandbox.errors import VmsandboxError

FS_IOC_GETFLAGS = 0x80086601  # the inode flags of ext4, f2fs, tmpfs (`lsattr`)
FS_CASEFOLD_FL = 0x40000000  # `chattr +F`: names in this directory compare case-insensitively
PROBED = 64  # entries of the top looked at for a name to ask under its other case
MADE = ".vmsandbox-tmp-case-"  # a name made to be asked, when the top has none (removed at once)


def folds(fd: int, path: Path) -> bool:
    """Whether names beneath the directory fd (`path`: its name, for its parent and messages) compare
    case-insensitively: its casefold flag; else one of its names of ASCII letters (among its first PROBED) asked
    under its other case; else its own name in its parent (on the same file system); else a name made in it for
    the question and removed. (A folding directory below a top that does not fold is not seen: ext4 sets the flag
    on empty directories only, and subdirectories inherit it.)"""
    try:
        flags = struct.unpack("i", fcntl.ioctl(fd, FS_IOC_GETFLAGS, bytes(8))[:4])[0]
    except OSError:
        flags = 0
    if flags & FS_CASEFOLD_FL:
        return True
    said = _a_name_folds(fd)
    if said is None:
        said = _own_name_folds(fd, path)
    return _made_name_folds(fd, path) if said is None else said


def _a_name_folds(fd: int) -> bool | None:
    with os.scandir(fd) as listed:
        for n, entry in enumerate(listed):
            if n >= PROBED:
                break
            if _cased(entry.name):
                return _same(fd, entry.name, entry.name.swapcase())
    return None


def _own_name_folds(fd: int, path: Path) -> bool | None:
    name = path.name
    if not _cased(name):
        return None
    try:
        parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if os.fstat(parent).st_dev != os.fstat(fd).st_dev:
            return None
        return _same(parent, name, name.swapcase())
    finally:
        os.close(parent)


def _made_name_folds(fd: int, path: Path) -> bool:
    name = f"{MADE}{secrets.token_hex(6)}"
    try:
        os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd))
    except OSError as exc:
        raise VmsandboxError(
            f"cannot tell whether names in {path} compare case-insensitively: no name there to ask, and none can be "
            f"made ({exc.strerror})",
            hint=f"make {path} writable for you, or put a file whose name has a letter in it, then try again",
        ) from None
    try:
        return _same(fd, name, name.swapcase())
    finally:
        os.unlink(name, dir_fd=fd)


def _cased(name: str) -> bool:
    """A name of ASCII only, with a letter: every folding file system folds its other case to it."""
    return name.isascii() and name.swapcase() != name


def _same(dir_fd: int, name: str, other: str) -> bool:
    """Whether `other` (the name in another case) is the very file `name` is."""
    try:
        one = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        two = os.stat(other, dir_fd=dir_fd, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.EILSEQ, errno.EINVAL, errno.ENAMETOOLONG):
            raise
        return False
    return (one.st_dev, one.st_ino) == (two.st_dev, two.st_ino)
