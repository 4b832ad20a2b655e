"""Writing guest changes into the host project, treating every path and byte from the guest as hostile.

- nothing is written outside the project root, and no existing symlink on the host is followed: every
  parent directory is checked with lstat, files are opened with O_NOFOLLOW;
- symlinks whose target leaves the tree, FIFOs, sockets and devices are never created (review.py marks them);
- only the carried permission bits land (manifest.CARRIED: no setuid/setgid/sticky, nothing world-writable), and a
  directory always with its owner's rwx (manifest.landed_mode: one its owner cannot list would hide what is in it from
  later reviews); files land owned by the invoking user;
- each file is streamed (never held in memory whole) into a temporary file in its directory, its hash checked
  against what the review showed, fsynced and renamed into place, so an interrupted pull leaves every file
  either old or new, and running it again finishes the job; runs of zeros become holes (sparse stays sparse);
- the host entry is checked again just before each write: if the host changed it meanwhile, it is a conflict.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vmsandbox import failpoint
from vmsandbox.confine import atfd, beneath
from vmsandbox.errors import VmsandboxError
from vmsandbox.sync.review.threeway import Change
from vmsandbox.sync.tree import manifest
from vmsandbox.sync.tree.manifest import DIR, FILE, SYMLINK

TMP_PREFIX = ".vmsandbox-tmp-"
HOLE_BLOCK = 64 * 1024  # a block of zeros this long is not written but skipped (a hole)


@dataclass(frozen=True)
class Owner:
    uid: int
    gid: int


class UnsafePathError(VmsandboxError):
    pass


def _made(owner: Owner) -> beneath.EachDir:
    """What a directory the write makes on its way gets: the owner, and 0755 (made 0700 until then)."""

    def each(fd: int, made: bool) -> None:
        if made:
            os.fchown(fd, owner.uid, owner.gid)
            os.fchmod(fd, 0o755)

    return each


def _parent_fd(root: Path, rel: str, owner: Owner, *, create: bool) -> int:
    """An fd of the directory that will hold `rel`, reached beneath root (confine.beneath: no link followed, no
    `..`); with `create`, the missing directories on the way are made, owned by `owner`."""
    with beneath.Root.open(root) as top:
        try:
            fd, _name = top.parent(rel, mode=0o700 if create else None, each=_made(owner) if create else None)
        except beneath.Outside:
            raise UnsafePathError(f"refusing the path {rel!r}") from None
        except FileNotFoundError:
            raise
        except OSError as exc:  # ELOOP/ENOTDIR: a symlink or a file where a directory should be
            below = (exc.filename or "").rpartition("/")[2]
            raise UnsafePathError(f"refusing to write below {below!r} in {rel!r}: not a real directory") from exc
    return fd


def open_nofollow(root: Path, rel: str) -> int | None:
    """An fd of the regular file root/rel, reached beneath root without following any symlink (None otherwise)."""
    with beneath.Root.open(root) as top:
        return top.open_regular(rel)


def read_nofollow(root: Path, rel: str, *, limit: int) -> bytes | None:
    """At most `limit` bytes of the regular file root/rel (None if it is not one, or is larger)."""
    with beneath.Root.open(root) as top:
        return top.read(rel, limit=limit)


class ChangedError(VmsandboxError):
    """A side of a change is no longer what the review showed."""


def read_as_reviewed(root: Path, rel: str, entry: manifest.Entry | None, *, limit: int) -> bytes | None:
    """The content of root/rel as the review saw it (`entry`: its content hash), at most `limit` bytes (None
    when larger, or not a file); b"" for no entry. ChangedError when the file there now holds other bytes: what
    is shown or applied is only ever what the review saw."""
    if entry is None:
        return b""
    data = read_nofollow(root, rel, limit=limit)
    if data is None or entry.digest is None:
        return None
    if hashlib.sha256(data).hexdigest() != entry.digest:
        raise ChangedError(f"{rel} changed since the review; look at it again")
    return data


def _current(root: Path, rel: str) -> manifest.Entry | None:
    try:
        fd = _parent_fd(root, rel, Owner(-1, -1), create=False)
    except (FileNotFoundError, UnsafePathError):
        return None
    try:
        return manifest.entry_at(fd, rel.rsplit("/", 1)[-1])
    finally:
        os.close(fd)


def _remove(fd: int, name: str, entry: manifest.Entry) -> None:
    if entry.kind == DIR:
        os.rmdir(name, dir_fd=fd)
    else:
        os.unlink(name, dir_fd=fd)


def _place(root: Path, rel: str, owner: Owner, make: Callable[[int, str], None]) -> None:
    """Make the new version of root/rel under a temporary name in its directory (`make(dir_fd, name)`), then
    rename it into place: readers see the old version until the rename and the new one after it."""
    fd = _parent_fd(root, rel, owner, create=True)
    try:
        atfd.replace_at(fd, rel.rsplit("/", 1)[-1], make, temporary=TMP_PREFIX)
    finally:
        os.close(fd)


def copy_sparse(src: int, dst: int) -> str:
    """Copy src into dst (both fds) in chunks: runs of zeros become holes. Returns the sha256 of the data."""
    h = hashlib.sha256()
    size = 0
    for data in manifest.chunks(src):
        failpoint.hit("apply.chunk")
        h.update(data)
        view = memoryview(data)
        for at in range(0, len(data), HOLE_BLOCK):
            block = view[at : at + HOLE_BLOCK]
            if block.tobytes().count(0) == len(block):
                os.lseek(dst, len(block), os.SEEK_CUR)
            else:
                written = 0
                while written < len(block):
                    written += os.write(dst, block[written:])
        size += len(data)
    os.ftruncate(dst, size)
    return h.hexdigest()


def write_from(root: Path, rel: str, src: int, digest: str | None, mode: int, owner: Owner) -> None:
    """Atomically put the content of fd `src` at root/rel, fsynced, with the carried bits of `mode`, owned by
    `owner`. With `digest`, the content must hash to it, or nothing is written (the source changed)."""

    def make(fd: int, tmp: str) -> None:
        f = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=fd)
        try:
            got = copy_sparse(src, f)
            if digest is not None and got != digest:
                raise ChangedError(f"{rel} changed since the review (its content is not what was shown); look again")
            os.fchown(f, owner.uid, owner.gid)
            os.fchmod(f, mode & manifest.CARRIED)
            os.fsync(f)
        finally:
            os.close(f)

    _place(root, rel, owner, make)


def copy_verified(
    source: Path, root: Path, rel: str, expected: manifest.Entry, owner: Owner, *, dest: str | None = None
) -> None:
    """Copy the file `rel` of the (guest) tree `source` to `dest` (default: rel) in root, checking that its
    content is still what the review saw."""
    src = open_nofollow(source, rel)
    if src is None:
        raise ChangedError(f"{rel} changed since the review (it is no longer a file there); look again")
    try:
        write_from(root, dest or rel, src, expected.digest, expected.mode, owner)
    finally:
        os.close(src)


def write_symlink(root: Path, rel: str, target: str, owner: Owner) -> None:
    def make(fd: int, tmp: str) -> None:
        os.symlink(target, tmp, dir_fd=fd)
        os.chown(tmp, owner.uid, owner.gid, dir_fd=fd, follow_symlinks=False)

    _place(root, rel, owner, make)


def make_dir(root: Path, rel: str, mode: int, owner: Owner) -> None:
    fd = _parent_fd(root, rel, owner, create=True)
    name = rel.rsplit("/", 1)[-1]
    try:
        created = True
        try:
            os.mkdir(name, 0o700, dir_fd=fd)
        except FileExistsError:
            created = False
        try:
            d = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        except OSError:
            raise UnsafePathError(f"{rel} exists and is not a directory") from None
        try:
            if created:
                os.fchown(d, owner.uid, owner.gid)
            os.fchmod(d, manifest.landed_mode(DIR, mode))
        finally:
            os.close(d)
    finally:
        os.close(fd)


def _as_reviewed(root: Path, change: Change) -> manifest.Entry | None:
    """The host's entry at the change's path, which must still be what the review saw (else: an error)."""
    now = _current(root, change.path)
    expected = change.host
    if not (
        (now is None and expected is None)
        or (now is not None and now.same(expected))
        or (now is not None and expected is not None and now.kind == expected.kind == DIR)
    ):
        raise VmsandboxError(f"{change.path} changed on the host since the review; left as it is")
    return now


def memory_file(data: bytes, *, inherited: bool = False) -> int:
    """A file in memory holding `data`, read from its start (`inherited`: a child process may open it too)."""
    fd = os.memfd_create("vmsandbox", 0 if inherited else os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def write_content(root: Path, change: Change, data: bytes, owner: Owner) -> None:
    """Put `data` (a merge, the hunks a person chose, their edit) at the change's path, whose host side must still
    be what the review saw; with the host file's permission bits (the guest's where the guest changed them)."""
    now = _as_reviewed(root, change)
    if now is not None and now.kind != FILE:
        raise VmsandboxError(f"{change.path} is no longer a file on the host; left as it is")
    base, guest = change.base, change.guest
    mode = 0o644 if now is None else now.mode
    moved = base is None or base.mode & manifest.CARRIED != (guest.mode if guest else 0) & manifest.CARRIED
    if guest is not None and guest.kind == FILE and moved:  # the guest changed the bits: its bits (risk.py judged)
        mode = guest.mode
    fd = memory_file(data)
    try:
        write_from(root, change.path, fd, None, mode, owner)
    finally:
        os.close(fd)


def apply_one(root: Path, source: Path, change: Change, owner: Owner) -> None:
    """Apply one change whose host side is still what the review saw (else: a conflict error)."""
    now = _as_reviewed(root, change)
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
        make_dir(root, change.path, guest.mode, owner)
    elif guest.kind == FILE:
        copy_verified(source, root, change.path, guest, owner)
    elif guest.kind == SYMLINK and guest.target is not None:
        write_symlink(root, change.path, guest.target, owner)


def order(changes: list[Change]) -> list[Change]:
    """Deletions deepest first, then directories shallow first, then everything else."""
    deletions = sorted((c for c in changes if c.guest is None), key=lambda c: -c.path.count("/"))
    dirs = sorted((c for c in changes if c.guest is not None and c.guest.kind == DIR), key=lambda c: c.path.count("/"))
    rest = [c for c in changes if c.guest is not None and c.guest.kind != DIR]
    return deletions + dirs + rest
