"""The review read like a pull request, without a VM: the source changes first, what is held in groups (one line
each with its reason and the one choice that takes it), badges that say what will happen — on the page (rendered
by its own templates, its form read back as Decisions) and at the terminal in 80 columns; the side-by-side page
leads with where the sessions differ."""

from __future__ import annotations

import hashlib
import io
import os
import re
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

import pytest

from vmsandbox.sync.review.plan import Plan
from vmsandbox.sync.review.threeway import Change, Status
from vmsandbox.sync.tree.manifest import DIR, FILE, Entry

if TYPE_CHECKING:
    from rich.console import Console

IGNORED = "ignored by the project (.gitignore)"
SOURCE = "src/click/termui_helpers.py"
PYC = [f"src/click/__pycache__/{m}.cpython-311.pyc" for m in ("core", "utils", "types", "parser", "termui", "_compat")]
BLOBS = [f"assets/icon-{n}.png" for n in range(4)]


def _entry(data: bytes) -> Entry:
    return Entry(FILE, 0o644, len(data), digest=hashlib.sha256(data).hexdigest())


def _plan(tmp_path: Path, *, mass: bool = False) -> Plan:
    """One new source file, six ignored bytecode files (binary too) in an ignored new directory, four binary
    files in a new directory, a quarantined .envrc, a conflict: in path order, as a gather gives them."""
    from vmsandbox.paths import SessionPaths
    from vmsandbox.sync.review.gather import Gathered, Origin
    from vmsandbox.sync.review.mass import Limits
    from vmsandbox.sync.review.plan import make
    from vmsandbox.sync.target import Target

    files = SessionPaths(tmp_path / "session")
    project, source = tmp_path / "project", tmp_path / "guest"
    for where in (files.baseline, project, source):
        where.mkdir(parents=True)
    found: list[Change] = []

    def guest_file(path: str, data: bytes, **marks: object) -> None:
        (source / path).parent.mkdir(parents=True, exist_ok=True)
        (source / path).write_bytes(data)
        found.append(Change(path, None, _entry(data), None, Status.APPLY, **marks))  # type: ignore[arg-type]

    guest_file(".envrc", b"export PATH=.:$PATH\n", risky="a file that runs on the host later")
    found.append(Change("assets", None, Entry(DIR, 0o755), None, Status.APPLY))  # holds only binary files
    for blob in BLOBS:
        guest_file(blob, b"\x89PNG\x00" + blob.encode(), binary=True)
    (files.baseline / "README").write_bytes(b"a\nb\n")
    found.append(Change("README", _entry(b"a\nb\n"), _entry(b"a\nguest\n"), _entry(b"a\nhost\n"), Status.CONFLICT))
    (source / "README").write_bytes(b"a\nguest\n")
    guest_file(SOURCE, b"def echo_via_pager():\n    return 1\n")
    found.append(Change("src/click/__pycache__", None, Entry(DIR, 0o755), None, Status.APPLY, ignored=IGNORED))
    for pyc in PYC:
        guest_file(pyc, b"\xa7\r\r\n\x00\x00" + pyc.encode(), ignored=IGNORED, binary=True)
    found.sort(key=lambda c: c.path)
    target = Target("s1", project, files, os.getuid(), os.getgid())
    limits = Limits(files=3) if mass else None
    return make(Gathered(target, found, source, False, Origin.LIVE, None, 1024**2), limits=limits)


@pytest.fixture(autouse=True)
def plain_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """The page's highlighting runs a jailed process: shown plain here."""
    from vmsandbox.web import highlight

    monkeypatch.setattr(highlight, "lines", lambda texts: [highlight.plain(text) for _, text in texts])


def test_the_outline_puts_source_first_and_each_hold_in_one_group(tmp_path: Path) -> None:
    from vmsandbox.sync.review.outline import outline

    plan = _plan(tmp_path)
    shape = outline(plan.todo)
    assert [plan.todo[n].label for n in shape.source] == ["README", SOURCE]
    assert [(g.key, g.reason, g.flags, len(g.numbers)) for g in shape.groups] == [
        ("risky", "quarantined: a file that runs on the host later", ("--include-risky",), 1),
        ("ignored", "ignored by .gitignore", ("--include-ignored", "--include-binary"), 7),  # bytecode: binary too
        ("binary", "binary files", ("--include-binary",), 5),  # with the new directory that holds them
    ]
    assert sorted(shape.order) == list(range(len(plan.todo)))
    massed = _plan(tmp_path / "m", mass=True)
    groups = outline(massed.todo, True).groups
    assert "a mass change: added under src/click/" in [g.reason for g in groups]
    assert all("--include-mass" in g.flags for g in groups)


def _page(plan: Plan, page: int = 0) -> str:
    from vmsandbox.web import app, review

    files = review.files(plan, page)
    record = SimpleNamespace(project="/p", host="local", publish=())
    return app.TEMPLATES.get_template("review.html").render(
        name="s1", record=record, plan=plan, files=files, counts=review.counts(plan), page=page, pages=1,
        refused=[], refs=[], refs_refused=None, groups=review.shelves(plan, files),
    )  # fmt: skip


