"""The guest's word on who wrote what: the change journal's `provenance` answer, read bounded and parsed strictly.

The journal (journal.c) numbers each process that changed the workspace (a writer: its pid, the step it belongs
to by ancestry, its depth below that step's command, the role its environment gave it, its executable and
argv), lists the writers of each changed file, and keeps, for small text files, the file's content right after
each distinct writer's change (its versions). The answer is one record a line:

    provenance INSTANCE STATE
    usage BYTES PATHS WRITERS PROCESSES   (the journal's own figures: version bytes kept, paths, writers, processes)
    step ID PID
    writer N PID STEP DEPTH ROLE =EXE ARGC =ARG...
    file PATH FLAG WRITERS
    version PATH WRITER LENGTH      (the next line: LENGTH characters of base64, the content)
    end COUNT                       (COUNT: the records between the first line and it, base64 lines not counted)

Every byte of it is hostile input: a guest can lie, flood or forge. Each record is checked whole (names and
paths in the journal's escape, numbers bounded, a writer named only after it was declared), everything is
bounded (the answer, writers, files, writers per file, versions per path and their size, argv per writer
and over all writers), and at the first record not understood the answer stops there: what was parsed before it
is kept, marked incomplete, and the caller is never handed an exception. A lying guest can only mislabel its own
changes.
"""

from __future__ import annotations

import base64
import binascii
import re
import shlex
from dataclasses import dataclass, field

from vmsandbox.errors import VmsandboxError
from vmsandbox.guest import commands
from vmsandbox.guest.ssh import Endpoint
from vmsandbox.sync.fetch import journal
from vmsandbox.sync.provenance.model import OUTSIDE, RESERVED, Writer

PROGRAM = journal.PROGRAM
TIMEOUT = 120.0
MAX_ANSWER_BYTES = 8 * 1024**2
MAX_WRITERS = 100_000
MAX_STEPS = 1_000  # steps registered in the guest
MAX_FILE_WRITERS = 64  # writers listed per file
MAX_VERSIONS = 64  # per path
MAX_VERSION_BYTES = 1024**2  # one version, decoded
MAX_ARGS = 256  # argv kept per writer (the rest dropped)
MAX_ARG_BYTES = 4096  # each argument (and the executable) kept, decoded (the rest cut)
MAX_ARGV_CHARS = 1_000_000  # characters of argv kept over all writers (past it, a writer's argv is cut)
MAX_FILES = 200_000  # `file` records (the journal follows at most BOUNDS["paths"] paths)
_MAX_BASE64 = 4 * -(-MAX_VERSION_BYTES // 3)

NOT_UNDERSTOOD = "the guest's journal gave an answer that was not understood"
TOO_LARGE = f"the guest's journal answered more than {MAX_ANSWER_BYTES // 1024**2} MiB: not read"
OLD_IMAGE = "no provenance from this guest (its image predates it: `vmsandbox image build`)"
_INSTANCE = re.compile(r"[0-9a-f]{32}")
_REASON = re.compile(r"[a-z0-9-]{1,64}")
_STEP = re.compile(r"[a-z0-9]{1,32}")
_ROLE = re.compile(r"[a-z0-9:_-]{1,64}")
_NUMBER = re.compile(r"[0-9]{1,10}")
COMPLETE = "complete"


@dataclass(frozen=True)
class Answer:
    instance: str  # the journal daemon that answered ("" when there was no answer)
    state: str  # "complete", or the journal's reason its records are partial ("restarted", "records-full")
    steps: dict[str, int] = field(default_factory=dict)  # the steps registered in the guest: id -> root pid
    writers: dict[int, Writer] = field(default_factory=dict)
    files: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)  # path -> (flag, writers)
    versions: dict[str, list[tuple[int, bytes]]] = field(default_factory=dict)  # path -> (writer, content), in time
    usage: tuple[int, ...] = ()  # the journal's figures: version bytes kept, paths, writers, processes
    incomplete: str | None = None  # why what is here is partial (None: the journal's whole, complete answer)


def ask(endpoint: Endpoint) -> Answer:
    """What the guest's journal says wrote what (one command over the session's SSH); never raises."""
    command = shlex.join([PROGRAM, "provenance"])
    try:
        result = commands.run_as_root(endpoint, command, check=False, timeout=TIMEOUT, max_output=MAX_ANSWER_BYTES)
    except VmsandboxError as exc:
        return Answer("", "", incomplete=f"the guest's journal did not answer ({exc.message})")
    if result.returncode != 0 and not result.stdout.startswith("provenance "):
        old = result.returncode == 127 or "usage" in result.stderr or "usage" in result.stdout
        return Answer(
            "", "", incomplete=OLD_IMAGE if old else f"the guest's journal did not answer (exit {result.returncode})"
        )
    return parse(result.stdout)


def parse(text: str) -> Answer:
    """The journal's answer (see the module's docstring); what came before the first record not understood, with
    `incomplete` set, when it is not all understood."""
    if len(text) > MAX_ANSWER_BYTES:
        return Answer("", "", incomplete=TOO_LARGE)
    lines = text.split("\n")
    head = lines[0].split(" ")
    if len(head) == 4 and head[0] == "walk" and _REASON.fullmatch(head[3]):  # (the journal is not running)
        return Answer("", "", incomplete=f"the guest's journal did not answer ({head[3]})")
    if len(head) != 3 or head[0] != "provenance" or not _INSTANCE.fullmatch(head[1]):
        return Answer("", "", incomplete=OLD_IMAGE if "usage" in lines[0] else NOT_UNDERSTOOD)
    if head[2] != COMPLETE and not _REASON.fullmatch(head[2]):
        return Answer("", "", incomplete=NOT_UNDERSTOOD)
    found = _Parser()
    ended = found.run(lines)
    state = head[2]
    incomplete = None if ended else NOT_UNDERSTOOD
    if incomplete is None and state != COMPLETE:
        incomplete = f"the guest's journal kept only part of its records ({state})"
    return Answer(head[1], state, found.steps, found.writers, found.files, found.versions, found.usage, incomplete)


