"""How a change reads: a one-line description, a unified diff for text, a summary for anything else.
Everything here is guest content: callers print it escaped."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from vmsandbox.sync.land import write
from vmsandbox.sync.review.gather import Gathered
from vmsandbox.sync.review.threeway import Change
from vmsandbox.sync.tree.manifest import FILE, SYMLINK

BINARY_SNIFF = 8192
DIFF_LIMIT = 1024**2  # larger files are summarised, not diffed


def _head(root: Path, rel: str) -> bytes:
    fd = write.open_nofollow(root, rel)
    if fd is None:
        return b""
    try:
        return os.read(fd, BINARY_SNIFF)
    finally:
        os.close(fd)


def is_text(data: bytes) -> bool:
    if b"\0" in data[:BINARY_SNIFF]:
        return False
    try:
        data.decode()
    except UnicodeDecodeError as exc:
        return len(data) - exc.start < 4 and len(data) >= BINARY_SNIFF  # a character cut at the sniff's end
    return True


def describe(c: Change) -> str:
    g, b = c.guest, c.base
    if g is not None and g.kind == SYMLINK:
        return f"symlink → {g.target}"
    if g is not None and b is not None and g.kind == b.kind == FILE and g.digest == b.digest:
        return f"mode {b.mode & 0o7777:o} → {g.mode & 0o7777:o}"
    if g is not None and g.kind == FILE:
        return f"{b.size if b and b.kind == FILE else 0} → {g.size} bytes"
    return ""


def diff_text(g: Gathered, c: Change) -> str:
    """A unified diff for text, a one-line summary for anything else."""
    files = g.target.files
    head = f"--- a/{c.path}\n+++ b/{c.path}\n"
    if (c.guest and c.guest.kind != FILE) or (c.base and c.base.kind != FILE) or c.kind == "mode changed":
        return f"{c.path}: {c.kind}, {describe(c)}\n"
    old = write.read_nofollow(files.baseline, c.path, limit=DIFF_LIMIT) if c.base else b""
    try:
        new = write.read_as_reviewed(g.source, c.path, c.guest, limit=DIFF_LIMIT)
    except write.ChangedError as exc:
        return f"{c.path}: {exc.message}\n"
    if old is None or new is None:
        sizes = f"{c.base.size if c.base else 0} → {c.guest.size if c.guest else 0} bytes"
        heads = [_head(files.baseline, c.path) if c.base else b"", _head(g.source, c.path) if c.guest else b""]
        if not all(is_text(h) for h in heads):
            return f"Binary file {c.path}: {c.kind}, {sizes}\n"
        return f"{c.path}: {c.kind}, {sizes} (too large to diff)\n"
    if not (is_text(old) and is_text(new)):
        return f"Binary file {c.path}: {c.kind}, {len(old)} → {len(new)} bytes\n"
    return unified(old, new, f"a/{c.path}", f"b/{c.path}") or head


def unified(old: bytes, new: bytes, fromfile: str, tofile: str) -> str:
    """A unified diff of two texts ("" when they are equal)."""
    lines = difflib.unified_diff(
        old.decode(errors="replace").splitlines(keepends=True),
        new.decode(errors="replace").splitlines(keepends=True),
        fromfile=fromfile,
        tofile=tofile,
    )
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


def merge_text(g: Gathered, c: Change) -> str | None:
    """How a merge reads: what it changes in the host's file (a clean one), or the three-way text with its
    conflict markers (host | base | guest); None when no merge was made."""
    if c.merge is None:
        return None
    if c.merge.clean:
        host = write.read_nofollow(g.project, c.path, limit=DIFF_LIMIT) or b""
        return unified(host, c.merge.text, f"host/{c.path}", f"merged/{c.path}") or f"{c.path}: merged, no change\n"
    head = f"=== {c.path}: {c.merge.conflicts} overlapping hunk(s), three-way (host | base | guest)\n"
    return head + c.merge.text.decode(errors="replace")
