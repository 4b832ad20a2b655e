"""Each line of a changed file traced to the writer that made it, and each hunk of a review to its makers.

The guest's journal keeps a small text file's content right after each distinct writer's change: its versions,
in time order, each labelled with its writer. From the baseline's text (v0) through each version to the guest's
text the review shows, each text is compared with the one before it line by line (as hunks.py compares): a
line a version brought is its writer's, a line it kept keeps the writer it had (a line that goes back to the
baseline has none), and a baseline line it dropped was removed by its writer. A guest's text that is not the
last version the journal saw (it changed after the journal's last look) is one more step, by nobody known.

A hunk's makers are the writers of its new lines and of the baseline lines it removes; where the lines say
nothing (no versions kept, too long to trace, lines the journal never saw), every writer of the file. All of it
is the guest's word, and every text is bounded: a text traced has at most MAX_LINES lines, and the work of a
trace is at most TRACE_LIMIT lines compared.
"""

from __future__ import annotations

import difflib
import functools
import time

from vmsandbox.sync.provenance.model import FileOrigin, Maker, Provenance, Writer
from vmsandbox.sync.review import hunks
from vmsandbox.sync.review.hunks import Hunk

TRACE_LIMIT = 2_000_000  # lines compared per file at most (texts times the longest)
MAX_LINES = 5_000  # lines of a text traced per line at most (one comparison of two longer ones can take a minute:
# the deadline is only checked between comparisons)
TOO_LONG = "too long to trace per line"
OUT_OF_TIME = "not traced per line: the time for tracing the review's files was spent"
LATER = "changed after the journal's last look"
NO_VERSIONS = "the journal kept no versions of it"
_UNKEPT = {
    "not-text": "not text: the journal keeps the versions of text files only",
    "too-large": "too large for the journal to keep its versions",
    "budget-full": "the journal's room for versions was full",
}


def origin(
    base: bytes | None,
    final: bytes,
    versions: list[tuple[int, bytes]],
    writers: tuple[int, ...],
    flag: str,
    *,
    deadline: float | None = None,
) -> FileOrigin:
    """Who made each line of `final` (the guest's text) and removed each line of `base` (the baseline's, None when
    the file is new), from the journal's `versions` of the file, its `writers` and its `flag` ("-", or why no
    versions were kept). Past `deadline` (time.monotonic()), no line is traced: a guest can make texts whose
    comparison is slow, within every bound on their size."""
    if flag != "-" or not versions:
        # every hunk is then made by all its writers: the whole answer when there is one writer, or no baseline
        # (a new file is one hunk: whoever wrote any of it made it)
        whole = base is None or len(writers) == 1
        return FileOrigin(writers, None, {}, incomplete=None if whole else unkept(flag) if flag != "-" else NO_VERSIONS)
    texts = [base or b"", *(content for _, content in versions)]
    labels: list[int | None] = [None, *(writer for writer, _ in versions)]
    incomplete = None
    if texts[-1] != final:
        texts.append(final)
        labels.append(None)
        incomplete = LATER
    split = [hunks.lines(t) for t in texts]
    longest = max(len(lines) for lines in split)
    if longest > MAX_LINES or longest * len(split) > TRACE_LIMIT:
        return FileOrigin(writers, None, {}, incomplete=TOO_LONG)
    owner: list[int | None] = [None] * len(split[0])  # per line of the text at hand: who made it
    source: list[int | None] = list(range(len(split[0])))  # per line of it: the baseline line it is
    removed: dict[int, int] = {}
    for k in range(1, len(split)):
        if deadline is not None and time.monotonic() > deadline:
            return FileOrigin(writers, None, {}, incomplete=OUT_OF_TIME)
        now: list[int | None] = [labels[k]] * len(split[k])
        kept: list[int | None] = [None] * len(split[k])
        # (compared as hunks.hunks compares, autojunk on: without it a guest's text of a few lines repeated
        # thousands of times takes quadratic time to compare)
        matcher = difflib.SequenceMatcher(None, split[k - 1], split[k])
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag == "equal":
                now[j1:j2], kept[j1:j2] = owner[i1:i2], source[i1:i2]
                continue
            writer = labels[k]
            for i in range(i1, i2):
                line = source[i]
                if line is not None and writer is not None:
                    removed[line] = writer
        owner, source = now, kept
    return FileOrigin(writers, tuple(owner), removed, incomplete)


def unkept(flag: str) -> str:
    """Why a file has no line-level answer, in words, for the journal's flag."""
    return _UNKEPT.get(flag, f"{NO_VERSIONS} ({flag})")


def makers(
    prov: Provenance, path: str, hunk: Hunk | None, *, merged: tuple[bytes, bytes] | None = None
) -> tuple[Maker, ...]:
    """Who made a hunk of the change at `path` (None: the whole change), each writer once, in the order found.

    A hunk counts lines of the texts the review's hunks are made of: the baseline's and the guest's, but for a
    clean merge, the host's and the merged text. There `merged` is (the guest's text, the merged text): the
    merged text's lines are found in the guest's by a line diff, and a hunk's makers are the writers of its
    lines found there (the lines it removes are the host's, known to no journal)."""
    found = prov.files.get(path)
    if found is None:
        return ()
    named: list[int | None] = []  # (None: a line nobody known made)
    if hunk is not None and found.lines is not None:
        lines = found.lines
        if merged is None:
            named += [lines[j] for j in range(hunk.new_start, min(hunk.new_end, len(lines)))]
            named += [found.removed.get(i) for i in range(hunk.old_start, hunk.old_end)]
        else:
            at = _guest_lines(*merged)
            picked = [at[j] for j in range(hunk.new_start, min(hunk.new_end, len(at)))]
            named += [lines[i] for i in picked if i is not None and i < len(lines)]
    ids = [n for n in named if n is not None and n in prov.writers] or [n for n in found.writers if n in prov.writers]
    return tuple(_maker(prov, prov.writers[n]) for n in dict.fromkeys(ids))


def _maker(prov: Provenance, writer: Writer) -> Maker:
    step = prov.step(writer.step)
    return Maker(writer.step, step.command if step else "", writer.argv, writer.exe, writer.badges)


@functools.lru_cache(maxsize=4)  # (the hunks of one file are asked for one by one)
def _guest_lines(guest: bytes, merged: bytes) -> tuple[int | None, ...]:
    """Per line of the merged text: the line of the guest's text it is (None: not the guest's, or too long)."""
    a, b = hunks.lines(guest), hunks.lines(merged)
    if max(len(a), len(b)) > MAX_LINES:
        return ()
    at: list[int | None] = [None] * len(b)
    for tag, i1, i2, j1, _ in difflib.SequenceMatcher(None, a, b).get_opcodes():
        if tag == "equal":
            at[j1 : j1 + i2 - i1] = range(i1, i2)
    return tuple(at)
