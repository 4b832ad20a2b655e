"""Provenance per hunk (issue 60): the guest journal's answer parsed as the hostile input it is, each line of a
changed file traced to its writer and each hunk to its makers, kept with a frozen review and in the session
directory, and a review that never fails for want of it."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.unit.reviewsite import file_entry, made_target
from vmsandbox import proc
from vmsandbox.core import views
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest import commands
from vmsandbox.guest.ssh import Endpoint
from vmsandbox.paths import SessionPaths
from vmsandbox.sync.fetch import journal
from vmsandbox.sync.provenance import answer, attribute, blame, steps, store
from vmsandbox.sync.provenance.answer import Answer
from vmsandbox.sync.provenance.model import OUTSIDE, FileOrigin, Provenance, Step, Writer
from vmsandbox.sync.review import diff, frozen, gather, holds, hunks, plan
from vmsandbox.sync.review.gather import Gathered, Origin
from vmsandbox.sync.review.hunks import Hunk
from vmsandbox.sync.review.threeway import Change, Merge, Status
from vmsandbox.sync.target import Target

ID = "0123456789abcdef0123456789abcdef"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _text(*records: str, state: str = "complete", count: int | None = None) -> str:
    """An answer of these records (a version's record carries its base64 line after a newline) and its end."""
    shown = count if count is not None else len(records)
    return "\n".join([f"provenance {ID} {state}", *records, f"end {shown}", ""])


WRITERS = (
    "step ab12 100",
    "writer 1 101 ab12 0 - =/usr/bin/sed 3 =sed =-i =s/a/b/",
    "writer 2 205 ab12 3 npm:postinstall =/usr/bin/node 2 =node =post\\x20install.js",
    "writer 7 300 - - - = 0",
)


def test_a_whole_answer_reads_back_field_by_field() -> None:
    v1, v2 = b"one\n", b"one\ntwo \xff\n"
    text = _text(
        "usage 3 2 3 40",
        *WRITERS,
        "file src/a\\x20b.py - 1,2",
        "file bin/tool not-text 7",
        "file gone - -",
        f"version src/a\\x20b.py 1 {len(_b64(v1))}\n{_b64(v1)}",
        f"version src/a\\x20b.py 2 {len(_b64(v2))}\n{_b64(v2)}",
        "version empty 7 0\n",
    )
    a = answer.parse(text)
    assert (a.instance, a.state, a.incomplete) == (ID, "complete", None)
    assert a.steps == {"ab12": 100}
    assert a.writers[1] == Writer(1, 101, "ab12", 0, "/usr/bin/sed", ("sed", "-i", "s/a/b/"), "")
    assert a.writers[2] == Writer(2, 205, "ab12", 3, "/usr/bin/node", ("node", "post install.js"), "npm:postinstall")
    assert a.writers[7] == Writer(7, 300, OUTSIDE, None, "", (), "")
    assert a.files == {"src/a b.py": ("-", (1, 2)), "bin/tool": ("not-text", (7,)), "gone": ("-", ())}
    assert a.versions == {"src/a b.py": [(1, v1), (2, v2)], "empty": [(7, b"")]}
    assert a.usage == (3, 2, 3, 40)


def test_a_journal_that_is_not_running_did_not_answer() -> None:
    a = answer.parse("walk - 0 no-journal\n")
    assert (a.writers, a.incomplete) == ({}, "the guest's journal did not answer (no-journal)")


def test_a_journal_that_says_its_records_are_partial_is_taken_as_partial() -> None:
    a = answer.parse(_text(*WRITERS, state="records-full"))
    assert a.state == "records-full" and len(a.writers) == 3
    assert a.incomplete is not None and "records-full" in a.incomplete


GOOD = "writer 1 101 ab12 0 - =/bin/sh 1 =sh"


@pytest.mark.parametrize(
    "bad",
    [
        "writes 2 1 - - - = 0",  # an unknown record
        "writer 2 1 - - - = 2 =a",  # ARGC is not the number of arguments
        "writer 2 1 - - - = 1 =a =b",
        "writer 2 1 AB - - = 0",  # not a step id
        "writer 2 1 - x - = 0",  # not a depth
        "writer 2 1 - - Role = 0",  # not a role
        "writer 2 1 - - - /bin/sh 0",  # an executable without its `=`
        "writer 1 1 - - - = 0",  # a writer declared twice
        "writer -2 1 - - - = 0",
        "writer 99999999999 1 - - - = 0",  # a number past the bound
        "writer 2 1 - - -  = 0",  # two spaces
        "writer 2 1 - - - = 0 ",
        "step ab12 1",  # a step registered twice
        "usage 1 2 3",
        "usage 1 2 3 4 5",
        "step a-b 1",
        "step ab13",
        "file /etc/passwd - 1",
        "file ../up - 1",
        "file a//b - 1",
        "file a/./b - 1",
        "file a\\x00b - 1",
        "file a b - 1",
        "file a - 2",  # a writer never declared
        "file a - 1,1",
        "file a - 1,",
        "file a Not-Text 1",
        "file a - 1 extra",
        "version a 1 4\nAAA",  # shorter than announced
        "version a 1 4\nA!A=",  # not base64
        "version a 1 3\nAAA",  # not padded
        "version a 2 4\nAAAA",  # a writer never declared
        "version /a 1 4\nAAAA",
        "version a 1 4",  # no content line
        "wrïter 2 1 - - - = 0",  # not ASCII
        "",
    ],
)
def test_a_record_not_understood_stops_the_answer_there(bad: str) -> None:
    """What came before is kept; the answer says it was not understood; nothing after the bad record is taken."""
    a = answer.parse(_text("step ab12 100", GOOD, bad, "file after - 1"))
    assert a.incomplete == answer.NOT_UNDERSTOOD
    assert a.steps == {"ab12": 100} and list(a.writers) == [1]
    assert "after" not in a.files and a.files.get("a") is None


def test_a_writer_is_named_only_after_it_is_declared() -> None:
    a = answer.parse(_text("file a - 1", GOOD))
    assert (a.files, a.writers, a.incomplete) == ({}, {}, answer.NOT_UNDERSTOOD)
    content = _b64(b"x\n")
    a = answer.parse(_text(f"version a 1 {len(content)}\n{content}", GOOD))
    assert (a.versions, a.incomplete) == ({}, answer.NOT_UNDERSTOOD)


@pytest.mark.parametrize(
    "text",
    [
        _text(GOOD, count=2),  # a count that does not match
        _text(GOOD, count=0),
        _text(GOOD)[: -len("end 1\n")],  # cut off before its end
        _text(GOOD) + "file a - 1\n",  # something after its end
        _text(GOOD).rstrip("\n"),
        _text(GOOD).replace("end 1", "end  1"),
        _text(GOOD).replace("end 1", "end 01"),
        _text(GOOD).replace("end 1", "end -1"),
    ],
)
def test_an_answer_without_its_exact_end_is_incomplete(text: str) -> None:
    a = answer.parse(text)
    assert a.incomplete == answer.NOT_UNDERSTOOD and list(a.writers) == [1]


@pytest.mark.parametrize(
    "head",
    ["", "provenance", f"provenance {ID}", f"provenance {ID[:-1]} complete", f"provenance {ID} Complete",
     f"provenance {ID} complete extra", f"provenance {ID.upper()} complete", f"ok {ID} 1 0"],
)  # fmt: skip
def test_an_answer_with_no_understood_first_line_says_nothing(head: str) -> None:
    a = answer.parse(f"{head}\n{GOOD}\nend 1\n")
    assert (a.instance, a.writers, a.incomplete) == ("", {}, answer.NOT_UNDERSTOOD)


@pytest.mark.parametrize(
    "field",
    ["\\x41", "\\x5C", "\\X0a", "\\x0A", "\\q", "a\\", "\\x2", "\\x7e", "\\xg0", "\x1b[2J", "\u00e4", "a\tb"],
)
def test_a_forged_escape_is_no_word_of_the_journal(field: str) -> None:
    """The journal escapes exactly the bytes outside 0x21..0x7e and the backslash, as \\xNN in lowercase: an
    escape of a byte that needs none, another form of one, or a raw byte it would have escaped is a forgery."""
    assert journal.unescape(field) is None
    a = answer.parse(_text(f"writer 1 1 - - - ={field} 0"))
    assert (a.writers, a.incomplete) == ({}, answer.NOT_UNDERSTOOD)


def test_the_journal_escape_reads_every_byte_back() -> None:
    every = bytes(range(256))
    written = "".join(chr(b) if 0x21 <= b <= 0x7E and b != 0x5C else f"\\x{b:02x}" for b in every)
    assert journal.unescape(written) == every
    assert journal.unescape("") == b"" and journal.plain_path("") is None
    assert journal.plain_path("a/b\\x5cc") == "a/b\\c" and journal.plain_path("\\xff") == "\udcff"


def test_argv_is_kept_bounded_not_refused() -> None:
    long_arg = "=" + "a" * (answer.MAX_ARG_BYTES + 10)
    many = " ".join(f"=arg{n}" for n in range(answer.MAX_ARGS + 5))
    a = answer.parse(_text(f"writer 1 1 - - - {long_arg} {answer.MAX_ARGS + 5} {many}"))
    w = a.writers[1]
    assert a.incomplete is None
    assert len(w.exe) == answer.MAX_ARG_BYTES and len(w.argv) == answer.MAX_ARGS and w.argv[-1] == "arg255"
    cut = answer.parse(_text("writer 1 1 - - - =" + "\\xc3\\xa4" * answer.MAX_ARG_BYTES + " 0")).writers[1]
    assert cut.exe == "ä" * (answer.MAX_ARG_BYTES // 2)  # (cut at bytes, on a whole character here)


def test_a_forged_argument_past_the_kept_ones_still_refuses_the_writer() -> None:
    many = " ".join(["=a"] * answer.MAX_ARGS + ["=\\x41"])
    a = answer.parse(_text(f"writer 1 1 - - - = {answer.MAX_ARGS + 1} {many}"))
    assert (a.writers, a.incomplete) == ({}, answer.NOT_UNDERSTOOD)


def test_every_count_of_the_answer_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    declared = [f"writer {n} {n} - - - = 0" for n in range(1, answer.MAX_FILE_WRITERS + 2)]
    listed = ",".join(str(n) for n in range(1, answer.MAX_FILE_WRITERS + 2))
    a = answer.parse(_text(*declared, f"file a - {listed}"))
    assert a.incomplete == answer.NOT_UNDERSTOOD and "a" not in a.files
    content = _b64(b"x")
    versions = [f"version a 1 {len(content)}\n{content}"] * (answer.MAX_VERSIONS + 1)
    a = answer.parse(_text(declared[0], *versions))
    assert a.incomplete == answer.NOT_UNDERSTOOD and len(a.versions["a"]) == answer.MAX_VERSIONS
    monkeypatch.setattr(answer, "MAX_WRITERS", 3)
    a = answer.parse(_text(*declared[:4]))
    assert a.incomplete == answer.NOT_UNDERSTOOD and list(a.writers) == [1, 2, 3]


def test_an_oversized_version_or_answer_is_not_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    big = _b64(b"a" * (answer.MAX_VERSION_BYTES + 1))
    a = answer.parse(_text(GOOD, f"version a 1 {len(big)}\n{big}"))
    assert a.incomplete == answer.NOT_UNDERSTOOD and a.versions == {}
    just = _b64(b"a" * answer.MAX_VERSION_BYTES)
    assert answer.parse(_text(GOOD, f"version a 1 {len(just)}\n{just}")).incomplete is None
    monkeypatch.setattr(answer, "MAX_ANSWER_BYTES", 50)
    a = answer.parse(_text(GOOD))
    assert (a.writers, a.incomplete) == ({}, answer.TOO_LARGE)


def _ran(monkeypatch: pytest.MonkeyPatch, code: int, out: str, err: str = "") -> list[str]:
    asked: list[str] = []

    def run_as_root(endpoint: Endpoint, command: str, **kwargs: Any) -> proc.Result:
        asked.append(command)
        assert kwargs["max_output"] == answer.MAX_ANSWER_BYTES and kwargs["check"] is False
        return proc.Result(("ssh",), code, out, err)

    monkeypatch.setattr(commands, "run_as_root", run_as_root)
    return asked


def _endpoint(tmp_path: Path) -> Endpoint:
    return Endpoint("s", 2222, "u", SessionPaths(tmp_path / "session"))


def test_the_guest_is_asked_one_command_and_its_answer_parsed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _ran(monkeypatch, 0, _text(GOOD))
    a = answer.ask(_endpoint(tmp_path))
    assert asked == ["/usr/local/lib/vmsandbox/journal provenance"]
    assert a.incomplete is None and list(a.writers) == [1]


@pytest.mark.parametrize(
    ("code", "out", "err"),
    [(2, "", "usage: journal serve DIR | journal since ID SEQ\n"), (127, "", "journal: not found\n"),
     (0, "usage: journal serve DIR\n", "")],
)  # fmt: skip
def test_a_journal_older_than_provenance_says_the_image_predates_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, out: str, err: str
) -> None:
    _ran(monkeypatch, code, out, err)
    a = answer.ask(_endpoint(tmp_path))
    assert (a.writers, a.incomplete) == ({}, answer.OLD_IMAGE)
    assert "`vmsandbox image build`" in answer.OLD_IMAGE


def test_a_journal_that_fails_otherwise_did_not_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _ran(monkeypatch, 1, "", "out of memory\n")
    assert answer.ask(_endpoint(tmp_path)).incomplete == "the guest's journal did not answer (exit 1)"

    def unreachable(*_args: Any, **_kwargs: Any) -> proc.Result:
        raise VmsandboxError("ssh timed out")

    monkeypatch.setattr(commands, "run_as_root", unreachable)
    assert answer.ask(_endpoint(tmp_path)).incomplete == "the guest's journal did not answer (ssh timed out)"


# ---------------------------------------------------------------- blame

BASE = b"".join(f"line {n}\n".encode() for n in range(20))


def _with(text: bytes, n: int, line: bytes) -> bytes:
    lines = hunks.lines(text)
    lines[n] = line
    return b"".join(lines)


def _prov(origins: dict[str, FileOrigin], steps_: tuple[Step, ...] = ()) -> Provenance:
    writers = {
        1: Writer(1, 101, "ab12", 0, "/usr/bin/sed", ("sed", "-i", "s/2/two/", "f")),
        2: Writer(2, 205, "ab12", 2, "/usr/bin/node", ("node", "postinstall.js"), "npm:postinstall"),
        3: Writer(3, 300, OUTSIDE, None, "/bin/sh", ("sh",)),
    }
    return Provenance(steps_ or (Step("ab12", "npm install", 1.0),), writers, origins)


def _who(prov: Provenance, path: str, hunk: Hunk | None, **kw: Any) -> list[tuple[str, ...]]:
    return [m.argv for m in blame.makers(prov, path, hunk, **kw)]


SED, NODE, SH = ("sed", "-i", "s/2/two/", "f"), ("node", "postinstall.js"), ("sh",)


def test_each_hunk_is_traced_to_the_writer_that_made_it() -> None:
    """The issue's case: one writer changes line 2, a postinstall script line 18; each hunk names its own."""
    v1 = _with(BASE, 2, b"line two\n")
    v2 = _with(v1, 18, b"line eighteen\n")
    o = blame.origin(BASE, v2, [(1, v1), (2, v2)], (1, 2), "-")
    assert o.incomplete is None and o.lines is not None
    assert [n for n, w in enumerate(o.lines) if w is not None] == [2, 18]
    assert (o.lines[2], o.lines[18], o.removed) == (1, 2, {2: 1, 18: 2})
    h0, h1 = hunks.hunks(BASE, v2)
    prov = _prov({"f": o})
    assert _who(prov, "f", h0) == [SED] and _who(prov, "f", h1) == [NODE]
    assert _who(prov, "f", None) == [SED, NODE]
    m = blame.makers(prov, "f", h1)[0]
    assert (m.step, m.command, m.exe, m.badges) == ("ab12", "npm install", "/usr/bin/node", ("install script",))


def test_a_new_file_is_all_its_writers_and_a_line_kept_keeps_its_maker() -> None:
    v1 = b"a\nb\n"
    v2 = b"a\nb\nc\n"
    o = blame.origin(None, v2, [(1, v1), (3, v2)], (1, 3), "-")
    assert o.lines == (1, 1, 3) and o.removed == {}
    (h,) = hunks.hunks(b"", v2)
    assert _who(_prov({"n": o}), "n", h) == [SED, SH]


def test_a_removed_line_is_its_removers() -> None:
    v1 = _with(BASE, 2, b"line two\n")
    v2 = b"".join(hunks.lines(v1)[:5] + hunks.lines(v1)[6:])  # line 5 deleted
    o = blame.origin(BASE, v2, [(1, v1), (3, v2)], (1, 3), "-")
    assert o.removed == {2: 1, 5: 3}
    h0, h1 = hunks.hunks(BASE, v2)
    assert (h1.old_start, h1.old_end, h1.new_start, h1.new_end) == (5, 6, 5, 5)
    assert _who(_prov({"f": o}), "f", h1) == [SH] and _who(_prov({"f": o}), "f", h0) == [SED]


def test_what_changed_after_the_journals_last_look_is_nobodys_known() -> None:
    v1 = _with(BASE, 2, b"line two\n")
    final = _with(v1, 10, b"written later\n")
    o = blame.origin(BASE, final, [(1, v1)], (1, 3), "-")
    assert o.incomplete == blame.LATER and o.lines is not None
    assert (o.lines[2], o.lines[10]) == (1, None)
    h0, h1 = hunks.hunks(BASE, final)
    prov = _prov({"f": o})
    assert _who(prov, "f", h0) == [SED]
    assert _who(prov, "f", h1) == [SED, SH]  # no line says: every writer of the file


@pytest.mark.parametrize("flag", ["too-large", "not-text", "budget-full", "journal-restarted"])
def test_a_file_whose_versions_were_not_kept_names_every_writer(flag: str) -> None:
    o = blame.origin(BASE, BASE + b"more\n", [(2, BASE + b"more\n")], (2, 1), flag)
    assert o.lines is None and o.incomplete is not None and flag.replace("-", " ") not in ("",)
    assert o.incomplete == blame.unkept(flag)
    (h,) = hunks.hunks(BASE, BASE + b"more\n")
    assert _who(_prov({"f": o}), "f", h) == [NODE, SED]
    assert "too large" in blame.unkept("too-large") and "journal-restarted" in blame.unkept("journal-restarted")


def test_a_file_too_long_to_trace_has_no_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    v1 = _with(BASE, 2, b"x\n")
    assert blame.origin(BASE, v1, [(1, v1)], (1,), "-").lines is not None
    monkeypatch.setattr(blame, "TRACE_LIMIT", 39)  # two texts of 20 lines: 40
    o = blame.origin(BASE, v1, [(1, v1)], (1,), "-")
    assert (o.lines, o.incomplete) == (None, blame.TOO_LONG)
    long = b"x\n" * (hunks.HUNK_LINES + 1)
    assert blame.origin(None, long, [(1, long)], (1,), "-").incomplete == blame.TOO_LONG


def test_tracing_stops_when_its_time_is_spent(target: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    """A guest can make texts slow to compare within every bound on their size: past the deadline a file keeps its
    writers and no lines."""
    v1 = _with(BASE, 2, b"x\n")
    assert blame.origin(BASE, v1, [(1, v1)], (1,), "-", deadline=time.monotonic() + 60).lines is not None
    o = blame.origin(BASE, v1, [(1, v1)], (1,), "-", deadline=time.monotonic() - 1)
    assert (o.lines, o.incomplete) == (None, blame.OUT_OF_TIME)
    changes = _changes(target, v1, v1)
    monkeypatch.setattr(attribute, "TRACE_SECONDS", -1.0)
    prov = attribute.provenance(_answer_of({"f.txt": [(1, v1)]}), (), changes, target.files.baseline,
                                target.files.guest_tree)  # fmt: skip
    assert prov.files["f.txt"] == FileOrigin((1,), None, {}, blame.OUT_OF_TIME)


def test_a_clean_merges_hunks_are_found_back_in_the_guests_lines() -> None:
    """A clean merge's hunks count the host's lines and the merged text's: its new lines are found in the guest's
    text, and their writers named; a hunk of lines found nowhere there names every writer of the file."""
    v1 = _with(BASE, 2, b"line two\n")
    v2 = _with(v1, 18, b"line eighteen\n")
    o = blame.origin(BASE, v2, [(1, v1), (2, v2)], (1, 2), "-")
    host = _with(b"header\n" + BASE, 11, b"host's line 10\n")  # the host added a line on top, changed another
    merged = _with(_with(host, 3, b"line two\n"), 19, b"line eighteen\n")
    h0, h1 = hunks.hunks(host, merged)
    assert (h0.new_start, h1.new_start) == (3, 19)
    prov = _prov({"f": o})
    assert _who(prov, "f", h0, merged=(v2, merged)) == [SED] and _who(prov, "f", h1, merged=(v2, merged)) == [NODE]
    assert _who(prov, "f", h0) == [SED, NODE]  # (line 3 of the guest's is the baseline's: nobody's)
    other = Hunk(9, 0, 1, 0, 1)  # the host's own header line: not the guest's
    assert _who(prov, "f", other, merged=(v2, merged)) == [SED, NODE]


def test_makers_of_an_unknown_file_or_step_say_what_is_known() -> None:
    prov = _prov({"f": FileOrigin((3, 9, 3))})  # (9: a writer the answer never declared)
    assert blame.makers(prov, "other", None) == ()
    (m,) = blame.makers(prov, "f", None)
    assert (m.step, m.command, m.badges) == (OUTSIDE, "", ("outside any step",))
    lying = _prov({"f": FileOrigin((3,), (9, None), {0: 9})})  # lines of a writer never declared: the file's
    assert _who(lying, "f", Hunk(0, 0, 1, 0, 1)) == [SH]
    stranger = Provenance((), {1: Writer(1, 1, "zz9", 0, "/bin/x", ("x",))}, {"f": FileOrigin((1,))})
    assert blame.makers(stranger, "f", None)[0].command == ""


# ---------------------------------------------------------------- over a review


_file = file_entry


@pytest.fixture
def target(tmp_path: Path) -> Target:
    return made_target(tmp_path)


def _answer_of(versions: dict[str, list[tuple[int, bytes]]], flags: dict[str, str] | None = None) -> Answer:
    records = [*WRITERS]
    for path, kept in versions.items():
        writers = ",".join(dict.fromkeys(str(w) for w, _ in kept)) or "-"
        records.append(f"file {path} {(flags or {}).get(path, '-')} {writers}")
        records += [f"version {path} {w} {len(_b64(v))}\n{_b64(v)}" for w, v in kept]
    a = answer.parse(_text(*records))
    assert a.incomplete is None
    return a


def _changes(target: Target, v1: bytes, v2: bytes) -> list[Change]:
    files = target.files
    (files.baseline / "f.txt").write_bytes(BASE)
    (files.guest_tree / "f.txt").write_bytes(v2)
    (files.guest_tree / "new.txt").write_bytes(b"new\n")
    (files.guest_tree / "blob").write_bytes(b"\0\1")
    return [
        Change("f.txt", _file(BASE), _file(v2), _file(BASE), Status.APPLY),
        Change("new.txt", None, _file(b"new\n"), None, Status.APPLY),
        Change("blob", None, _file(b"\0\1"), None, Status.APPLY, binary=True),
        Change("quiet.txt", None, _file(b"q"), None, Status.APPLY),
    ]


def test_a_reviews_provenance_traces_each_changed_file_it_names(target: Target) -> None:
    v1 = _with(BASE, 2, b"line two\n")
    v2 = _with(v1, 18, b"line eighteen\n")
    changes = _changes(target, v1, v2)
    found = _answer_of({"f.txt": [(1, v1), (2, v2)], "new.txt": [(7, b"new\n")], "blob": [(7, b"\0\1")]})
    found.steps["guest1"] = 5
    host = (Step("ab12", "npm install", 1.0, 2.0, 0),)
    prov = attribute.provenance(found, host, changes, target.files.baseline, target.files.guest_tree)
    assert [(s.id, s.command, s.how) for s in prov.steps] == [
        ("ab12", "npm install", "exec"), ("guest1", attribute.GUEST_STEP, "guest"),
    ]  # fmt: skip
    assert set(prov.files) == {"f.txt", "new.txt", "blob"}  # (quiet.txt: the journal said nothing of it)
    assert prov.files["f.txt"].removed == {2: 1, 18: 2}
    assert prov.files["new.txt"].lines == (7,)
    assert prov.files["blob"] == FileOrigin((7,))  # binary: its writers, no lines

    g = Gathered(target, changes, target.files.guest_tree, False, Origin.LIVE, None, 1024**2, provenance=prov)
    review = plan.make(g)
    assert views.provenance(review) is prov and views.steps(review) == prov.steps
    texts = views.texts(review, changes[0])
    assert texts is not None
    h0, h1 = views.hunks_of(*texts)
    assert [m.argv for m in views.made_by(review, changes[0], h0)] == [("sed", "-i", "s/a/b/")]
    assert [m.argv for m in views.made_by(review, changes[0], h1)] == [("node", "post install.js")]
    assert views.made_by(review, changes[3], None) == ()
    bare = plan.make(Gathered(target, changes, target.files.guest_tree, False, Origin.LIVE, None, 1024**2))
    assert views.made_by(bare, changes[0], h0) == () and views.steps(bare) == ()


def test_a_clean_merge_is_traced_through_the_guests_text(target: Target) -> None:
    v1 = _with(BASE, 2, b"line two\n")
    v2 = _with(v1, 18, b"line eighteen\n")
    (target.files.baseline / "f.txt").write_bytes(BASE)
    (target.files.guest_tree / "f.txt").write_bytes(v2)
    host = b"host header\n" + BASE
    (target.project / "f.txt").write_bytes(host)
    merged = _with(_with(host, 3, b"line two\n"), 19, b"line eighteen\n")
    c = Change("f.txt", _file(BASE), _file(v2), _file(host), Status.MERGED, merge=Merge(merged, 0))
    found = _answer_of({"f.txt": [(1, v1), (2, v2)]})
    prov = attribute.provenance(found, (), [c], target.files.baseline, target.files.guest_tree)
    review = plan.make(
        Gathered(target, [c], target.files.guest_tree, False, Origin.LIVE, None, 1024**2, provenance=prov)
    )
    texts = views.texts(review, c)
    assert texts == (host, merged)
    h0, h1 = views.hunks_of(*texts)
    assert (h0.new_start, h1.new_start) == (3, 19)  # (lines 2 and 18 of the guest's text)
    assert [m.argv for m in views.made_by(review, c, h0)] == [("sed", "-i", "s/a/b/")]
    assert [m.argv for m in views.made_by(review, c, h1)] == [("node", "post install.js")]
    (target.files.guest_tree / "f.txt").write_bytes(b"other\n")  # no longer what the review saw: the file's writers
    assert [m.argv for m in views.made_by(review, c, h0)] == [("sed", "-i", "s/a/b/"), ("node", "post install.js")]


def test_the_text_traced_is_at_least_what_a_review_shows_as_hunks() -> None:
    """A file a review shows hunks of (up to diff.DIFF_LIMIT) is read whole to trace it."""
    assert attribute.LIMIT >= diff.DIFF_LIMIT


def test_a_file_that_cannot_be_read_again_keeps_its_writers(target: Target) -> None:
    v1 = _with(BASE, 2, b"line two\n")
    changes = _changes(target, v1, v1)
    (target.files.guest_tree / "f.txt").write_bytes(b"changed since the review\n")
    found = _answer_of({"f.txt": [(1, v1)]})
    prov = attribute.provenance(found, (), changes, target.files.baseline, target.files.guest_tree)
    assert prov.files["f.txt"] == FileOrigin((1,), incomplete=attribute.UNREAD)
    assert attribute.provenance(None, (), changes, target.files.baseline, target.files.guest_tree).incomplete == (
        attribute.NO_ANSWER
    )


def _provenance_of_a_review(target: Target) -> tuple[Provenance, list[Change]]:
    v1 = _with(BASE, 2, b"line two\n")
    changes = _changes(target, v1, v1)
    found = _answer_of({"f.txt": [(1, v1)], "new.txt": [(7, b"new\n")]}, {"new.txt": "budget-full"})
    host = (Step("ab12", "npm install", 1.0, 2.0, 0, "run", ("allowed GET registry.npmjs.org:443",)),)
    return attribute.provenance(found, host, changes, target.files.baseline, target.files.guest_tree), changes


def test_a_frozen_review_carries_its_provenance(target: Target) -> None:
    prov, changes = _provenance_of_a_review(target)
    assert set(prov.writers) == {1, 7}  # (writer 2 wrote nothing this review shows)
    g = Gathered(target, changes, target.files.guest_tree, False, Origin.LIVE, None, 1024**2, provenance=prov)
    shown = frozen.freeze(plan.make(g))
    back = frozen.load(target, shown.id).gathered.provenance
    assert back == prov
    where = target.files.root / frozen.REVIEWS / f"{shown.id}.json"
    where.write_text(where.read_text().replace('"provenance": "', '"was": "'))  # frozen before there was any
    assert frozen.load(target, shown.id).gathered.provenance is None


def test_the_last_answer_is_kept_and_a_file_changed_since_loses_its_lines(target: Target) -> None:
    prov, changes = _provenance_of_a_review(target)
    root = target.files.root
    assert store.load(root, changes) is None
    store.save(root, prov, changes)
    assert store.load(root, changes) == prov
    later = [Change("f.txt", _file(BASE), _file(b"later\n"), _file(BASE), Status.APPLY), *changes[1:]]
    again = store.load(root, later)
    assert again is not None and again.files["f.txt"] == FileOrigin((1,), incomplete=blame.LATER)
    assert again.files["new.txt"] == prov.files["new.txt"] and again.writers == prov.writers
    (root / store.NAME).write_text('{"steps": [')
    assert store.load(root, changes) is None


def test_a_review_without_a_live_journal_takes_the_kept_answer_with_the_steps_of_now(target: Target) -> None:
    prov, changes = _provenance_of_a_review(target)
    files = target.files
    assert attribute.for_review(files, changes, files.guest_tree, None) is None  # nothing kept, no step
    step = steps.begin(files, "make", "exec")
    kept = attribute.for_review(files, changes, files.guest_tree, None)
    assert kept is not None and kept.steps == (step,) and kept.files == {} and kept.incomplete
    store.save(files.root, Provenance((*prov.steps, Step("g1", attribute.GUEST_STEP, 0.0, how="guest")),
                                      prov.writers, prov.files), changes)  # fmt: skip
    kept = attribute.for_review(files, changes, files.guest_tree, None)
    assert kept is not None and [s.id for s in kept.steps] == [step.id, "g1"]
    assert kept.files == prov.files


def test_a_review_is_never_failed_by_its_provenance(target: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    """gather: a live review asks the journal and keeps the answer; an answer that cannot be had or traced
    leaves the review without provenance, saying why, never without the review."""
    v1 = _with(BASE, 2, b"line two\n")
    changes = _changes(target, v1, v1)
    files = target.files
    base = {c.path: c.base for c in changes if c.base is not None}
    guest = {c.path: c.guest for c in changes if c.guest is not None}
    scope = frozenset(guest)

    def fetch(*_args: Any, **_kwargs: Any) -> gather.Fetched:
        return base, guest, scope, files.guest_tree, Origin.LIVE

    monkeypatch.setattr(gather, "fetch", fetch)
    monkeypatch.setattr(holds, "mark_held", lambda *_a: None)
    monkeypatch.setattr(holds, "mark_credentials", lambda *_a: None)
    endpoint = _endpoint(target.files.root.parent)

    monkeypatch.setattr(answer, "ask", lambda _e: _answer_of({"f.txt": [(1, v1)]}))
    g = gather.gather(target, endpoint=endpoint, limit=1024**2)
    assert g.provenance is not None and g.provenance.files["f.txt"].lines is not None
    assert store.load(files.root, g.changes) == g.provenance  # kept for a review without a live journal

    def fails(_e: Endpoint) -> Answer:
        raise VmsandboxError("the guest went away")

    monkeypatch.setattr(answer, "ask", fails)
    g = gather.gather(target, endpoint=endpoint, limit=1024**2)
    assert g.provenance is not None and g.provenance.files == {}
    assert g.provenance.incomplete is not None and "the guest went away" in g.provenance.incomplete
    assert [c.path for c in g.changes] == ["blob", "f.txt", "new.txt", "quiet.txt"]

    def breaks(*_args: Any) -> Provenance:
        raise OSError("disk full")

    monkeypatch.setattr(answer, "ask", lambda _e: Answer("", "", incomplete=answer.OLD_IMAGE))
    assert gather.gather(target, endpoint=endpoint, limit=1024**2).provenance == Provenance(
        (), {}, {}, answer.OLD_IMAGE
    )
    monkeypatch.setattr(attribute, "provenance", breaks)
    g = gather.gather(target, endpoint=endpoint, limit=1024**2)
    assert g.provenance is not None and "disk full" in (g.provenance.incomplete or "")


# ---------------------------------------------------------------- bounds (the audit's findings)


def test_the_guest_may_register_few_steps_and_none_named_as_a_group() -> None:
    """H1, L2: at most 1,000 steps registered in the guest are read, and `outside` or `untraced` is never a step's
    id (it would take over the group of that name in every front end)."""
    assert answer.MAX_STEPS == 1_000
    many = [f"step g{n} {n}" for n in range(answer.MAX_STEPS + 1)]
    a = answer.parse(_text(*many))
    assert a.incomplete == answer.NOT_UNDERSTOOD and len(a.steps) == answer.MAX_STEPS
    for word in ("outside", "untraced"):
        a = answer.parse(_text("step ab12 1", f"step {word} 2"))
        assert a.incomplete == answer.NOT_UNDERSTOOD and list(a.steps) == ["ab12"]
        a = answer.parse(_text("step ab12 1", f"writer 1 101 {word} 0 - =/bin/sh 0"))
        assert a.incomplete == answer.NOT_UNDERSTOOD and a.writers == {}


def test_steps_only_the_guest_registered_are_capped_and_counted(target: Target) -> None:
    """H1: such steps have no time (so no egress) and at most MAX_GUEST_STEPS of them are kept, in the answer's
    order; the rest are counted in what the provenance says is partial."""
    found = Answer(ID, "complete", steps={f"g{n}": n for n in range(attribute.MAX_GUEST_STEPS + 50)})
    host = (Step("ab12", "make", 1.0, 2.0, 0),)
    prov = attribute.provenance(found, host, [], target.files.baseline, target.files.guest_tree)
    assert len(prov.steps) == 1 + attribute.MAX_GUEST_STEPS and prov.steps[1].id == "g0"
    assert prov.incomplete == "50 more step(s) registered in the guest are not shown"
    assert prov.step("g99") is prov.steps[100] and prov.step("g100") is None


def test_a_step_is_found_by_its_id_without_a_scan() -> None:
    """H1: makers name their step by id; a Provenance keeps one mapping of them, made once."""
    many = tuple(Step(f"g{n}", attribute.GUEST_STEP, 0.0, how="guest") for n in range(1000))
    prov = Provenance(many, {}, {})
    assert prov.step("g999") is many[-1] and prov.step("nope") is None
    assert "_by_id" in prov.__dict__ and len(prov.__dict__["_by_id"]) == 1000  # (kept, not rebuilt per call)


def test_a_reviews_lines_are_bounded_and_stored_as_runs(target: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    """H2: the lines kept over a review's files are bounded (past it a file keeps its writers, saying why), and
    stored run-length encoded."""
    v1 = _with(BASE, 2, b"line two\n")
    changes = _changes(target, v1, v1)
    found = _answer_of({"f.txt": [(1, v1)], "new.txt": [(7, b"new\n")]})
    prov = attribute.provenance(found, (), changes, target.files.baseline, target.files.guest_tree)
    assert prov.files["f.txt"].lines == (None, None, 1, *([None] * 17))
    said = store.to_json(prov)["files"]["f.txt"]
    assert said["lines"] == [[None, 2], [1, 1], [None, 17]] and said["removed"] == [[2, 1, 1]]
    assert store.from_json(store.to_json(prov)) == Provenance(prov.steps, prov.writers, prov.files, prov.incomplete)
    monkeypatch.setattr(attribute, "MAX_TRACED_LINES", 21)  # f.txt: 20 lines and a removal; new.txt: one more
    prov = attribute.provenance(found, (), changes, target.files.baseline, target.files.guest_tree)
    assert prov.files["f.txt"].lines is not None
    assert prov.files["new.txt"] == FileOrigin((7,), incomplete=attribute.TOO_MANY_LINES)
    too_many = {**said, "lines": [[None, blame.MAX_LINES + 2]]}
    with pytest.raises(ValueError):
        store.from_json({**store.to_json(prov), "files": {"f.txt": too_many}})


def test_a_frozen_reviews_provenance_never_fails_its_load(target: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    """H2: provenance too large is frozen without its lines, or not at all; one that does not parse, or is too
    large to read, is read as none: the review loads (and applies) all the same."""
    prov, changes = _provenance_of_a_review(target)
    g = Gathered(target, changes, target.files.guest_tree, False, Origin.LIVE, None, 1024**2, provenance=prov)
    shown = frozen.freeze(plan.make(g))
    where = target.files.root / frozen.REVIEWS / f"{shown.id}.json"
    data = json.loads(where.read_text())
    bad: list[object] = ["{not json", json.dumps({"steps": "x"}), "[" * 100_000 + "]" * 100_000, {"steps": []}]
    for each in bad:
        where.write_text(json.dumps({**data, "provenance": each}))
        loaded = frozen.load(target, shown.id)
        assert loaded.gathered.provenance is None and len(loaded.todo) == len(shown.todo)
    monkeypatch.setattr(frozen, "MAX_PROVENANCE_BYTES", len(data["provenance"]) - 1)
    where.write_text(json.dumps(data))
    assert frozen.load(target, shown.id).gathered.provenance is None
    long = Provenance(prov.steps, prov.writers, {"f.txt": FileOrigin((1,), (1, None) * 1000)})
    bare = Provenance(prov.steps, prov.writers, {"f.txt": FileOrigin((1,), incomplete=frozen.UNKEPT_LINES)})
    monkeypatch.setattr(frozen, "MAX_PROVENANCE_BYTES", len(json.dumps(store.to_json(bare))))
    g = Gathered(target, changes, target.files.guest_tree, False, Origin.LIVE, None, 1024**2, provenance=long)
    lines_dropped = frozen.freeze(plan.make(g))
    back = frozen.load(target, lines_dropped.id).gathered.provenance
    assert back is not None and back.files["f.txt"] == FileOrigin((1,), incomplete=frozen.UNKEPT_LINES)
    monkeypatch.setattr(frozen, "MAX_PROVENANCE_BYTES", 10)
    assert frozen.load(target, frozen.freeze(plan.make(g)).id).gathered.provenance is None


def test_the_answer_its_files_and_argv_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """M3: the answer is at most 8 MiB, its `file` records are counted, and argv is kept up to a total over all
    writers (past it a writer's argv is cut, the writer kept)."""
    assert answer.MAX_ANSWER_BYTES == 8 * 1024**2
    monkeypatch.setattr(answer, "MAX_FILES", 2)
    a = answer.parse(_text(GOOD, "file a - 1", "file b - 1", "file c - 1"))
    assert a.incomplete == answer.NOT_UNDERSTOOD and list(a.files) == ["a", "b"]
    monkeypatch.setattr(answer, "MAX_ARGV_CHARS", 10)
    a = answer.parse(_text("writer 1 1 - - - =/bin/x 2 =abcdef =ghij", "writer 2 2 - - - =/bin/y 2 =k =l"))
    assert a.incomplete is None
    assert (a.writers[1].argv, a.writers[2].argv, a.writers[2].exe) == (("abcdef", "ghij"), (), "/bin/y")


def test_a_text_longer_than_the_trace_bound_is_not_traced_per_line() -> None:
    """M4: one comparison of two long texts can take a minute (the deadline is only checked between them): texts
    of more than MAX_LINES lines are not traced, nor is a clean merge's text found back in the guest's."""
    assert blame.MAX_LINES == 5_000
    n = blame.MAX_LINES + 1
    a = b"".join(b"line %d\n" % i for i in range(n))
    b = b"".join(b"line %d\n" % (i // 2 if i % 2 == 0 else n // 2 + i // 2) for i in range(n))
    started = time.monotonic()
    assert blame.origin(None, b, [(1, a), (2, b)], (1, 2), "-").incomplete == blame.TOO_LONG
    assert blame._guest_lines(a, b) == ()
    assert time.monotonic() - started < 1.0
