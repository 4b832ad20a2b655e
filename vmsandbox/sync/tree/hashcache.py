"""Content hashes remembered per file between scans of one tree (the project, the mirror of the guest's tree),
so that a pull hashes only the files that changed since the last one.

A remembered hash is used only when the file is provably the one that was hashed: the same device, inode,
size, modification time and change time. The change time is set by the host's kernel alone (no one can set
it back, and rsync's receiver writes a new inode), so neither a guest nor a user who restores an mtime can
make a changed file look unchanged. A file changed within RACY_NS of the scan that hashed it is not
remembered at all (timestamps are coarser than writes, as git's "racy" entries are), so it is hashed again.

The cache lives in the session directory (private, ours); a damaged or missing cache is an empty one.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from vmsandbox import filewrite

RACY_NS = 2_000_000_000
Key = tuple[int, int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns
FIELDS = 6  # a stored entry: the key's five numbers, then the digest


def _key(st: os.stat_result) -> Key:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class HashCache:
    def __init__(
        self, path: Path | None, known: dict[str, tuple[Key, str]] | None = None, *, placeholders: bool = False
    ) -> None:
        self.path = path
        self.known = known or {}
        self.placeholders = placeholders  # the mirror's: a placeholder's hash is its attribute (sync.placeholders)
        self.seen: dict[str, tuple[Key, str]] = {}
        self.started = time.time_ns()
        self.hits = self.misses = 0

    @classmethod
    def load(cls, path: Path, *, placeholders: bool = False) -> HashCache:
        try:
            data = json.loads(path.read_text())
            known: dict[str, tuple[Key, str]] = {
                rel: ((int(v[0]), int(v[1]), int(v[2]), int(v[3]), int(v[4])), str(v[5]))
                for rel, v in data.items()
                if isinstance(v, list) and len(v) == FIELDS
            }
        except (OSError, ValueError, TypeError, AttributeError):
            known = {}
        return cls(path, known, placeholders=placeholders)

    def lookup(self, rel: str, st: os.stat_result) -> str | None:
        """The remembered digest of `rel`, if the file is the one that was hashed."""
        found = self.known.get(rel)
        if found is not None and found[0] == _key(st):
            self.hits += 1
            self.seen[rel] = found
            return found[1]
        self.misses += 1
        return None

    def remember(self, rel: str, st: os.stat_result, digest: str) -> None:
        if max(st.st_mtime_ns, st.st_ctime_ns) >= self.started - RACY_NS:
            return  # changed too close to this scan: its timestamps may not tell a later change
        self.seen[rel] = (_key(st), digest)

    def save(self, *, partial: bool = False) -> None:
        """Keep what this scan saw: after a whole walk only that (paths gone since are forgotten); after a
        `partial` one (some paths looked up) merged into what was known."""
        if self.path is None:
            return
        keep = {**self.known, **self.seen} if partial else self.seen
        data = {rel: [*key, digest] for rel, (key, digest) in keep.items()}
        filewrite.write_atomically(self.path, json.dumps(data, separators=(",", ":")))
