"""A manifest of a directory tree: per relative path its type, mode, size and content hash.

Walks never follow symlinks, not even a directory swapped for a symlink while the walk runs: every tree is
walked beneath its top (confine.beneath.Root: descriptors, no link followed, no `..`), and files are opened
relative to their directory with O_NOFOLLOW. A symlink is recorded with its target. Paths use "/" and are
relative.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vmsandbox.confine import atfd, beneath
from vmsandbox.errors import VmsandboxError
from vmsandbox.sync.tree.hashcache import HashCache

FILE, DIR, SYMLINK, OTHER = "file", "dir", "symlink", "other"
CHUNK = 1 << 20
# The permission bits a sync carries: rwx for the owner and the group, r-x for others. Setuid, setgid, sticky
# and world-writable never travel from a guest, so they never make a difference between two trees either.
CARRIED = 0o775
# What a directory always lands with, whatever the guest set: its owner may list, enter and write it. A directory a
# person cannot list would hide what is in it from every later review (modes from the guest never rule the host).
DIR_OWNER = 0o700
# A file of the mirror that stands for the baseline's (sync.placeholders): its content hash (the 32 bytes, small
# enough to be kept in the inode: the placeholder takes no block), set by root only.
PLACEHOLDER_XATTR = "trusted.vmsandbox.digest"


@dataclass(frozen=True)
class Entry:
    kind: str  # file | dir | symlink | other (FIFO, socket, device)
    mode: int  # permission bits, setuid/setgid/sticky included
    size: int = 0
    digest: str | None = None  # sha256 of a file's content
    target: str | None = None  # a symlink's target

    def same(self, other: Entry | None) -> bool:
        """Same content and mode (what a sync must preserve); sizes and times don't matter."""
        if other is None or other.kind != self.kind:
            return False
        if self.kind == FILE:
            return self.digest == other.digest and self.mode == other.mode
        if self.kind == SYMLINK:
            return self.target == other.target
        if self.kind == DIR:
            return self.mode == other.mode
        return True

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Entry:
        return cls(**data)


def landed_mode(kind: str, mode: int) -> int:
    """The permission bits an entry of `kind` with `mode` lands with on the host: the carried ones, and a
    directory's owner's rwx."""
    return mode & CARRIED | DIR_OWNER if kind == DIR else mode & CARRIED


open_file_at = atfd.regular_at  # the regular file `name` of a directory fd, never through a link (None: not one)
read_at_most = atfd.read_at_most  # the whole content of an fd if it is at most `limit` bytes, else None


def chunks(fd: int) -> Iterator[bytes]:
    while data := os.read(fd, CHUNK):
        yield data


def fd_digest(fd: int) -> str:
    h = hashlib.sha256()
    for data in chunks(fd):
        h.update(data)
    return h.hexdigest()


def placeholder_digest(fd: int) -> str | None:
    """The content hash a placeholder stands for, or None if the file is not one."""
    try:
        value = os.getxattr(fd, PLACEHOLDER_XATTR)
    except OSError:
        return None
    return value.hex() if len(value) == hashlib.sha256().digest_size else None


