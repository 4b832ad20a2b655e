"""The mirror of the guest's tree without a second copy of the project: placeholders for the baseline's files.

A session keeps the project as captured (the baseline) and the guest's disk made from it. The mirror, where
the guest's changes land, starts as the baseline's tree with every file's data left out: a *placeholder* is a
sparse file (no blocks) with the baseline file's size, mode and mtime, and the baseline's content hash in a
`trusted.` extended attribute. So:

- rsync's quick check (size and mtime) skips it like the real file; a file the guest changed is sent whole
  or against the real data (`fill`, before a fetch of the paths the guest's journal named), and lands as a new
  inode, without the attribute;
- a scan of the mirror (sync.tree, with a HashCache made with `placeholders=True`) takes a placeholder's
  content hash from its attribute instead of hashing its zeros;
- before anything reads a file's content from the mirror (a review, a conflict kept beside), `fill` puts the
  baseline's data in, after checking it still has that hash.

Only root can set a `trusted.` attribute: the guest-data account that runs rsync's receiver, and the guest
behind it, cannot make one. Files under `.git` other than objects stay real copies (refs and the gitdir
checks read them); objects are read by name and size only (sync.git.repository).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from vmsandbox import proc
from vmsandbox.errors import VmsandboxError
from vmsandbox.sync.git import refs
from vmsandbox.sync.tree.manifest import (
    CHUNK,
    DIR,
    FILE,
    PLACEHOLDER_XATTR,
    SYMLINK,
    Entry,
    fd_digest,
    open_dir_under,
    open_file_at,
    placeholder_digest,
)

TMP = ".vmsandbox-placeholder."


def eligible(rel: str, entry: Entry) -> bool:
    """Whether the baseline's file at `rel` is left out of the mirror (a placeholder) rather than copied."""
    if entry.kind != FILE or entry.size == 0 or entry.digest is None:
        return False
    if rel == ".git" or rel.startswith(".git/"):
        inside = rel.removeprefix(".git/objects/")
        return inside != rel and bool(refs.LOOSE.match(inside) or refs.PACK.match(inside))
    return True


def make(baseline: Path, mirror: Path, manifest: Mapping[str, Entry]) -> None:
    """The mirror as the baseline's tree (directories, symlinks, FIFOs, modes, owners, times) with placeholders
    for its files, and real copies of those that must be read (`eligible`). Device nodes and sockets are left
    out: guest data never holds them."""
    if not supported(mirror.parent):  # (a file system without them, or not root): a whole copy, as before
        proc.run(["cp", "-a", "--reflink=auto", baseline, mirror], hint="is there space in the state directory?")
        return
    mirror.mkdir(mode=0o700)
    dirs: list[tuple[str, os.stat_result]] = []
    with _Dirs(mirror) as made, _Dirs(baseline) as base_dirs:
        for rel, entry in sorted(manifest.items()):  # a directory before what is in it
            where, _, name = rel.rpartition("/")
            here, source = made.get(where), base_dirs.get(where)
            like = os.stat(name, dir_fd=source, follow_symlinks=False)
            if entry.kind == DIR:
                os.mkdir(name, 0o700, dir_fd=here)
                dirs.append((rel, like))
            elif entry.kind == SYMLINK:
                os.symlink(os.readlink(name, dir_fd=source), name, dir_fd=here)
                os.chown(name, like.st_uid, like.st_gid, dir_fd=here, follow_symlinks=False)
            elif entry.kind == FILE and eligible(rel, entry) and entry.digest is not None:
                _replace(here, name, like, entry.size, entry.digest)
            elif entry.kind == FILE:
                _copy_in(here, name, like, source)
            elif stat.S_ISFIFO(like.st_mode):
                os.mkfifo(name, stat.S_IMODE(like.st_mode), dir_fd=here)
        for rel, like in reversed(dirs):  # times last: what was made in a directory changed its own
            fd = made.get(rel)
            _settle(fd, like)
        _settle(made.get(""), baseline.stat())


def fill(mirror: Path, baseline: Path, base: Mapping[str, Entry], rels: Iterable[str]) -> list[str]:
    """Put the baseline's data into the placeholders among `rels` (other paths are left as they are).
    Returns the placeholders that could not be filled (the baseline no longer has their content): those are
    removed, so that a whole fetch sends them again."""
    lost: list[str] = []
    with _Dirs(mirror) as mirror_dirs, _Dirs(baseline) as base_dirs:
        for rel in rels:
            where, _, name = rel.rpartition("/")
            here = mirror_dirs.find(where)
            found = None if here is None else _placeholder_stat(here, name)
            if here is None or found is None:
                continue
            like, digest = found
            entry = base.get(rel)
            source = base_dirs.find(where) if entry is not None and entry.digest == digest else None
            try:
                filled = source is not None and _copy_in(here, name, like, source, digest=digest)
            except OSError as exc:
                raise VmsandboxError(
                    f"could not put the baseline's data into the mirror of the guest's tree at {rel!r}: {exc.strerror}",
                    hint="free space in the state directory (`df /var/lib/vmsandbox`), then pull again",
                ) from exc
            if not filled:
                os.unlink(name, dir_fd=here)
                lost.append(rel)
    return lost


def unsettle(mirror: Path, rels: Iterable[str]) -> None:
    """Move the mirror's regular files among `rels` a second back in time, so that rsync's quick check (size
    and mtime, in whole seconds) cannot skip them: the guest's journal named them, so their bytes are compared.
    A file the guest rewrote with its size and time kept (`cp -p`, `tar x`, `touch -r`) is fetched; one it did
    not change costs a delta transfer that sends nothing. Run after `fill` (a placeholder would be compared
    against its zeros) and only on named paths: nothing under a named directory is touched."""
    with _Dirs(mirror) as mirror_dirs:
        for _rel, here, name, like in _regular_files(mirror_dirs, rels):
            os.utime(name, ns=(like.st_atime_ns, like.st_mtime_ns - 10**9), dir_fd=here, follow_symlinks=False)


