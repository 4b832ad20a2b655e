"""Who made each change, in every front end, without a VM: `vmsandbox diff --json` and `--by step`, the lines beside
a hunk at `pull`'s prompt, the page's badges, timeline and take or leave per step, the API's review and MCP's. The
guest's words (argv, exe, role, egress lines) are hostile: escaped and bounded wherever a person sees them, and
never a reason to hold or apply anything."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from vmsandbox.core import views
from vmsandbox.core.views import madeby
from vmsandbox.sync.provenance.model import OUTSIDE, FileOrigin, Provenance, Step, Writer
from vmsandbox.sync.review.plan import Plan
from vmsandbox.sync.review.threeway import Change, Status
from vmsandbox.sync.tree.manifest import FILE, Entry

BASE = b"one\ntwo\nthree\n"
GUEST = b"one\nTWO\nthree\nfour\n"  # h0: two -> TWO (step 1's sed), h1: four added (step 2's install script)
HOSTILE = "\x1b[31mred\nnext line\u202eevil" + "x" * 5000  # an argv word: an escape, a newline, a bidi override
SED = "sed -i s/two/TWO/ a.txt"
STEPS = (  # listed out of order: shown in the order they started
    Step("s2", "npm install", 200.0, 212.5, 0),  # (its egress: the proxy's log of its time, written by _plan)
    Step("s1", SED, 100.0, 100.4, 0),
    Step("s3", "make", 300.0, None, None),
)
WRITERS = {
    1: Writer(1, 41, "s1", 0, "/usr/bin/sed", ("sed", "-i", "s/two/TWO/", "a.txt")),
    2: Writer(2, 52, "s2", 2, "/usr/bin/node", ("node", "postinstall.js"), role="npm:postinstall"),
    3: Writer(3, 63, OUTSIDE, None, "/bin/sh\x1b]0;title\x07", ("sh", "-c", HOSTILE)),
}
PROVENANCE = Provenance(
    STEPS,
    WRITERS,
    {
        "a.txt": FileOrigin((1, 2), lines=(None, 1, None, 2), removed={1: 1}),
        "evil.txt": FileOrigin((3,), lines=(3,)),
    },
)


def _entry(data: bytes) -> Entry:
    return Entry(FILE, 0o644, len(data), digest=hashlib.sha256(data).hexdigest())


def _plan(tmp_path: Path, provenance: Provenance | None = PROVENANCE) -> Plan:
    """a.txt modified by two steps (a hunk each), evil.txt written outside any step by a hostile writer, blob.bin
    (binary) that no writer was named for."""
    from vmsandbox.paths import SessionPaths
    from vmsandbox.sync.review.gather import Gathered, Origin
    from vmsandbox.sync.review.plan import make
    from vmsandbox.sync.target import Target

    files = SessionPaths(tmp_path / "session")
    project, source = tmp_path / "project", tmp_path / "guest"
    for where in (files.baseline, project, source):
        where.mkdir(parents=True)
    for where in (files.baseline, project):
        (where / "a.txt").write_bytes(BASE)
    (source / "a.txt").write_bytes(GUEST)
    (source / "evil.txt").write_bytes(b"evil\n")
    (source / "blob.bin").write_bytes(b"\x00\x01\x02")
    found = [
        Change("a.txt", _entry(BASE), _entry(GUEST), _entry(BASE), Status.APPLY),
        Change("blob.bin", None, _entry(b"\x00\x01\x02"), None, Status.APPLY, binary=True),
        Change("evil.txt", None, _entry(b"evil\n"), None, Status.APPLY),
    ]
    files.proxy_log.parent.mkdir(parents=True, exist_ok=True)
    events = [{"ts": 150.0, "decision": "allow", "method": "GET", "host": "between.example", "port": 443},
              {"ts": 205.0, "decision": "allow", "method": "GET", "host": "registry.npmjs.org", "port": 443},
              {"ts": 206.0, "decision": "deny", "method": "CONNECT", "host": HOSTILE, "port": 443}]  # fmt: skip
    files.proxy_log.write_text("".join(json.dumps(e) + "\n" for e in events))
    target = Target("s1", project, files, os.getuid(), os.getgid())
    made = make(Gathered(target, found, source, False, Origin.LIVE, None, 1024**2, provenance=provenance))
    made.id = "0" * 32  # (as frozen.freeze names it)
    return made


def _clean(text: str) -> None:
    """Nothing of the hostile argv acts on a terminal or a page: no escape, no bidi override, no bell."""
    assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text
    assert not any(line.startswith("next line") for line in text.splitlines())


def test_each_hunk_is_traced_to_its_step_and_writer(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    a = plan.shown[0]
    made = madeby.made(plan, a)
    assert [(m.hunk.index if m.hunk else None, [k.step for k in m.makers]) for m in made] == [(0, ["s1"]), (1, ["s2"])]
    assert made[1].makers[0].badges == ("install script",) and made[1].makers[0].command == "npm install"
    assert madeby.own(made[0].makers[0]) and not madeby.own(made[1].makers[0])
    assert [s.id for s in madeby.steps(plan)] == ["s1", "s2", "s3"]
    assert madeby.numbers(plan) == {"s1": 1, "s2": 2, "s3": 3}
    guest = Step("g1", "(registered in the guest)", 0.0, how="guest")  # no time of the host's: last
    later = _plan(tmp_path / "g", dataclasses.replace(PROVENANCE, steps=(guest, *STEPS)))
    assert [s.id for s in madeby.steps(later)] == ["s1", "s2", "s3", "g1"]
    assert (
        madeby.step_line(guest, 4) == "step 4  (registered in the guest)  no exit code  no time kept  0 egress requests"
    )


def test_provenance_never_changes_what_is_held_or_applied(tmp_path: Path) -> None:
    traced, untraced = _plan(tmp_path / "t"), _plan(tmp_path / "u", None)
    assert [views.fingerprint(i) for i in traced.todo] == [views.fingerprint(i) for i in untraced.todo]
    take = views.Take()
    safe = [[i.label for i in views.Decisions.safe(p, take).accept] for p in (traced, untraced)]
    assert safe[0] == safe[1]
    assert [views.holds(i) for i in traced.todo] == [views.holds(i) for i in untraced.todo]


# -- the terminal ------------------------------------------------------------------------------------------------


def _cli(args: list[str], plan: Plan, monkeypatch: pytest.MonkeyPatch) -> int:
    from vmsandbox.cli import main
    from vmsandbox.core import reviews

    monkeypatch.setattr(reviews, "review", lambda name, only, freeze=True: plan)
    with pytest.raises(SystemExit) as exc:
        main.main(args)
    return int(exc.value.code or 0)


def test_diff_json_gives_the_steps_and_who_made_each_hunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _cli(["diff", "s1", "--json"], _plan(tmp_path), monkeypatch) == 0
    out = capsys.readouterr().out
    assert out.isascii()  # (JSON's escapes: nothing of the guest's reaches a terminal as it is)
    doc = json.loads(out)
    assert doc["provenance"] == {"guest_word": True, "incomplete": None}
    assert [(s["number"], s["step"], s["command"], s["exit"]) for s in doc["steps"]] == [
        (1, "s1", SED, 0), (2, "s2", "npm install", 0), (3, "s3", "make", None),
    ]  # fmt: skip
    assert {"started", "ended", "egress", "how"} <= set(doc["steps"][0])
    files = {f["path"]: f for f in doc["files"]}
    a = files["a.txt"]
    assert [(h["hunk"], h["old_start"], h["old_count"], h["new_start"], h["new_count"]) for h in a["hunks"]] == [
        (0, 2, 1, 2, 1), (1, 4, 0, 4, 1),
    ]  # fmt: skip
    assert [[m["step"] for m in h["made_by"]] for h in a["hunks"]] == [["s1"], ["s2"]]
    assert a["hunks"][1]["made_by"][0] == {"step": "s2", "command": "npm install", "argv": ["node", "postinstall.js"],
                                           "exe": "/usr/bin/node", "badges": ["install script"]}  # fmt: skip
    assert files["blob.bin"]["hunks"] == [] and files["blob.bin"]["made_by"] == []  # not traced
    assert files["evil.txt"]["hunks"][0]["made_by"][0]["argv"] == ["sh", "-c", HOSTILE]  # data, as the guest said
    assert _cli(["diff", "s1", "--json", "--by", "step"], _plan(tmp_path / "b"), monkeypatch) == 0
    grouped = json.loads(capsys.readouterr().out)
    assert [(g["group"], g["number"]) for g in grouped["groups"]] == [
        ("s1", 1), ("s2", 2), ("s3", 3), ("outside", None), ("untraced", None),
    ]  # fmt: skip
    assert [[f["path"] for f in g["files"]] for g in grouped["groups"]] == [
        ["a.txt"], ["a.txt"], [], ["evil.txt"], ["blob.bin"],
    ]  # fmt: skip
    assert [h["hunk"] for h in grouped["groups"][1]["files"][0]["hunks"]] == [1]  # only the hunk step 2 made


def test_diff_by_step_lists_the_steps_in_order_and_what_each_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _cli(["diff", "s1", "--by", "step"], _plan(tmp_path), monkeypatch) == 0
    said = capsys.readouterr()
    out = said.out.splitlines()
    heads = [line for line in out if not line.startswith(" ")]
    assert heads == [
        f"step 1  {SED}  exit 0  0.4s  0 egress requests",
        "step 2  npm install  exit 0  12.5s  2 egress requests",
        "step 3  make  no exit code  not ended  0 egress requests",
        "outside any step",
        "not traced",
    ]
    body = said.out
    assert "  a.txt  h0 (-2,1 +2,1)\n" in body  # the step's own command: nothing more to say
    assert "  a.txt  h1 (-4,0 +4,1)  by node postinstall.js  [install script: node postinstall.js]\n" in body
    assert "  (changed nothing shown here)" in body  # step 3
    assert "  blob.bin  whole: 0 → 3 bytes" in body
    assert "guest's word" in said.err  # said once, to the person
    _clean(said.out)
    evil = next(line for line in out if line.startswith("  evil.txt"))
    assert "\\x1b[31mred\\nnext line\\u202eevil" in evil and evil.endswith("…]")
    assert len(evil) < 400  # cut short
    assert _cli(["diff", "s1", "--by", "file"], _plan(tmp_path / "b"), monkeypatch) == 2  # a usage error
    assert _cli(["diff", "s1", "--by", "step", "--stat"], _plan(tmp_path / "c"), monkeypatch) == 2


def test_the_prompt_s_diff_says_who_made_each_hunk_under_its_header(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from vmsandbox.cli.review import writers

    plan = _plan(tmp_path)
    a, _, evil = plan.shown
    writers.print_diff(plan, a, views.diff_text(plan.gathered, a))
    err = capsys.readouterr().err
    lines = err.splitlines()
    at = lines.index("@@ -1,3 +1,4 @@")
    assert lines[at + 1] == f"  h0 (-2,1 +2,1) made by step 1 ({SED})"
    install = "node postinstall.js [install script: node postinstall.js]"
    assert lines[at + 2] == f"  h1 (-4,0 +4,1) made by step 2 (npm install) · {install}"
    assert lines[at + 3] == " one"  # then the diff goes on
    writers.print_diff(plan, evil, views.diff_text(plan.gathered, evil))
    err = capsys.readouterr().err
    _clean(err)
    said = next(line for line in err.splitlines() if "made by" in line)
    assert "made by outside any step · sh -c" in said and "\\x1b[31mred\\nnext line\\u202eevil" in said
    assert "[outside any step: sh -c" in said
    writers.said_once(plan)
    assert "guest's word" in capsys.readouterr().err


def test_a_review_without_provenance_says_nothing_of_it_at_the_prompt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from vmsandbox.cli.review import writers

    plan = _plan(tmp_path, None)
    writers.print_diff(plan, plan.shown[0], views.diff_text(plan.gathered, plan.shown[0]))
    writers.said_once(plan)
    assert "made by" not in capsys.readouterr().err and madeby.by_step(plan, plan.shown)[-1].key == madeby.UNTRACED


def test_partial_provenance_is_said_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from vmsandbox.cli.review import writers

    plan = _plan(tmp_path, dataclasses.replace(PROVENANCE, incomplete="the journal's records were full\x1b[2J"))
    writers.said_once(plan)
    err = capsys.readouterr().err
    assert err.count("provenance incomplete: the journal's records were full\\x1b[2J") == 1


# -- the page ------------------------------------------------------------------------------------------------------


@pytest.fixture
def plain_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """The page's highlighting runs a jailed process: shown plain here."""
    from vmsandbox.web import highlight

    monkeypatch.setattr(highlight, "lines", lambda texts: [highlight.plain(text) for _, text in texts])


