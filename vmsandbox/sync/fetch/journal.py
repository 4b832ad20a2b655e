"""The guest's change journal: which paths of the workspace changed since the last pull, so that a pull fetches
those instead of walking the whole tree on both sides.

The journal is a daemon in the guest (images/base/rootfs/usr/local/src/vmsandbox/journal.c) with a fanotify
mark on the workspace's file system. Asked "what changed since CURSOR", it answers with the paths, or with
"walk" and a reason when it cannot be sure (it restarted, an event was lost, a hard-linked or memory-mapped
file changed). Either way it gives a new cursor, taken before the host fetches anything, so nothing that
happens during the fetch is missed the next time.

What the guest answers is hostile input like every guest byte: the answer is read bounded, parsed strictly,
every path must be a plain relative path, and anything else is a walk. A lying guest can only hide its own
changes from a pull (as it could by not making them) or make a pull fetch more.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from vmsandbox import filewrite
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest import commands
from vmsandbox.guest.ssh import Endpoint
from vmsandbox.sync.tree import manifest

PROGRAM = "/usr/local/lib/vmsandbox/journal"
TIMEOUT = 60.0
MAX_ANSWER_BYTES = 8 * 1024**2  # more than this many bytes of paths and the host walks instead
_INSTANCE = re.compile(r"[0-9a-f]{32}")
_REASON = re.compile(r"[a-z0-9-]{1,64}")
_ESCAPE = re.compile(rb"\\x([0-9a-f]{2})")
_ESCAPED = re.compile(r"(?:[\x21-\x5b\x5d-\x7e]|\\x(?:[01][0-9a-f]|20|5c|7f|[89a-f][0-9a-f]))*")  # (see unescape)


@dataclass(frozen=True)
class Cursor:
    instance: str  # the journal daemon that issued it ("origin": the first one, from the workspace as made)
    seq: int


ORIGIN = Cursor("origin", 0)


@dataclass(frozen=True)
class Answer:
    cursor: Cursor | None  # the journal's position when it answered (None: no journal, or a bad answer)
    paths: list[str] | None  # what changed since the cursor asked about (each with what is under it); None: walk
    why: str = ""  # why the host must walk


def cursor_file(root: Path) -> Path:
    return root / "journal.json"


def load(root: Path) -> Cursor:
    """The cursor the last fetch left (ORIGIN if there was none; a damaged one is one no journal accepts)."""
    try:
        data = json.loads(cursor_file(root).read_text())
        return Cursor(str(data["instance"]), int(data["seq"]))
    except FileNotFoundError:
        return ORIGIN
    except (OSError, ValueError, KeyError, TypeError):
        return Cursor("damaged", 0)


def save(root: Path, cursor: Cursor) -> None:
    filewrite.write_atomically(cursor_file(root), json.dumps({"instance": cursor.instance, "seq": cursor.seq}))


def ask(endpoint: Endpoint, cursor: Cursor) -> Answer:
    """What the guest's journal says changed since `cursor` (one command over the session's SSH)."""
    command = shlex.join([PROGRAM, "since", cursor.instance, str(cursor.seq)])
    try:
        result = commands.run_as_root(endpoint, command, check=False, timeout=TIMEOUT, max_output=MAX_ANSWER_BYTES)
    except VmsandboxError as exc:
        return Answer(None, None, f"the journal did not answer ({exc.message})")
    if result.returncode != 0:
        return Answer(None, None, f"the journal did not answer (exit {result.returncode})")
    return parse(result.stdout)


def parse(text: str) -> Answer:
    """The journal's answer: `ok ID SEQ COUNT` and COUNT escaped paths, or `walk ID SEQ REASON`."""
    head, _, rest = text.partition("\n")
    fields = head.split(" ")
    if len(fields) != 4 or fields[0] not in ("ok", "walk") or not fields[2].isdigit() or len(fields[2]) > 20:
        return Answer(None, None, "the journal's answer was not understood")
    cursor = Cursor(fields[1], int(fields[2])) if _INSTANCE.fullmatch(fields[1]) else None
    if fields[0] == "walk":
        why = fields[3] if _REASON.fullmatch(fields[3]) else "unexplained"
        return Answer(cursor, None, f"the journal says: {why}")
    lines = rest.split("\n")
    if cursor is None or not fields[3].isdigit() or lines[-1] != "" or len(lines) - 1 != int(fields[3]):
        return Answer(None, None, "the journal's answer was incomplete")
    found: list[str] = []
    for line in lines[:-1]:
        path = plain_path(line)
        if path is None:
            return Answer(None, None, "the journal named an invalid path")
        found.append(path)
    return Answer(cursor, _outermost(found))


def _outermost(found: list[str]) -> list[str]:
    """The named paths without those under another named one (a fetch takes each with all under it; and a
    path under one that is gone or is no directory now cannot be fetched)."""
    named = set(found)
    return sorted(p for p in named if not any(q in named for q in manifest.parents(p)))


def unescape(field: str) -> bytes | None:
    """Bytes as the journal writes them (the bytes 0x21..0x7e as they are but the backslash, every other byte as
    \\xNN in lowercase hex), if written exactly so: a backslash that is no escape, an escape of a byte that needs
    none, or any other character makes it None (a forgery, not the journal's)."""
    if not _ESCAPED.fullmatch(field):
        return None
    return _ESCAPE.sub(lambda m: bytes([int(m.group(1), 16)]), field.encode())


def plain_path(field: str) -> str | None:
    """A path as the journal writes it (see unescape), if it is a plain relative path: not empty, not absolute,
    no empty, "." or ".." component, no NUL."""
    decoded = unescape(field)
    if not decoded:
        return None
    path = decoded.decode("utf-8", "surrogateescape")
    parts = path.split("/")
    if "\0" in path or any(p in ("", ".", "..") for p in parts):
        return None
    return path
