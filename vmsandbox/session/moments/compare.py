"""Sessions side by side (a fan-out's, or forks): `compare` — which paths each one changed against its baseline,
and where they agree — and `diff A --against B`, the difference between two sessions' trees.

Each session's tree is fetched into its own mirror as a pull would (guest bytes, read without following
links and bounded). Sessions compared should share a baseline (a fan-out's and forks do); when they do not,
each is still compared against its own, and the caller is told.
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from vmsandbox.errors import VmsandboxError
from vmsandbox.session import lock
from vmsandbox.session.end import diskreader
from vmsandbox.session.record import Record
from vmsandbox.sync.land import write
from vmsandbox.sync.review import gather
from vmsandbox.sync.review.diff import DIFF_LIMIT, is_text
from vmsandbox.sync.review.threeway import same_entry
from vmsandbox.sync.tree.manifest import DIR, FILE, SYMLINK, Entry

UNCHANGED = "-"


@dataclass(frozen=True)
class Tree:
    """One session's tree as fetched: its entries where they differ from its baseline."""

    name: str
    changed: dict[str, Entry | None]  # path → the guest's entry (None: deleted)
    base: Mapping[str, Entry]  # the baseline (entries made as they are looked at)
    source: Path  # where the changed content is read
    baseline: Path
    baseline_id: str


def fetch(name: str, *, limit: int) -> Tree:
    record = Record.load(name)
    with lock.held(record.files, name, "reading the tree of"):
        record = Record.load(name)
        with diskreader.source(record) as (endpoint, disk):
            fetched = gather.fetch(record.target(), endpoint=endpoint, limit=limit, disk=disk)
        base, guest, scope, source, _origin = fetched
    changed = {p: guest.get(p) for p in scope if not same_entry(guest.get(p), base.get(p))}
    baseline_id = hashlib.sha256(record.files.baseline_manifest.read_bytes()).hexdigest()
    return Tree(name, changed, base, source, record.files.baseline, baseline_id)


def what(base: Entry | None, guest: Entry | None) -> str:
    if base is None:
        return "added" if guest is not None else UNCHANGED
    if guest is None:
        return "deleted"
    if guest.kind != base.kind:
        return f"now a {guest.kind}"
    return "modified"


@dataclass(frozen=True)
class Row:
    path: str
    cells: list[str]  # per session: added, modified, deleted, … or "-"
    agree: bool  # every session has the same thing at this path


def compare(trees: list[Tree]) -> list[Row]:
    paths = sorted({p for t in trees for p in t.changed})
    rows = []
    for p in paths:
        entries = [t.changed[p] if p in t.changed else t.base.get(p) for t in trees]
        cells = [what(t.base.get(p), t.changed[p]) if p in t.changed else UNCHANGED for t in trees]
        rows.append(Row(p, cells, all(same_entry(entries[0], e) for e in entries[1:])))
    return rows


def shared_baseline(trees: list[Tree]) -> bool:
    return len({t.baseline_id for t in trees}) == 1


def diff_between(a: Tree, b: Tree) -> str:
    """A unified diff from session b's tree to session a's, for every path either of them changed."""
    if not shared_baseline([a, b]):
        raise VmsandboxError(
            f"sessions {a.name} and {b.name} were captured separately: their trees share no starting point",
            hint="compare sessions of one fan-out, or a session and its forks",
        )
    out = []
    for p in sorted(set(a.changed) | set(b.changed)):
        old, new = _entry_and_root(b, p), _entry_and_root(a, p)
        if same_entry(old[0], new[0]):
            continue
        out.append(_diff_one(p, b.name, old, a.name, new))
    return "".join(out)


def _entry_and_root(t: Tree, path: str) -> tuple[Entry | None, Path]:
    if path in t.changed:
        return t.changed[path], t.source
    return t.base.get(path), t.baseline


def _diff_one(
    path: str, old_name: str, old: tuple[Entry | None, Path], new_name: str, new: tuple[Entry | None, Path]
) -> str:
    (oe, oroot), (ne, nroot) = old, new
    if any(e is not None and e.kind != FILE for e in (oe, ne)):
        return f"{path}: {_describe(oe)} in {old_name}, {_describe(ne)} in {new_name}\n"
    od = write.read_nofollow(oroot, path, limit=DIFF_LIMIT) if oe else b""
    nd = write.read_nofollow(nroot, path, limit=DIFF_LIMIT) if ne else b""
    if od is None or nd is None or not (is_text(od) and is_text(nd)):
        sizes = f"{oe.size if oe else 0} bytes in {old_name}, {ne.size if ne else 0} in {new_name}"
        return f"{path}: binary or large, {sizes}\n"
    lines = difflib.unified_diff(
        od.decode().splitlines(keepends=True),
        nd.decode().splitlines(keepends=True),
        f"{old_name}/{path}" if oe else "/dev/null",
        f"{new_name}/{path}" if ne else "/dev/null",
    )
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


def _describe(e: Entry | None) -> str:
    if e is None:
        return "absent"
    if e.kind == SYMLINK:
        return f"a symlink to {e.target}"
    if e.kind == DIR:
        return "a directory"
    return f"a {e.kind}"
