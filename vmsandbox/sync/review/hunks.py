"""A text change as hunks a person can take one by one, and the file made of the ones taken.

The hunks of `old` → `new` are the differing blocks of a line diff (difflib's opcodes, without context: each
block is its own choice). `compose` writes `old` with the chosen blocks replaced by their new lines: every hunk
taken gives `new`, none gives `old`. The same two texts always give the same hunks, so a choice made on a page
can be carried out on a review computed again.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection
from dataclasses import dataclass

HUNK_LINES = 20_000  # longer texts are taken or left whole (the guest chooses them: a diff's time is bounded)


@dataclass(frozen=True)
class Hunk:
    index: int
    old_start: int  # 0-based line numbers, end exclusive
    old_end: int
    new_start: int
    new_end: int


def lines(text: bytes) -> list[bytes]:
    return text.splitlines(keepends=True)


def hunks(old: bytes, new: bytes) -> list[Hunk]:
    a, b = lines(old), lines(new)
    matcher = difflib.SequenceMatcher(None, a, b)  # (autojunk: lines common in a long text are not anchors)
    found = [op for op in matcher.get_opcodes() if op[0] != "equal"]
    return [Hunk(i, i1, i2, j1, j2) for i, (_, i1, i2, j1, j2) in enumerate(found)]


def compose(old: bytes, new: bytes, chosen: Collection[int]) -> bytes:
    """`old` with the hunks whose index is in `chosen` taken from `new`."""
    a, b = lines(old), lines(new)
    out: list[bytes] = []
    at = 0
    for h in hunks(old, new):
        out += a[at : h.old_start]
        out += b[h.new_start : h.new_end] if h.index in chosen else a[h.old_start : h.old_end]
        at = h.old_end
    out += a[at:]
    return b"".join(out)
