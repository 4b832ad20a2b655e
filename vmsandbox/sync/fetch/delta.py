"""What the mirror of the guest's tree holds that differs from the baseline: per path the mirror's entry (None:
the guest deleted it). Kept between pulls, so that after the guest's journal names a few changed paths a pull
re-reads those paths in the mirror and nothing else, and the review compares only the paths in it.

It describes the mirror as it is on disk: written after the mirror changed, forgotten before a whole-tree
fetch rewrites the mirror and whenever the baseline moves (a push).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from vmsandbox import filewrite
from vmsandbox.sync.tree import manifest, views
from vmsandbox.sync.tree.hashcache import HashCache
from vmsandbox.sync.tree.manifest import DIR, Entry, Manifest

Delta = dict[str, Entry | None]


def _file(root: Path) -> Path:
    return root / "mirror.delta.json"


def load(root: Path) -> Delta | None:
    """The delta the last fetch left; None if there is none (or it is damaged): then the tree is walked."""
    try:
        data = json.loads(_file(root).read_text())
        return {str(p): None if e is None else Entry.from_dict(e) for p, e in data.items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def save(root: Path, delta: Delta) -> None:
    data = {p: None if e is None else e.as_dict() for p, e in sorted(delta.items())}
    filewrite.write_atomically(_file(root), json.dumps(data, separators=(",", ":")))


def forget(root: Path) -> None:
    _file(root).unlink(missing_ok=True)


def between(base: Mapping[str, Entry], guest: Manifest) -> Delta:
    """The delta of a whole mirror manifest against the baseline."""
    return {p: guest.get(p) for p in base.keys() | guest.keys() if base.get(p) != guest.get(p)}


def view(base: Mapping[str, Entry], delta: Delta) -> views.Overlay:
    """The guest's tree as the mirror holds it: the baseline with the delta laid over it."""
    return views.Overlay(base, delta)


def _under(p: str, roots: set[str]) -> bool:
    return any(q in roots for q in manifest.parents(p))


def refresh(mirror: Path, base: Mapping[str, Entry], delta: Delta, listed: Iterable[str], cache: HashCache) -> None:
    """Bring `delta` up to date after a fetch of `listed` paths into the mirror (each with everything under
    it): those are read again, with their parent directories (a fetch sets their modes) and whatever the
    mirror held under a listed path that was a directory before."""
    roots = set(listed)
    before = {p for p in roots if (e := delta[p] if p in delta else base.get(p)) is not None and e.kind == DIR}
    stale: set[str] = set()
    if before:  # one pass over the paths known under the directories that were listed
        stale = {p for p in base.keys() | delta.keys() if _under(p, before)}
    now: Manifest = {}
    for p in roots:
        if not _under(p, roots):
            now.update(manifest.scan_under(mirror, p, cache))
    found: dict[str, Entry | None] = {p: now.get(p) for p in roots | stale | now.keys()}
    for p in roots:
        for q in manifest.parents(p):
            if q not in found and not _under(q, roots) and q not in roots:
                found[q] = manifest.entry_under(mirror, q, cache)
    cache.save(partial=True)
    for p, e in found.items():
        if e == base.get(p):
            delta.pop(p, None)
        else:
            delta[p] = e
