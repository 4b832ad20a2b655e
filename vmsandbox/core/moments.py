"""A session's moments, for every front end: checkpoints (its whole state kept — memory, disks, workspace — to
return to or to copy) and the trees of several sessions side by side (a fan-out's, a session and its forks)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from vmsandbox import ui
from vmsandbox.core import reviews, sessions
from vmsandbox.errors import VmsandboxError
from vmsandbox.session.moments import checkpoint, compare
from vmsandbox.session.place.checkpoints import Checkpoint, listed
from vmsandbox.session.record import Record


@dataclass(frozen=True)
class Kept:
    """A checkpoint as a listing shows it: its label, when it was taken, its bytes where they are kept (None:
    the session's host did not say), and how long taking it took (when it was just taken)."""

    label: str
    created: float
    size: int | None
    seconds: float | None = None

    def as_dict(self) -> dict[str, object]:
        return {"label": self.label, "created": self.created, "bytes": self.size}


def _kept(record: Record, found: list[Checkpoint]) -> list[Kept]:
    try:
        sizes: dict[str, int | None] = dict(checkpoint.sizes(record, found))
    except VmsandboxError as exc:
        ui.warn(exc.message)
        sizes = {}
    return [Kept(c.label, c.created, sizes.get(c.label)) for c in found]


def is_label(text: str) -> bool:
    """Whether `text` may label a checkpoint (1-40 lowercase letters, digits, dots, dashes and underscores)."""
    return checkpoint.LABEL_RE.match(text) is not None


def take(name: str, label: str | None) -> Kept:
    """A checkpoint of a running session (default label: cp-DATE-TIME), taken while it runs on where it can
    (checkpoint.take_locked)."""
    started = time.monotonic()
    cp = checkpoint.take(name, label)
    took = time.monotonic() - started
    (kept,) = _kept(Record.load(name), [cp])
    return Kept(kept.label, kept.created, kept.size, took)


def kept(name: str, *, sized: bool = True) -> list[Kept]:
    """A session's checkpoints, oldest first, with their sizes (without `sized`, read from its files alone: no
    size is asked of its host)."""
    record = Record.load(name)
    found = listed(record.files)
    return _kept(record, found) if sized else [Kept(c.label, c.created, None) for c in found]


def remove(name: str, label: str) -> None:
    checkpoint.remove(name, label)


@dataclass(frozen=True)
class Restored:
    """A session back at a checkpoint: the unsynced changes of before, `left` of them, kept in `box`."""

    box: Path | None
    left: int
    seconds: float


def restore(name: str, label: str) -> Restored:
    """A session returned to a checkpoint: its processes, files and disks as they were then. Changes not yet
    pulled are exported first (a patch and the files), never lost. Refused while a run drives the session
    (core.sessions.not_driven)."""
    sessions.not_driven(Record.load(name))
    started = time.monotonic()
    rolled = checkpoint.rollback(name, label, limit=reviews.limit())
    return Restored(rolled.box, rolled.left, time.monotonic() - started)


@dataclass(frozen=True)
class Side:
    """Several sessions' changes side by side: per path, what each did (added, modified, deleted, …, or `-`),
    and whether they all agree; `shared`: they were captured together (else each against its own baseline)."""

    names: list[str]
    rows: list[compare.Row]
    shared: bool


def side_by_side(names: list[str]) -> Side:
    trees = [compare.fetch(n, limit=reviews.limit()) for n in names]
    return Side(names, compare.compare(trees), compare.shared_baseline(trees))


def between(name: str, other: str) -> str:
    """A unified diff from `other`'s tree to `name`'s, for every path either of them changed."""
    theirs, ours = compare.fetch(other, limit=reviews.limit()), compare.fetch(name, limit=reviews.limit())
    return compare.diff_between(ours, theirs)
