"""The three-way view: for each path, compare the baseline, the host now and the guest now.

Everything from the guest is hostile: this module only classifies; land/write.py decides how (and whether) a change
may be written. Risky paths — places where a file turns into code the host runs later (risk.py) — are
quarantined; symlinks that lead out of the project, FIFOs, devices and bad names are refused.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from vmsandbox.confine.beneath import Unreadable
from vmsandbox.sync.review.risk import judge_links, not_known, risky_name
from vmsandbox.sync.tree.final import Final
from vmsandbox.sync.tree.manifest import DIR, FILE, OTHER, SYMLINK, Entry, Tree, landed_mode

# .git internals that git itself manages: commits come back as fetched refs, never as these files.
GIT_MANAGED = (
    "objects/",
    "refs/",
    "logs/",
    "index",
    "packed-refs",
    "HEAD",
    "ORIG_HEAD",
    "FETCH_HEAD",
    "COMMIT_EDITMSG",
    "MERGE_HEAD",
    "MERGE_MSG",
    "MERGE_MODE",
    "AUTO_MERGE",
    "REBASE_HEAD",
    "CHERRY_PICK_HEAD",
    "REVERT_HEAD",
    "rebase-merge/",
    "rebase-apply/",
    "gitk.cache",
)


class Status(enum.StrEnum):
    APPLY = "apply"  # the guest changed it, the host did not: it can land
    CONFLICT = "conflict"  # both changed it differently: the host file is never touched
    MERGED = "merged"  # both changed a text file where they do not overlap: the three-way merge lands (merge.py)
    SAME = "same"  # both made the same change: nothing to do
    UNSAFE = "unsafe"  # can never be written (FIFO, device, symlink leaving the tree, bad name)


@dataclass(frozen=True)
class Merge:
    """Both sides' edits of a text file, merged (merge.py)."""

    text: bytes  # the merged content; with diff3 conflict markers where `conflicts` > 0
    conflicts: int  # overlapping hunks left for a person

    @property
    def clean(self) -> bool:
        return self.conflicts == 0


@dataclass
class Change:
    path: str
    base: Entry | None
    guest: Entry | None
    host: Entry | None
    status: Status
    risky: str | None = None  # why it is quarantined
    notes: list[str] = field(default_factory=list)
    ignored: str | None = None  # why --yes leaves it as not reviewable source (ignored by the project, derived)
    binary: bool = False  # the guest's content is binary: applied only on an explicit choice (reviewable.py)
    secret: str | None = None  # what in the guest's content looks like a credential: never applied by --yes
    merge: Merge | None = None  # both sides' edits merged (MERGED), or with conflict markers (CONFLICT): merge.py

    @property
    def kind(self) -> str:
        if self.base is None:
            return "added"
        if self.guest is None:
            return "deleted"
        if self.base.kind != self.guest.kind:
            return "type changed"
        if self.base.kind == FILE and self.base.digest == self.guest.digest:
            return "mode changed"
        return "modified"


def is_git_managed(path: str) -> bool:
    if not path.startswith(".git/"):
        return False
    inner = path[len(".git/") :]
    return any(inner == p.rstrip("/") or (p.endswith("/") and inner.startswith(p)) for p in GIT_MANAGED)


def _executable(entry: Entry | None) -> bool:
    return entry is not None and entry.kind == FILE and bool(entry.mode & 0o111)


def risk_of(path: str, base: Entry | None, guest: Entry | None, host: Entry | None = None) -> str | None:
    """Why a guest change is risky: its name, or what runs. A file that was executable (in the baseline, or on
    the host now) and whose content the guest changed is risky whatever mode the guest leaves it with:
    `sh script.sh` and `python manage.py` run it without its bit, and dropping the bit must not launder it."""
    why = risky_name(path)
    if why is not None:
        return why
    if (
        guest is not None
        and guest.kind == SYMLINK
        and any(_executable(e) or (e is not None and e.kind == DIR) for e in (base, host))
    ):  # `sh scripts/x.sh` runs what the link leads to, which the guest chose: a file that was not executable
        return "a link where an executable file or a directory was: what ran there now comes from elsewhere"
    if guest is None or guest.kind != FILE:
        return None
    was = _executable(base) or _executable(host)
    if guest.mode & 0o111 and not was:
        return "newly executable"
    before = base if _executable(base) else host
    if was and before is not None and before.digest != guest.digest:  # what ran before: its content is what runs
        return "executable, its content changed"
    return None