def entry_at(dir_fd: int, name: str, cache: HashCache | None = None, rel: str = "") -> Entry | None:
    """The entry `name` in the directory dir_fd, never followed (None if it is gone). With a cache, a file
    that is provably unchanged since it was hashed (at `rel`) is not read again."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        return Entry(SYMLINK, 0o777, st.st_size, target=os.readlink(name, dir_fd=dir_fd))
    if stat.S_ISDIR(st.st_mode):
        return Entry(DIR, mode)
    if stat.S_ISREG(st.st_mode):
        return _file_entry(dir_fd, name, st, cache, rel)
    return Entry(OTHER, mode)


def _file_entry(dir_fd: int, name: str, st: os.stat_result, cache: HashCache | None, rel: str) -> Entry:
    mode = stat.S_IMODE(st.st_mode)
    if cache is not None and (known := cache.lookup(rel, st)) is not None:
        return Entry(FILE, mode, st.st_size, digest=known)
    fd = open_file_at(dir_fd, name, st)
    if fd is None:  # swapped for something else meanwhile
        return Entry(OTHER, 0)
    try:
        stands_for = placeholder_digest(fd) if cache is not None and cache.placeholders else None
        digest = fd_digest(fd) if stands_for is None else stands_for
    finally:
        os.close(fd)
    if cache is not None:
        cache.remember(rel, st, digest)
    return Entry(FILE, mode, st.st_size, digest=digest)


def entry_of(path: Path) -> Entry | None:
    """The entry at path (its parent directories are trusted; the entry itself is never followed)."""
    try:
        fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        return entry_at(fd, path.name)
    finally:
        os.close(fd)


def parents(rel: str) -> Iterator[str]:
    """The directories above a relative path, outermost first (`a/b/c` -> `a`, `a/b`)."""
    parts = rel.split("/")
    return ("/".join(parts[:i]) for i in range(1, len(parts)))


Manifest = dict[str, Entry]
Tree = Mapping[str, Entry]  # a manifest only read: a Manifest, or one of sync.views


class TooManyEntriesError(VmsandboxError):
    """A tree with more entries than a scan takes (a guest's tree is read into memory)."""


class TooDeepError(VmsandboxError):
    """A tree nested deeper than a walk goes (Python's own walk recurses: a thousand levels end it)."""


def deep(root: Path) -> TooDeepError:
    return TooDeepError(
        f"the tree under {root} is nested deeper than a walk goes (hundreds of directories in a path); not read",
        hint="remove the deep directories in the guest (`vmsandbox shell NAME`), then try again",
    )


def scan(
    root: Path, *, skip: frozenset[str] = frozenset(), cache: HashCache | None = None, max_entries: int | None = None
) -> Manifest:
    """Every path under root (root itself excluded; root is the caller's name, followed if a link). `skip` names
    top-level entries to leave out. With a cache (sync.tree.hashcache), unchanged files are not read again; the cache
    is saved after the walk. With `max_entries`, a tree holding more raises TooManyEntriesError as soon as the
    walk finds one too many. A directory that cannot be opened or listed raises beneath.Unreadable: never empty."""
    found: Manifest = {}
    with beneath.Root.open(root, follow=True) as top:
        try:
            _walk(top, "", found, skip, cache, max_entries=max_entries)
        except RecursionError:
            raise deep(root) from None
    if cache is not None:
        cache.save()
    return found


def scan_under(root: Path, rel: str, cache: HashCache | None = None) -> Manifest:
    """The entry at `rel` under root and, if it is a directory, everything under it (keys relative to root).
    No symlink is followed on the way down to `rel` either. The cache is not saved (the caller merges).
    beneath.Unreadable when a directory there cannot be opened or listed: never read as empty."""
    with beneath.Root.open(root, follow=True) as top:
        entry = _entry(top, rel, cache)
        found: Manifest = {} if entry is None else {rel: entry}
        with top.directory(rel) as there:
            if entry is None or entry.kind != DIR or there is None:  # (or swapped for a link meanwhile)
                return found
        try:
            _walk(top, rel, found, frozenset(), cache)
        except RecursionError:
            raise deep(root / rel) from None
        return found


def _walk(
    top: beneath.Root,
    rel: str,
    found: Manifest,
    skip: frozenset[str],
    cache: HashCache | None,
    *,
    max_entries: int | None = None,
) -> None:
    """Add everything below the directory `rel` of top to `found`, keyed by its path beneath top; no symlink is
    followed."""
    for rel_dir, dirnames, filenames, here_fd in top.walk(rel):
        here = "/".join(p for p in (rel, rel_dir) if p)
        here = here + "/" if here else ""
        at_top = not here
        for name in sorted(dirnames + filenames):
            if at_top and name in skip:
                continue
            try:
                entry = entry_at(here_fd, name, cache, here + name)
            except OSError as exc:  # (EACCES: a directory listed but not searchable)
                raise beneath.Unreadable(top.path, here + name, exc) from None
            if entry is not None:
                found[here + name] = entry
                if max_entries is not None and len(found) > max_entries:
                    raise TooManyEntriesError(f"the tree under {top.path} holds more than {max_entries:,} entries")
        dirnames[:] = [d for d in dirnames if not (at_top and d in skip)]


def open_dir_under(root: Path, rel: str) -> int | None:
    """An fd of the directory `rel` under root ("" is root), reached beneath it (confine.beneath); None if a
    component is missing, a link or not a directory, or `rel` is not a plain name beneath root."""
    with beneath.Root.open(root, follow=True) as top:
        try:
            return top.opendir(rel)
        except (OSError, beneath.Outside):
            return None


# A name the file system cannot hold (too long, not in its encoding): nothing can be there by that name.
CANNOT_HOLD = frozenset({errno.ENAMETOOLONG, errno.EILSEQ, errno.EINVAL})


def _entry(top: beneath.Root, rel: str, cache: HashCache | None) -> Entry | None:
    """The entry at `rel`; None when nothing is there (a component missing, or a file or a link: what is beneath a
    link is the link's target's, never this name's; a name the file system cannot hold). beneath.Unreadable when
    a directory on the way, or the entry, cannot be read: what is there is not known, and is never taken for
    nothing."""
    try:
        parent, name = top.parent(rel)
    except beneath.Outside:
        return None
    except OSError as exc:
        if exc.errno in beneath.NOT_THERE | CANNOT_HOLD:
            return None
        raise beneath.Unreadable(top.path, exc.filename or rel, exc) from None
    try:
        return entry_at(parent, name, cache, rel)
    except OSError as exc:
        if exc.errno in beneath.NOT_THERE | CANNOT_HOLD:
            return None
        raise beneath.Unreadable(top.path, rel, exc) from None
    finally:
        os.close(parent)


def entry_under(root: Path, rel: str, cache: HashCache | None = None) -> Entry | None:
    """The entry at `rel` under root, no symlink followed on the way (None if there is none; beneath.Unreadable if
    what is there cannot be read)."""
    with beneath.Root.open(root, follow=True) as top:
        return _entry(top, rel, cache)


def to_json(manifest: Mapping[str, Entry]) -> dict[str, Any]:
    return {path: entry.as_dict() for path, entry in sorted(manifest.items())}


def from_json(data: dict[str, Any]) -> Manifest:
    return {path: Entry.from_dict(e) for path, e in data.items()}