def _page(plan: Plan) -> str:
    from vmsandbox.web import app, review, timeline

    files = review.files(plan)
    record = SimpleNamespace(project="/p", host="local", publish=())
    return app.TEMPLATES.get_template("review.html").render(
        name="s1", record=record, plan=plan, files=files, counts=review.counts(plan), page=0, pages=1, refused=[],
        refs=[], refs_refused=None, groups=review.shelves(plan, files), steps=timeline.steps(plan),
        made_notes=timeline.notes(plan),
    )  # fmt: skip


@pytest.mark.usefixtures("plain_text")
def test_the_page_shows_a_badge_per_hunk_and_the_steps_as_a_timeline(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    html = _page(plan)
    timeline = html[html.index('id="steps"') : html.index('id="review"')]
    assert timeline.index(SED) < timeline.index("npm install") < timeline.index("make")
    assert "12.5s · exit 0 · 2 egress requests" in timeline and "allow GET registry.npmjs.org:443" in timeline
    assert "guest&#39;s word" in timeline
    a = html[html.index('id="file-0"') : html.index('id="file-2"')]  # (file-1, binary, is held: shown after)
    assert 'data-steps="s1 s2"' in a
    hunks = re.findall(r'<div class="hunk" data-steps="([^"]*)">(.*?)</table>', a, re.S)
    assert [steps for steps, _ in hunks] == ["s1", "s2"]
    assert f"made by step 1 ({SED})</span>" in hunks[0][1]
    assert "made by step 2 (npm install) · node postinstall.js</span>" in hunks[1][1]
    assert '<span class="badge writer">install script: node postinstall.js</span>' in hunks[1][1]
    blob = html[html.index('id="file-1"') :]
    assert "not traced" in blob
    _clean(html)
    assert "\\x1b[31mred\\nnext line\\u202eevil" in html and "\\x1b]0;title\\x07" not in html  # (argv, not exe)
    assert not re.search(r"<script(?! src=\"/static/ui.js\")|\sstyle=|\son[a-z]+=", html)  # the CSP's terms


@pytest.mark.usefixtures("plain_text")
def test_a_step_s_take_and_leave_only_tick_what_the_page_sends(tmp_path: Path) -> None:
    """The buttons stand outside the form, send nothing and submit nothing (ui.js ticks or unticks the hunks
    whose data-steps name the step); what the form then holds is all that is applied."""
    from vmsandbox.sync.review import hunks
    from vmsandbox.web import review

    plan = _plan(tmp_path)
    html = _page(plan)
    buttons = re.findall(r"<button[^>]*step-choice[^>]*>", html)
    assert len(buttons) == 6  # take and leave, for each of three steps
    assert all('type="button"' in b and "name=" not in b and "form=" not in b for b in buttons)
    assert html.rindex("step-choice") < html.index('id="review"')  # outside the form
    script = (Path(review.__file__).parent / "static" / "ui.js").read_text()
    handler = script[script.index("function byStep") :]
    assert "submit" not in handler and "fetch(" not in handler and 'querySelector("[data-steps' not in handler
    # what the page sends after "leave all step 2 made": a.txt's h1 unticked, h0 still ticked
    digest = views.fingerprint(plan.todo[0])
    left = review.decisions(plan, {"d0": [digest], "f0": ["apply"], "hs0": ["1"], "h0": ["0"]})
    assert left.decisions.contents == {"a.txt": hunks.compose(BASE, GUEST, {0})}


# -- the API and MCP -----------------------------------------------------------------------------------------------


def test_the_api_s_review_has_who_made_each_hunk_and_the_steps(tmp_path: Path) -> None:
    from vmsandbox.api.plane import extwire
    from vmsandbox.core.sandbox import backend
    from vmsandbox.core.sandbox.names import SessionName

    plan = _plan(tmp_path)
    review = backend._review_of(SessionName("s1"), plan)
    doc = json.loads(extwire.review(review).model_dump_json(by_alias=True))
    a = next(i for i in doc["items"] if i["path"] == "a.txt")
    assert {"id", "path", "kind", "status", "digest", "entryType", "mode", "target", "holds", "hunks", "hunksShown",
            "hunkCount"} <= set(a)  # fmt: skip
    assert {"id", "oldStart", "oldLines", "newStart", "newLines"} <= set(a["hunks"][0])
    assert [[m["step"] for m in h["madeBy"]] for h in a["hunks"]] == [["s1"], ["s2"]]
    assert a["hunks"][1]["madeBy"][0]["badges"] == ["install script"]
    assert [m["step"] for m in a["madeBy"]] == ["s1", "s2"]
    assert [(s["number"], s["step"]) for s in doc["steps"]] == [(1, "s1"), (2, "s2"), (3, "s3")]
    assert doc["provenance"] == {"guestWord": True, "incomplete": None}
    untraced = extwire.review(backend._review_of(SessionName("s1"), _plan(tmp_path / "u", None)))
    assert untraced.provenance is None and untraced.steps == []


def test_mcp_s_review_marks_who_made_it_as_the_guest_s_and_escapes_it(tmp_path: Path) -> None:
    from vmsandbox.core.sandbox import backend
    from vmsandbox.core.sandbox.names import SessionName, Token
    from vmsandbox.mcp import person

    plan = _plan(tmp_path)
    review = backend._review_of(SessionName("s1"), plan)
    data = person.review_data(review)
    text = json.dumps(data, ensure_ascii=False)
    _clean(text)
    assert "\n" not in "".join(str(m["argv"]) for i in data["items"] for h in i["hunks"] for m in h["made_by"])
    assert {"items", "steps"} <= set(data["untrusted"]["fields"])
    a = next(i for i in data["items"] if i["path"] == "a.txt")
    assert [(m["step"], m["argv"], m["badges"]) for h in a["hunks"] for m in h["made_by"]] == [
        (1, "sed -i s/two/TWO/ a.txt", []), (2, "node postinstall.js", ["install script"]),
    ]  # fmt: skip
    assert [s["command"] for s in data["steps"]] == [SED, "npm install", "make"]
    evil = next(i for i in data["items"] if i["path"] == "evil.txt")["hunks"][0]["made_by"][0]
    assert evil["outside_any_step"] and len(evil["argv"]) <= 301
    assert all(len(e) <= 301 for s in data["steps"] for e in s["egress"])
    # the person's form: one short escaped line per item saying who made it
    by_path = {i.path: i for i in review.items}
    proposed = [person.Proposed(by_path["a.txt"], (Token("h1"),)), person.Proposed(by_path["evil.txt"], None)]
    laid = person.layout(proposed, review.steps)
    said = laid[0].lines[1]
    assert said == "  made by (the guest's word): step 2 (npm install): node postinstall.js [install script]"
    said = laid[1].lines[1]
    assert said.startswith("  made by (the guest's word): outside any step: sh -c '\\x1b[31mred\\nnext line\\u202e")
    assert len(said) <= len("  made by (the guest's word): ") + person.MADE_LINE + 1
    message = person.message("s1", "/p", review, laid, "")
    _clean(message)


# -- bounds (the audit's findings) -----------------------------------------------------------------------------------


def _many_steps(tmp_path: Path, n: int) -> Plan:
    """The review of _plan with `n` more host steps before its own, each with 60 egress lines of its time."""
    more = tuple(Step(f"m{k}", f"cmd {k}", 1000.0 + k, 1000.9 + k, 0, how="api") for k in range(n))
    plan = _plan(tmp_path, dataclasses.replace(PROVENANCE, steps=(*STEPS, *more)))
    events = [{"ts": 1000.0 + k + j / 100, "decision": "allow", "method": "GET", "host": f"h{j}", "port": 443}
              for k in range(n) for j in range(60)]  # fmt: skip
    plan.gathered.target.files.proxy_log.write_text("".join(json.dumps(e) + "\n" for e in events))
    return plan


@pytest.mark.usefixtures("plain_text")
def test_every_front_end_lists_a_bounded_number_of_steps(tmp_path: Path) -> None:
    """H1: the page's timeline, the API's review and MCP's list the newest MOST_STEPS steps and every step a maker
    they show names (numbered by its place among all), each with at most EGRESS_LINES egress lines."""
    from vmsandbox.api.plane import extwire
    from vmsandbox.core.sandbox import backend
    from vmsandbox.core.sandbox.names import SessionName
    from vmsandbox.mcp import person
    from vmsandbox.web import review, timeline

    plan = _many_steps(tmp_path, 300)
    total = len(madeby.steps(plan))
    page = timeline.steps(plan, review.named(review.files(plan)))
    assert len(page) == madeby.MOST_STEPS + 2 and [(s.id, s.number) for s in page[:2]] == [("s1", 1), ("s2", 2)]
    assert page[-1].number == total and all(len(s.egress) <= madeby.EGRESS_LINES + 1 for s in page)
    assert page[-1].egress[-1] == "… 10 more"
    doc = json.loads(extwire.review(backend._review_of(SessionName("s1"), plan)).model_dump_json(by_alias=True))
    assert len(doc["steps"]) == madeby.MOST_STEPS + 2 and doc["stepsMore"] == total - madeby.MOST_STEPS - 2
    assert [s["step"] for s in doc["steps"][:2]] == ["s1", "s2"]
    assert max(len(s["egress"]) for s in doc["steps"]) == madeby.EGRESS_LINES and doc["steps"][-1]["egressMore"] == 10
    data = person.review_data(backend._review_of(SessionName("s1"), plan))
    assert len(data["steps"]) == madeby.MOST_STEPS + 2 and [s["step"] for s in data["steps"][:2]] == [1, 2]
    assert data["steps_not_listed"] == total - madeby.MOST_STEPS - 2
    assert max(len(s["egress"]) for s in data["steps"]) == madeby.EGRESS_LINES


def test_the_prompt_never_fails_on_a_header_in_the_guest_s_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """M1: only a unified diff's headers are read, split at newlines only, each number at most 9 digits: a
    three-way text (the guest's lines), a huge number or a line separator in a path never raise."""
    from vmsandbox.cli.review import writers

    plan = _plan(tmp_path)
    a = plan.shown[0]
    three_way = (
        f"=== a.txt: 1 overlapping hunk(s), three-way (host | base | guest)\n<<<<<<< host\n@@ -{'9' * 5000} +1 @@\n"
    )
    writers.print_diff(plan, a, three_way)
    err = capsys.readouterr().err
    assert "h0 (-2,1 +2,1): made by step 1" in err  # named after the text, not inside it
    path = f"--- a/x\x85@@ -{'9' * 5000} +1 @@\n+++ b/x\n@@ -1,3 +1,4 @@\n one\n"
    writers.print_diff(plan, a, path)
    lines = capsys.readouterr().err.splitlines()
    assert lines[lines.index("@@ -1,3 +1,4 @@") + 1].startswith("  h0 (-2,1 +2,1) made by step 1")
    writers.print_diff(plan, a, "--- a/x\n+++ b/x\n@@ -1000000000,1 +1 @@\n")  # (10 digits: not a header)
    assert "made by step 1" in capsys.readouterr().err


def test_the_api_cuts_makers_and_their_size_never_decides_what_is_shown(tmp_path: Path) -> None:
    """M2: at most MOST_MAKERS makers a hunk, argv at most ARGV_WORDS words of ARGV_WORD characters (the rest
    counted), and the makers' size leaves out of whether an item's lines are sent."""
    from vmsandbox.api.plane import extwire
    from vmsandbox.core.sandbox import backend
    from vmsandbox.core.sandbox.names import SessionName

    big = tuple("A" * 4096 for _ in range(256))
    writers = {**WRITERS, **{n: Writer(n, n, "s1", 0, f"/bin/x{n}", big) for n in range(10, 20)}}
    lines = (None, 1, None, 2)
    files = {**PROVENANCE.files, "a.txt": FileOrigin((1, 2, *range(10, 20)), lines, removed={1: 1})}
    plan = _plan(tmp_path, dataclasses.replace(PROVENANCE, writers=writers, files=files))
    review = backend._review_of(SessionName("s1"), plan)
    a = next(i for i in review.items if i.path == "a.txt")
    assert extwire._size(a) < extwire.ITEM_BYTES < sum(len(w) for m in a.made_by for w in m.argv)
    doc = json.loads(extwire.review(review).model_dump_json(by_alias=True))
    item = next(i for i in doc["items"] if i["path"] == "a.txt")
    assert item["hunksShown"] and len(item["madeBy"]) == madeby.MOST_MAKERS and item["madeByMore"] == 4
    cut = item["madeBy"][-1]
    assert len(cut["argv"]) == madeby.ARGV_WORDS and cut["argvMore"] == 256 - madeby.ARGV_WORDS
    assert all(len(w) == madeby.ARGV_WORD for w in cut["argv"])


@pytest.mark.usefixtures("plain_text")
def test_a_held_file_outside_a_group_is_marked_held_for_a_step_s_take_all(tmp_path: Path) -> None:
    """L1: a conflict (or an unsafe change) is in no held group, yet held: the page marks each held file with
    data-held, and a step's take-all passes over it."""
    from vmsandbox.web import review

    plan = _plan(tmp_path)
    plan.gathered.changes[0].status = Status.CONFLICT
    html = _page(plan)
    a = html[html.index('id="file-0"') :]
    assert a[: a.index(">")].endswith('data-steps="s1 s2" data-held="conflict"')
    evil = html[html.index('id="file-2"') :]
    assert "data-held" not in evil[: evil.index(">")]
    script = (Path(review.__file__).parent / "static" / "ui.js").read_text()
    handler = script[script.index("function byStep") :]
    assert 'file.hasAttribute("data-held")' in handler[: handler.index("if (take && held) return;")]


def test_mcp_quotes_each_word_of_a_writer_s_argv() -> None:
    """L3: a writer's argv reads as a shell would read it, each word quoted, bounded before it is escaped."""
    from vmsandbox.mcp import person

    maker = madeby.Maker("s1", "x", ("sh", "-c", "a b; rm -rf /", *(["w"] * 30)), "/bin/sh", ())
    said = person.argv(maker)
    assert said.startswith("sh -c 'a b; rm -rf /' w w") and said.endswith(" … 13 more")