def thin(mirror: Path, base: Mapping[str, Entry], same: Iterable[str]) -> None:
    """Turn the mirror's files at `same` (paths where it holds what the baseline holds) into placeholders."""
    if not supported(mirror.parent):
        return
    wanted = {rel: e for rel in same if (e := base.get(rel)) is not None and e.digest is not None and eligible(rel, e)}
    with _Dirs(mirror) as mirror_dirs:
        for rel, here, name, like in _regular_files(mirror_dirs, wanted):
            entry = wanted[rel]
            if like.st_size == entry.size and entry.digest is not None:
                _replace(here, name, like, entry.size, entry.digest)


def _regular_files(dirs: _Dirs, rels: Iterable[str]) -> Iterator[tuple[str, int, str, os.stat_result]]:
    """The regular files among `rels` under `dirs`: each path with its directory's fd, its name and its lstat,
    reached without following a symlink (a path gone, or not a regular file, is left out)."""
    for rel in rels:
        where, _, name = rel.rpartition("/")
        here = dirs.find(where)
        if here is None:
            continue
        try:
            like = os.stat(name, dir_fd=here, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISREG(like.st_mode):
            yield rel, here, name, like


def _placeholder_stat(dir_fd: int, name: str) -> tuple[os.stat_result, str] | None:
    fd = open_file_at(dir_fd, name)
    if fd is None:
        return None
    try:
        digest = placeholder_digest(fd)
        return None if digest is None else (os.fstat(fd), digest)
    finally:
        os.close(fd)


def _replace(dir_fd: int, name: str, like: os.stat_result, size: int, digest: str) -> None:
    """A placeholder of `size` bytes standing for `digest`, with `like`'s mode, owner and times, renamed over
    `name`."""
    tmp, fd = _temporary(dir_fd)
    try:
        os.ftruncate(fd, size)
        os.setxattr(fd, PLACEHOLDER_XATTR, bytes.fromhex(digest))
        _settle(fd, like)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        _discard(dir_fd, tmp)
        raise
    finally:
        os.close(fd)


def _copy_in(
    dir_fd: int, name: str, like: os.stat_result, source_dir: int | None, *, digest: str | None = None
) -> bool:
    """The baseline's file `name` (in source_dir) copied with `like`'s mode, owner and times, renamed over
    `name`; with `digest`, only if the copy hashes to it. False if nothing was copied."""
    src = None if source_dir is None else open_file_at(source_dir, name)
    if src is None:
        return False
    tmp, fd = _temporary(dir_fd)
    try:
        try:
            _copy(src, fd)
        finally:
            os.close(src)
        os.lseek(fd, 0, os.SEEK_SET)
        if digest is not None and fd_digest(fd) != digest:
            _discard(dir_fd, tmp)
            return False
        _settle(fd, like)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        _discard(dir_fd, tmp)  # (no space left, interrupted): no temporary file left for a scan to find
        raise
    finally:
        os.close(fd)
    return True


def _copy(src: int, dst: int) -> None:
    """All of `src` into `dst`, in the kernel: copy_file_range (a reflink where the file system can), or, from the
    baseline into a mirror in a file system of its own (sync.fetch.volume), sendfile."""
    try:
        while os.copy_file_range(src, dst, CHUNK):
            pass
    except OSError as exc:
        if exc.errno != errno.EXDEV:  # (refused before a byte moved: both offsets are where they were)
            raise
        while os.sendfile(dst, src, None, CHUNK):
            pass


def _discard(dir_fd: int, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)


def _temporary(dir_fd: int) -> tuple[str, int]:
    for n in range(100):
        name = f"{TMP}{os.getpid()}.{n}"
        try:
            return name, os.open(
                name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd
            )
        except FileExistsError:
            continue
    raise VmsandboxError("could not make a temporary file in the mirror of the guest's tree")


def _settle(fd: int, like: os.stat_result) -> None:
    os.fchown(fd, like.st_uid, like.st_gid)
    os.fchmod(fd, stat.S_IMODE(like.st_mode))
    os.utime(fd, ns=(like.st_atime_ns, like.st_mtime_ns))


class _Dirs:
    """Directory fds under a root, reached without following symlinks, kept open while in use."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.open: dict[str, int | None] = {}

    def __enter__(self) -> _Dirs:
        return self

    def __exit__(self, *_exc: object) -> None:
        for fd in self.open.values():
            if fd is not None:
                os.close(fd)

    def find(self, rel: str) -> int | None:
        if rel not in self.open:
            if len(self.open) > 256:
                self.__exit__()
                self.open = {}
            self.open[rel] = open_dir_under(self.root, rel)
        return self.open[rel]

    def get(self, rel: str) -> int:
        fd = self.find(rel)
        if fd is None:
            raise VmsandboxError(f"{self.root}/{rel} is not a directory any more", hint="start the session again")
        return fd


def supported(where: Path) -> bool:
    """Whether the file system at `where` keeps `trusted.` attributes (as root)."""
    probe = where / f"{TMP}probe"
    try:
        fd = os.open(probe, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    except OSError:
        return False
    try:
        os.setxattr(fd, PLACEHOLDER_XATTR, b"")
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.EPERM, errno.EACCES):
            return False
        raise
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)
    return True
