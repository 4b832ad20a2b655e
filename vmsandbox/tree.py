"""A manifest of a directory tree: per relative path its type, mode, size and content hash.

Walks never follow symlinks; a symlink is recorded with its target. Paths use "/" and are relative.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

FILE, DIR, SYMLINK, OTHER = "file", "dir", "symlink", "other"
_CHUNK = 1 << 20


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


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def entry_of(path: Path) -> Entry | None:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        return Entry(SYMLINK, 0o777, st.st_size, target=os.readlink(path))  # noqa: PTH115 - exact bytes, not a Path
    if stat.S_ISDIR(st.st_mode):
        return Entry(DIR, mode)
    if stat.S_ISREG(st.st_mode):
        return Entry(FILE, mode, st.st_size, digest=file_digest(path))
    return Entry(OTHER, mode)


Manifest = dict[str, Entry]


def scan(root: Path, *, skip: frozenset[str] = frozenset()) -> Manifest:
    """Every path under root (root itself excluded). `skip` names top-level entries to leave out."""
    found: Manifest = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        rel_dir = os.path.relpath(dirpath, root)
        prefix = "" if rel_dir == "." else rel_dir + "/"
        for name in sorted(dirnames + filenames):
            rel = prefix + name
            if not prefix and name in skip:
                continue
            entry = entry_of(Path(dirpath) / name)
            if entry is not None:
                found[rel] = entry
        dirnames[:] = [d for d in dirnames if not (not prefix and d in skip)]
    return found


def to_json(manifest: Manifest) -> dict[str, Any]:
    return {path: entry.as_dict() for path, entry in sorted(manifest.items())}


def from_json(data: dict[str, Any]) -> Manifest:
    return {path: Entry.from_dict(e) for path, e in data.items()}
