"""Writing guest changes into the host project, treating every path and byte from the guest as hostile.

- nothing is written outside the project root, and no existing symlink on the host is followed: every
  parent directory is checked with lstat, files are opened with O_NOFOLLOW;
- symlinks whose target leaves the tree, FIFOs, sockets and devices are never created (review.py marks them);
- setuid/setgid/sticky bits are dropped; files land owned by the invoking user;
- each file is written to a temporary file in its directory and renamed into place, so an interrupted pull
  leaves every file either old or new, and running it again finishes the job;
- the host entry is checked again just before each write: if the host changed it meanwhile, it is a conflict.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vmsandbox import tree
from vmsandbox.errors import VmsandboxError
from vmsandbox.review import Change
from vmsandbox.tree import DIR, FILE, SYMLINK

TMP_PREFIX = ".vmsandbox-tmp-"


@dataclass(frozen=True)
class Owner:
    uid: int
    gid: int


class UnsafePathError(VmsandboxError):
    pass


def _parent_fd(root: Path, rel: str, owner: Owner, *, create: bool) -> int:
    """An fd of the directory that will hold `rel`, reached without following any symlink."""
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts) or rel.startswith("/"):
        raise UnsafePathError(f"refusing the path {rel!r}")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(part, 0o755, dir_fd=fd)
                os.chown(part, owner.uid, owner.gid, dir_fd=fd, follow_symlinks=False)
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:  # ELOOP/ENOTDIR: a symlink or a file where a directory should be
                raise UnsafePathError(f"refusing to write below {part!r} in {rel!r}: not a real directory") from exc
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_nofollow(root: Path, rel: str) -> bytes | None:
    """The content of the regular file root/rel, reached without following any symlink (None otherwise)."""
    try:
        fd = _parent_fd(root, rel, Owner(-1, -1), create=False)
    except (OSError, UnsafePathError):
        return None
    try:
        f = os.open(rel.rsplit("/", 1)[-1], os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    with os.fdopen(f, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return None
        return fh.read()


def read_verified(source: Path, rel: str, expected: tree.Entry) -> bytes:
    data = read_nofollow(source, rel)
    if data is None or hashlib.sha256(data).hexdigest() != expected.digest:
        raise VmsandboxError(f"{rel} changed in the guest copy while it was being applied; run the pull again")
    return data


def _current(root: Path, rel: str) -> tree.Entry | None:
    try:
        fd = _parent_fd(root, rel, Owner(-1, -1), create=False)
    except (FileNotFoundError, UnsafePathError):
        return None
    try:
        name = rel.rsplit("/", 1)[-1]
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if stat.S_ISREG(st.st_mode):
            f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
            with os.fdopen(f, "rb") as fh:
                digest = hashlib.sha256(fh.read()).hexdigest()
            return tree.Entry(FILE, stat.S_IMODE(st.st_mode), st.st_size, digest=digest)
        if stat.S_ISLNK(st.st_mode):
            return tree.Entry(SYMLINK, 0o777, st.st_size, target=os.readlink(name, dir_fd=fd))
        if stat.S_ISDIR(st.st_mode):
            return tree.Entry(DIR, stat.S_IMODE(st.st_mode))
        return tree.Entry(tree.OTHER, stat.S_IMODE(st.st_mode))
    finally:
        os.close(fd)


def _remove(fd: int, name: str, entry: tree.Entry) -> None:
    if entry.kind == DIR:
        os.rmdir(name, dir_fd=fd)
    else:
        os.unlink(name, dir_fd=fd)


def _place(root: Path, rel: str, owner: Owner, make: Callable[[int, str], None]) -> None:
    """Make the new version of root/rel under a temporary name in its directory (`make(dir_fd, name)`), then
    rename it into place: readers see the old version until the rename and the new one after it."""
    fd = _parent_fd(root, rel, owner, create=True)
    tmp = f"{TMP_PREFIX}{secrets.token_hex(6)}"
    try:
        make(fd, tmp)
        os.rename(tmp, rel.rsplit("/", 1)[-1], src_dir_fd=fd, dst_dir_fd=fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=fd)
        raise
    finally:
        os.close(fd)


def write_file(root: Path, rel: str, data: bytes, mode: int, owner: Owner) -> None:
    """Atomically put `data` at root/rel, fsynced, with `mode` (no setuid/setgid/sticky) and `owner`."""

    def make(fd: int, tmp: str) -> None:
        f = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=fd)
        try:
            with os.fdopen(f, "wb", closefd=False) as fh:
                fh.write(data)
            os.fchown(f, owner.uid, owner.gid)
            os.fchmod(f, mode & 0o777)
            os.fsync(f)
        finally:
            os.close(f)

    _place(root, rel, owner, make)


def _write_symlink(root: Path, rel: str, target: str, owner: Owner) -> None:
    def make(fd: int, tmp: str) -> None:
        os.symlink(target, tmp, dir_fd=fd)
        os.chown(tmp, owner.uid, owner.gid, dir_fd=fd, follow_symlinks=False)

    _place(root, rel, owner, make)


def _make_dir(root: Path, rel: str, mode: int, owner: Owner) -> None:
    fd = _parent_fd(root, rel, owner, create=True)
    name = rel.rsplit("/", 1)[-1]
    try:
        try:
            os.mkdir(name, 0o700, dir_fd=fd)
            os.chown(name, owner.uid, owner.gid, dir_fd=fd, follow_symlinks=False)
        except FileExistsError:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                raise UnsafePathError(f"{rel} exists and is not a directory") from None
        os.chmod(name, mode & 0o777, dir_fd=fd)
    finally:
        os.close(fd)


def apply_one(root: Path, source: Path, change: Change, owner: Owner) -> None:
    """Apply one change whose host side is still what the review saw (else: a conflict error)."""
    now = _current(root, change.path)
    expected = change.host
    if not (
        (now is None and expected is None)
        or (now is not None and now.same(expected))
        or (now is not None and expected is not None and now.kind == expected.kind == DIR)
    ):
        raise VmsandboxError(f"{change.path} changed on the host since the review; left as it is")
    guest = change.guest
    if now is not None and (guest is None or guest.kind != now.kind):
        fd = _parent_fd(root, change.path, owner, create=False)
        try:
            _remove(fd, change.path.rsplit("/", 1)[-1], now)
        except OSError as exc:
            raise VmsandboxError(f"cannot remove {change.path}: {exc.strerror}") from exc
        finally:
            os.close(fd)
    if guest is None:
        return
    if guest.kind == DIR:
        _make_dir(root, change.path, guest.mode, owner)
    elif guest.kind == FILE:
        write_file(root, change.path, read_verified(source, change.path, guest), guest.mode, owner)
    elif guest.kind == SYMLINK and guest.target is not None:
        _write_symlink(root, change.path, guest.target, owner)


def order(changes: list[Change]) -> list[Change]:
    """Deletions deepest first, then directories shallow first, then everything else."""
    deletions = sorted((c for c in changes if c.guest is None), key=lambda c: -c.path.count("/"))
    dirs = sorted((c for c in changes if c.guest is not None and c.guest.kind == DIR), key=lambda c: c.path.count("/"))
    rest = [c for c in changes if c.guest is not None and c.guest.kind != DIR]
    return deletions + dirs + rest