def unsafe_reason(path: str, guest: Entry | None) -> str | None:
    """Why a guest change can never be written, by itself (where a link leads is judge_links's: it needs every
    tree)."""
    parts = path.split("/")
    if path.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in path:
        return "invalid path"
    if guest is not None and guest.kind == OTHER:
        return "FIFOs, sockets and device files are never created"
    return None


def compare(
    baseline: Tree,
    host: Tree,
    guest: Tree,
    *,
    only: Iterable[str] | None = None,
    host_links: Callable[[], Mapping[str, str]] | None = None,
    fold: bool = False,
) -> list[Change]:
    """Every path the guest changed against the baseline, classified. Sorted by path. `only`: the paths where
    the guest's tree is known to differ from the baseline (the others are not looked at; nor is the host
    listed, so `host` may be a views.Lookup — then `host_links` lists the host's links, when a judge needs
    them). `fold`: the project's file system compares names case-insensitively."""
    changes: list[Change] = []
    for path in sorted(set(baseline) | set(guest) if only is None else only):
        if is_git_managed(path):
            continue
        base, g = baseline.get(path), guest.get(path)
        if same_entry(base, g):
            continue
        try:
            h = host.get(path)
        except Unreadable as exc:  # the host's side is not known: never taken for nothing
            changes.append(Change(path, base, g, None, Status.UNSAFE, risk_of(path, base, g), [not_known(exc)]))
            continue
        if same_entry(g, h):
            status = Status.SAME
        elif same_entry(base, h):
            status = Status.APPLY
        else:
            status = Status.CONFLICT
        change = Change(path, base, g, h, status, risk_of(path, base, g, h))
        unsafe = unsafe_reason(path, g) if status is not Status.SAME else None
        if unsafe is not None:
            change.status = Status.UNSAFE
            change.notes.insert(0, unsafe)
        changes.append(change)
    final = Final(baseline, host, guest, fold=fold, kept=[c.path for c in changes if c.status is Status.UNSAFE])
    _judge_links(changes, final, host_links or (lambda: _links_of(host)))
    return changes


def _links_of(tree: Tree) -> dict[str, str]:
    return {p: e.target for p, e in tree.items() if e.kind == SYMLINK and e.target is not None}


def _judge_links(changes: list[Change], final: Final, host_links: Callable[[], Mapping[str, str]]) -> None:
    """Refuse the changes that would make a link lead out, and hold the links that lead through what nobody has
    (risk.judge_links)."""
    judged = [c for c in changes if c.status not in (Status.SAME, Status.UNSAFE)]
    refused, unknown = judge_links(final, [(c.path, c.guest, c.host) for c in judged], host_links)
    for c in judged:
        if c.path in refused:
            c.status = Status.UNSAFE
            c.notes.insert(0, refused[c.path])
        elif c.path in unknown:
            c.risky = unknown[c.path] if c.risky is None else f"{c.risky}; {unknown[c.path]}"


def same_entry(a: Entry | None, b: Entry | None) -> bool:
    """Equal as far as a sync can carry: only the bits that land (manifest.landed_mode: the CARRIED ones, a directory's
    owner's rwx always) travel, so only they can differ."""
    if a is None or b is None:
        return a is None and b is None
    if a.kind in (DIR, FILE) and a.kind == b.kind:
        return landed_mode(a.kind, a.mode) == landed_mode(b.kind, b.mode) and a.digest == b.digest
    return a.same(b)