class _Parser:
    """Records one by one; stops at the first not understood."""

    def __init__(self) -> None:
        self.steps: dict[str, int] = {}
        self.writers: dict[int, Writer] = {}
        self.files: dict[str, tuple[str, tuple[int, ...]]] = {}
        self.versions: dict[str, list[tuple[int, bytes]]] = {}
        self.usage: tuple[int, ...] = ()
        self.argv_left = MAX_ARGV_CHARS  # characters of argv still kept

    def run(self, lines: list[str]) -> bool:
        """Whether the answer was understood to its end (an `end` with the right count, then nothing)."""
        records, at = 0, 1
        while at < len(lines):
            line = lines[at]
            if not line.isascii():
                return False
            kind, _, rest = line.partition(" ")
            if kind == "end":
                return rest == str(records) and lines[at + 1 :] == [""]
            if kind == "version":
                nxt = lines[at + 1] if at + 1 < len(lines) else None
                if nxt is None or not self._version(rest.split(" "), nxt):
                    return False
                at += 2
            else:
                known = {"usage": self._usage, "step": self._step, "writer": self._writer, "file": self._file}.get(kind)
                if known is None or not known(rest.split(" ")):
                    return False
                at += 1
            records += 1
        return False  # no `end`: cut off

    def _usage(self, fields: list[str]) -> bool:
        if self.usage or len(fields) != 4 or not all(_NUMBER.fullmatch(f) for f in fields):
            return False
        self.usage = tuple(int(f) for f in fields)
        return True

    def _step(self, fields: list[str]) -> bool:
        if len(fields) != 2 or not _step_id(fields[0]) or not _NUMBER.fullmatch(fields[1]):
            return False
        if fields[0] in self.steps or len(self.steps) >= MAX_STEPS:
            return False
        self.steps[fields[0]] = int(fields[1])
        return True

    def _writer(self, fields: list[str]) -> bool:
        if len(fields) < 7 or not all(_NUMBER.fullmatch(f) for f in (fields[0], fields[1], fields[6])):
            return False
        number, pid, step, depth, role, exe, argc = fields[:7]
        args = fields[7:]
        if int(number) in self.writers or len(self.writers) >= MAX_WRITERS or int(argc) != len(args):
            return False
        if not (step == "-" or _step_id(step)) or not (depth == "-" or _NUMBER.fullmatch(depth)):
            return False
        if not (role == "-" or _ROLE.fullmatch(role)):
            return False
        named = [_word(f) for f in [exe, *args[:MAX_ARGS]]]
        if any(w is None for w in named) or not all(_word(f) is not None for f in args[MAX_ARGS:]):
            return False
        words = [w for w in named if w is not None]
        kept = 1
        for w in words[1:]:  # (the executable always kept; argv while the answer's room for it lasts)
            if len(w) > self.argv_left:
                break
            self.argv_left -= len(w)
            kept += 1
        words = words[:kept]
        self.writers[int(number)] = Writer(
            int(number), int(pid), OUTSIDE if step == "-" else step, None if depth == "-" else int(depth),
            words[0], tuple(words[1:]), "" if role == "-" else role,
        )  # fmt: skip
        return True

    def _file(self, fields: list[str]) -> bool:
        if len(fields) != 3 or not (fields[1] == "-" or _REASON.fullmatch(fields[1])):
            return False
        path = journal.plain_path(fields[0])
        writers = self._writers(fields[2])
        if path is None or writers is None or path in self.files or len(self.files) >= MAX_FILES:
            return False
        self.files[path] = (fields[1], writers)
        return True

    def _writers(self, listed: str) -> tuple[int, ...] | None:
        """A file's writers (`-`: none), each declared before, at most MAX_FILE_WRITERS, none twice."""
        if listed == "-":
            return ()
        numbers = listed.split(",")
        if len(numbers) > MAX_FILE_WRITERS or not all(_NUMBER.fullmatch(n) for n in numbers):
            return None
        found = tuple(int(n) for n in numbers)
        if len(set(found)) != len(found) or any(n not in self.writers for n in found):
            return None
        return found

    def _version(self, fields: list[str], content: str) -> bool:
        if len(fields) != 3 or not _NUMBER.fullmatch(fields[1]) or not _NUMBER.fullmatch(fields[2]):
            return False
        path, writer, length = journal.plain_path(fields[0]), int(fields[1]), int(fields[2])
        if path is None or writer not in self.writers or length > _MAX_BASE64 or len(content) != length:
            return False
        if len(self.versions.get(path, ())) >= MAX_VERSIONS or not content.isascii():
            return False
        try:
            data = base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError):
            return False
        if len(data) > MAX_VERSION_BYTES:
            return False
        self.versions.setdefault(path, []).append((writer, data))
        return True


def _step_id(word: str) -> bool:
    """A step's id as the guest may name one: [a-z0-9]{1,32}, and none of the words front ends group by."""
    return _STEP.fullmatch(word) is not None and word not in RESERVED


def _word(f: str) -> str | None:
    """An executable or an argument: `=` and its bytes in the journal's escape, cut at MAX_ARG_BYTES (as text:
    bytes that are no UTF-8 shown as replacement characters). None when it is not so written."""
    if not f.startswith("="):
        return None
    raw = journal.unescape(f[1:])
    return None if raw is None else raw[:MAX_ARG_BYTES].decode(errors="replace")