def test_the_page_shows_source_first_and_the_held_files_as_folded_groups(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    html = _page(plan)
    sections = re.findall(r'<section class="(file|group)" id="(?:file|group)-([^"]+)"', html)
    labels = {str(n): i.label for n, i in enumerate(plan.todo)}
    assert [labels.get(key, key) for kind, key in sections[:2]] == ["README", SOURCE]
    form = html[html.index('id="review"') :]
    assert form.index(SOURCE) < form.index('id="group-risky"') < form.index('id="group-ignored"')
    assert form.index('id="group-ignored"') < form.index(PYC[0]) < form.index('id="group-binary"')
    assert html.count("<details>") == 3 and "<details open" not in html  # collapsed until asked
    line = re.search(r'id="group-ignored">\s*<p class="groupline">(.*?)</p>', html, re.S)
    assert line is not None
    assert "ignored by .gitignore" in line[1] and '<input type="checkbox" name="g-ignored" value="apply">' in line[1]
    assert "apply these 7" in line[1] and "checked" not in line[1]
    assert "held: a new directory that holds only what is held — pick to apply" in html  # assets/
    toc = html[html.index('id="toc"') : html.index("</nav>")]
    assert toc.index("README") < toc.index(SOURCE) < toc.index("#group-risky")
    assert PYC[0] not in toc and "7 held: ignored by .gitignore" in toc  # one line for the group, not a line per file
    # badges say what will happen with the choice preselected, and what the other choice would do
    assert ">will apply</span>" in html and ">apply</span>" not in html
    assert f"held: {IGNORED} — pick to apply</span>" in html
    assert "kept beside the file (conflict)" in html and ">conflict: left pending — pick to decide</span>" in html
    n = [i.label for i in plan.todo].index(SOURCE)  # its fields carry its number in the review
    for field in (f'name="d{n}"', f'name="f{n}" value="apply" checked', f'name="hs{n}"', f'name="h{n}" value="0"'):
        assert field in html[html.index(f'id="file-{n}"') :], field
    assert not re.search(r"<script(?! src=\"/static/ui.js\")|\sstyle=|\son[a-z]+=", html)  # the CSP's terms


def test_a_group_s_one_choice_takes_the_files_the_page_listed_under_it_and_nothing_else(tmp_path: Path) -> None:
    from vmsandbox.web import review

    plan = _plan(tmp_path)
    files = review.files(plan)
    shown = {f"d{f.id}": [f.digest] for f in files}
    defaults = {f"f{f.id}": [f.default] for f in files}
    chosen = review.decisions(plan, {**shown, **defaults})
    assert [i.label for i in chosen.decisions.accept] == [SOURCE]  # held ones wait, the conflict too
    taken = review.decisions(plan, {**shown, **defaults, "g-ignored": ["apply"]})
    assert sorted(i.label for i in taken.decisions.accept) == sorted([SOURCE, "src/click/__pycache__", *PYC])
    one = next(f for f in files if f.label == BLOBS[2])
    picked = review.decisions(plan, {**shown, **defaults, f"f{one.id}": ["apply"]})
    assert sorted(i.label for i in picked.decisions.accept) == [BLOBS[2], SOURCE]  # (its directory: made for it)
    every = review.decisions(plan, {**shown, "g-binary": ["apply"]})
    assert sorted(i.label for i in every.decisions.accept) == ["assets", *BLOBS]
    unseen = {k: v for k, v in shown.items() if k != f"d{one.id}"}  # a file the page did not list is not taken
    assert BLOBS[2] not in [i.label for i in review.decisions(plan, {**unseen, "g-binary": ["apply"]}).decisions.accept]
    stale = review.decisions(plan, {**shown, f"d{one.id}": ["0" * 32], "g-binary": ["apply"]})
    assert BLOBS[2] not in [i.label for i in stale.decisions.accept]
    assert stale.refused == [f"item {one.id}: not what this review showed; reload the page"]


def test_a_mass_change_s_page_groups_everything_and_preselects_nothing(tmp_path: Path) -> None:
    from vmsandbox.web import review

    plan = _plan(tmp_path, mass=True)
    files = review.files(plan)
    assert all(f.group is not None and f.default == "skip" for f in files)
    assert "a mass change: added under src/click/" in [s.reason for s in review.shelves(plan, files)]
    html = _page(plan)
    assert "held: part of a mass change — pick to apply" in html


def _console(width: int = 80) -> tuple[Console, io.StringIO]:
    """A console like ui.err, `width` columns wide, and what it printed."""
    from rich.console import Console

    printed = io.StringIO()
    return Console(file=printed, width=width, highlight=False, soft_wrap=True, color_system=None), printed


def _shown(monkeypatch: pytest.MonkeyPatch, plan: Plan, width: int = 80) -> list[str]:
    from vmsandbox import ui
    from vmsandbox.cli.review import prompts

    console, printed = _console(width)
    monkeypatch.setattr(ui, "err", console)
    assert prompts.show(plan)
    return printed.getvalue().splitlines()


def test_the_terminal_review_fits_80_columns_with_source_first_and_a_line_per_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = _plan(tmp_path)
    long = "src/click/" + "deeply/nested/" * 6 + "the_file_name_that_matters.py"
    plan.todo[[i.label for i in plan.todo].index(SOURCE)].first.path = long
    lines = _shown(monkeypatch, plan)
    assert all(len(line) <= 80 for line in lines), "\n".join(lines)
    text = "\n".join(lines)
    assert lines[0].split() == ["STATUS", "CHANGE", "PATH", "NOTE"]
    assert lines[1].split()[:3] == ["conflict", "modified", "README"]
    row = lines[2]
    assert row.split()[:2] == ["apply", "added"] and "src/click/" in row and "…" in row
    assert "the_file_name_that_matters.py" in row  # cut in the middle: its start and its file name kept
    assert "paths cut to fit; whole: `vmsandbox diff s1 --stat`" in text
    held = [line for line in lines if line.lstrip().startswith("held")]
    assert [line.split()[1] for line in held] == ["1", "7", "5"]
    assert not any(line.split()[2:3] == ["assets"] for line in lines)  # its directory is held with them
    assert "a file that runs on the host later" in held[0] and held[0].endswith("--include-risky")
    assert held[1].endswith("7  ignored by .gitignore · --include-ignored --include-binary")
    assert held[2].endswith("binary files · --include-binary")
    assert not any(pyc in text or pyc.rsplit("/", 1)[1] in text for pyc in PYC)  # grouped, not listed
    assert lines.index(held[0]) > 2


def test_a_credential_group_names_no_flag_and_a_narrow_terminal_still_fits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = _plan(tmp_path)
    plan.todo[0].first.secret = "looks like a credential: GitHub Token (line 2)"
    lines = _shown(monkeypatch, plan, width=60)
    assert all(len(line) <= 60 for line in lines), "\n".join(lines)
    held = lines[lines.index(next(line for line in lines if line.lstrip().startswith("held"))) :]
    assert held[0].endswith("1  may hold credentials · only `y` at the prompt")
    assert held[1].endswith("7  ignored by .gitignore") and held[2].strip() == "→ --include-ignored --include-binary"


def test_the_prompt_asks_each_source_change_then_one_question_per_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vmsandbox import ui
    from vmsandbox.cli.review import prompts

    plan = _plan(tmp_path)
    answers = iter(["n", "y", "n", "y", "e", "n", "y", "n", "n", "n"])  # README, source; risky; ignored; binary: each
    asked: list[str] = []

    def answer(question: str) -> str:
        asked.append(question)
        return next(answers)

    console, printed = _console()
    monkeypatch.setattr(console, "input", answer)
    monkeypatch.setattr(ui, "err", console)
    decided = prompts.ask_person(plan)
    assert sorted(i.label for i in decided.accept) == sorted([SOURCE, "src/click/__pycache__", *PYC, BLOBS[0]])
    assert "a=all safe" in asked[0] and "y=yes n=no e=each q=quit" in asked[2]
    assert "a=all safe" not in asked[6]  # a held file is never taken by "all safe"
    shown = printed.getvalue()
    assert "(2/15) added " + SOURCE in shown and "(12/15) added " + BLOBS[0] in shown


def test_the_side_by_side_page_leads_with_where_the_sessions_differ(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vmsandbox.web import app, compare

    plans = {"exp-1": _plan(tmp_path / "1"), "exp-2": _plan(tmp_path / "2")}
    other = next(i for i in plans["exp-2"].todo if i.label == SOURCE).first
    (tmp_path / "2" / "guest" / SOURCE).write_bytes(b"other\n")
    other.guest = _entry(b"other\n")
    monkeypatch.setattr(compare, "_plans", lambda names: plans)
    for plan in plans.values():
        plan.id = "f" * 32
    view = compare.view(list(plans))
    assert view.lines[0].path == SOURCE
    assert not view.lines[0].agree and all(line.agree for _, line in view.agree)
    assert [line.path for _, line in view.differ] == [SOURCE]
    html = app.TEMPLATES.get_template("compare.html").render(view=view, names=list(plans), pick=compare.pick)
    assert html.index(SOURCE) < html.index('<details class="agreed" id="agreed">') < html.index(PYC[0])
    assert f"{len(view.agree)} path(s) where every session made the same change" in html
    assert "held: " + IGNORED in html and "if taken: kept beside the file (conflict)" in html


def test_a_mass_change_at_the_terminal_is_a_table_of_directories_in_80_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = _plan(tmp_path, mass=True)
    plan.todo[0].first.path = "vendor/" + "very-long-directory-name/" * 4 + ".envrc"
    lines = _shown(monkeypatch, plan)
    assert all(len(line) <= 80 for line in lines), "\n".join(lines)
    text = "\n".join(lines)
    assert "vendor/very-long-directory-name/" in text and "src/click/" in text
    assert "a mass change: 15 changed paths, more than mass_change_files (3)" in text
    assert "`--yes --include-mass` takes its safe part" in text
    assert not any(line.lstrip().startswith("held") for line in lines)  # the table is its grouping
