"""Trees that are read, not walked: the baseline as stored (its entries made as they are looked at), the
guest's tree as the baseline with the mirror's differences laid over it, and the host's project read path by
path. A review looks at the few paths the guest changed, so none of them is ever listed whole by a pull.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from vmsandbox.sync.tree.hashcache import HashCache
from vmsandbox.sync.tree.manifest import Entry, entry_under


class Lookup(Mapping[str, Entry]):
    """A tree read only where asked (entry_under, remembered): for a review that needs the host's side of the
    paths the guest changed, and not a walk of the whole project. It cannot be listed."""

    def __init__(self, root: Path, cache: HashCache | None = None) -> None:
        self.root = root
        self.cache = cache
        self.known: dict[str, Entry | None] = {}

    def __getitem__(self, rel: str) -> Entry:
        if rel not in self.known:
            self.known[rel] = entry_under(self.root, rel, self.cache)
        found = self.known[rel]
        if found is None:
            raise KeyError(rel)
        return found

    def __iter__(self) -> Iterator[str]:
        raise TypeError("a Lookup is read path by path; it cannot be listed")

    def __len__(self) -> int:
        raise TypeError("a Lookup is read path by path; it has no length")


class Stored(Mapping[str, Entry]):
    """A manifest as stored (JSON), its entries made only when asked for: a review looks at few of them."""

    def __init__(self, raw: dict[str, dict[str, Any]]) -> None:
        self.raw = raw
        self.made: dict[str, Entry] = {}

    def __getitem__(self, rel: str) -> Entry:
        found = self.made.get(rel)
        if found is None:
            found = self.made[rel] = Entry.from_dict(self.raw[rel])
        return found

    def __contains__(self, rel: object) -> bool:
        return rel in self.raw

    def __iter__(self) -> Iterator[str]:
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)


class Overlay(Mapping[str, Entry]):
    """A tree with changes laid over it (a change of None: the path is gone)."""

    def __init__(self, under: Mapping[str, Entry], changes: Mapping[str, Entry | None]) -> None:
        self.under = under
        self.changes = changes

    def __getitem__(self, rel: str) -> Entry:
        if rel in self.changes:
            found = self.changes[rel]
            if found is None:
                raise KeyError(rel)
            return found
        return self.under[rel]

    def __iter__(self) -> Iterator[str]:
        yield from (p for p in self.under if p not in self.changes)
        yield from (p for p, e in self.changes.items() if e is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)
