"""Provenance kept as JSON: in a frozen review (what a person saw, with it), and in the session directory, where
the last live review leaves it, so that a review made later from the VM's workspace disk or its outbox (no
journal answers then) still shows who wrote what.

A file's lines were traced over the guest's content of that moment: the session's copy keeps each file's
content hash beside it, and a later review takes the lines only of the files the guest has not changed since
(the others keep their writers, and say why their lines are gone). Everything here is written by the host; a
damaged file reads as no provenance at all.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

from vmsandbox import filewrite
from vmsandbox.sync.provenance.blame import LATER, MAX_LINES
from vmsandbox.sync.provenance.model import USAGE, FileOrigin, Provenance, Step, Writer
from vmsandbox.sync.review.threeway import Change
from vmsandbox.sync.tree.manifest import FILE

NAME = "provenance.json"  # in the session directory
MAX_BYTES = 64 * 1024**2
MAX_FILE_LINES = MAX_LINES + 1  # lines (or removals) of one file read back at most (a trace has no more)
USAGE_NAME = "provenance-usage.json"  # the journal's figures (what `inspect` reads; small)


def to_json(prov: Provenance) -> dict[str, Any]:
    return {
        "steps": [s.as_json() for s in prov.steps],
        "writers": [{**w.as_json(), "id": w.id} for w in prov.writers.values()],
        "files": {path: _origin_json(o) for path, o in prov.files.items()},
        "incomplete": prov.incomplete,
    }


def from_json(data: Any) -> Provenance:
    """As to_json wrote it; ValueError when it is not."""
    try:
        writers = [_writer(w) for w in data["writers"]]
        files = {str(path): _origin(o) for path, o in data["files"].items()}
        return Provenance(tuple(_step(s) for s in data["steps"]), {w.id: w for w in writers}, files,
                          _text(data["incomplete"]))  # fmt: skip
    except (KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise ValueError(f"not provenance as vmsandbox writes it: {exc!r}") from exc


def save(root: Path, prov: Provenance, changes: list[Change]) -> None:
    """Keep `prov` in the session directory `root`, each file's lines with the guest content they were traced on."""
    digests = {c.path: _digest(c) for c in changes}
    data = {**to_json(prov), "digests": {path: digests.get(path) for path in prov.files}}
    filewrite.write_atomically(root / NAME, json.dumps(data))
    if prov.usage:
        filewrite.write_atomically(root / USAGE_NAME, json.dumps(dict(zip(USAGE, prov.usage, strict=False))))


def usage(root: Path) -> dict[str, int] | None:
    """The guest journal's own figures when it last answered (None: never, or damaged), as `inspect` shows them."""
    try:
        data = json.loads((root / USAGE_NAME).read_text()[:4096])
        return {k: int(data[k]) for k in USAGE if k in data}
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def load(root: Path, changes: list[Change]) -> Provenance | None:
    """What the session directory `root` keeps (None: nothing, or damaged), for `changes`: the lines of a file
    the guest changed since are dropped."""
    try:
        fd = os.open(root / NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            data = json.loads(f.read(MAX_BYTES))
        prov = from_json(data)
        digests = {str(k): v for k, v in data["digests"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None
    now = {c.path: _digest(c) for c in changes}
    files = {
        path: o if o.lines is None or now.get(path) == digests.get(path) else FileOrigin(o.writers, incomplete=LATER)
        for path, o in prov.files.items()
    }
    return Provenance(prov.steps, prov.writers, files, prov.incomplete)


def _digest(c: Change) -> str | None:
    return c.guest.digest if c.guest is not None and c.guest.kind == FILE else None


def _origin_json(o: FileOrigin) -> dict[str, Any]:
    """A file's origin, its lines run-length encoded: [[writer or null, count], ...], and its removals as runs of
    baseline lines one writer removed: [[first line, count, writer], ...]."""
    lines = None if o.lines is None else [[w, len(list(run))] for w, run in itertools.groupby(o.lines)]
    removed: list[list[int]] = []
    for i, w in sorted(o.removed.items()):
        last = removed[-1] if removed else None
        if last is not None and last[0] + last[1] == i and last[2] == w:
            last[1] += 1
        else:
            removed.append([i, 1, w])
    return {"writers": list(o.writers), "lines": lines, "removed": removed, "incomplete": o.incomplete}


def _origin(d: dict[str, Any]) -> FileOrigin:
    """As _origin_json wrote it (ValueError: not so, or more lines than any file traced has)."""
    runs = d["lines"]
    lines: list[int | None] | None = None
    if runs is not None:
        lines = []
        for w, count in runs:
            if not 0 < int(count) <= MAX_FILE_LINES - len(lines):
                raise ValueError("a file's lines are more than any file traced has")
            lines += [None if w is None else int(w)] * int(count)
    removed: dict[int, int] = {}
    for first, count, w in d["removed"]:
        if not (int(first) >= 0 and 0 < int(count) <= MAX_FILE_LINES - len(removed)):
            raise ValueError("a file's removed lines are more than any file traced has")
        removed.update(dict.fromkeys(range(int(first), int(first) + int(count)), int(w)))
    return FileOrigin(
        tuple(int(n) for n in d["writers"]), None if lines is None else tuple(lines), removed, _text(d["incomplete"])
    )


def _writer(d: dict[str, Any]) -> Writer:
    depth = d["depth"]
    return Writer(int(d["id"]), int(d["pid"]), str(d["step"]), None if depth is None else int(depth), str(d["exe"]),
                  tuple(str(a) for a in d["argv"]), str(d["role"]))  # fmt: skip


def _step(d: dict[str, Any]) -> Step:
    ended, code = d["ended"], d["exit"]
    return Step(str(d["step"]), str(d["command"]), float(d["started"]), None if ended is None else float(ended),
                None if code is None else int(code), str(d["how"]), tuple(str(e) for e in d["egress"]))  # fmt: skip


def _text(value: Any) -> str | None:
    return None if value is None else str(value)
