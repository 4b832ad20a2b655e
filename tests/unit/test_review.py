from __future__ import annotations

import os
from pathlib import Path

import pytest

from vmsandbox import paths
from vmsandbox.sync.review import holds
from vmsandbox.sync.review.gather import Gathered, Origin
from vmsandbox.sync.review.plan import Decisions, Plan, make
from vmsandbox.sync.review.take import Take
from vmsandbox.sync.review.threeway import Change, Status, compare, is_git_managed, risk_of
from vmsandbox.sync.target import Target
from vmsandbox.sync.tree import manifest
from vmsandbox.sync.tree.manifest import DIR, FILE, OTHER, SYMLINK, Entry


def f(digest: str, mode: int = 0o644) -> Entry:
    return Entry(FILE, mode, 1, digest=digest)


def by_path(base: dict[str, Entry], host: dict[str, Entry], guest: dict[str, Entry]) -> dict[str, Status]:
    return {c.path: c.status for c in compare(base, host, guest)}


def test_three_way_statuses() -> None:
    base = {"same": f("a"), "g": f("a"), "both": f("a"), "agree": f("a"), "hostonly": f("a"), "del": f("a")}
    host = {"same": f("a"), "g": f("a"), "both": f("h"), "agree": f("x"), "hostonly": f("h"), "del": f("a")}
    guest = {"same": f("a"), "g": f("g"), "both": f("g"), "agree": f("x"), "hostonly": f("a"), "new": f("n")}
    assert by_path(base, host, guest) == {
        "g": Status.APPLY,
        "both": Status.CONFLICT,
        "agree": Status.SAME,
        "new": Status.APPLY,
        "del": Status.APPLY,
    }


def test_unsafe_entries() -> None:
    guest = {
        "fifo": Entry(OTHER, 0o644),
        "out": Entry(SYMLINK, 0o777, target="/etc/passwd"),
        "d/up": Entry(SYMLINK, 0o777, target="../../x"),
        "d": Entry(DIR, 0o755),
        "d/in": Entry(SYMLINK, 0o777, target="../ok"),
    }
    statuses = by_path({}, {}, guest)
    assert statuses["fifo"] is Status.UNSAFE
    assert statuses["out"] is Status.UNSAFE and statuses["d/up"] is Status.UNSAFE
    assert statuses["d/in"] is Status.APPLY


def test_risky_paths_and_new_exec_bits() -> None:
    for path in (
        ".git/hooks/pre-commit",
        ".git/config",
        "sub/.gitattributes",
        ".envrc",
        ".vscode/tasks.json",
        ".github/workflows/ci.yml",
        ".husky/pre-push",
        ".gitmodules",
        "pkg/.npmrc",
    ):
        assert risk_of(path, None, f("x")), path
    assert risk_of("src/main.py", None, f("x")) is None
    assert risk_of("run.sh", None, f("x", 0o755)) == "newly executable"
    assert risk_of("run.sh", f("x", 0o644), f("y", 0o755)) == "newly executable"
    assert risk_of("run.sh", f("x", 0o755), f("y", 0o755)) == "executable, its content changed"
    assert risk_of("run.sh", f("x", 0o755), f("x", 0o700)) is None  # the same bytes: nothing new runs
    # its bit dropped while its content changed: `sh run.sh` still runs it (issue 43: no laundering)
    assert risk_of("run.sh", f("x", 0o755), f("y", 0o644)) == "executable, its content changed"
    assert risk_of("run.sh", f("x", 0o755), f("x", 0o644)) is None  # only the bit dropped: nothing new runs
    # executable on the host now (the user's chmod during the session): the same holds against the host's file
    assert risk_of("run.sh", f("x", 0o644), f("y", 0o644), f("x", 0o755)) == "executable, its content changed"
    assert risk_of("run.sh", f("x", 0o644), f("y", 0o755), f("x", 0o755)) == "executable, its content changed"
    # or replaced by a link to a new, plain file (or its directory by a link to one holding a new x.sh)
    link = Entry(SYMLINK, 0o777, target="y.sh")
    assert "a link where an executable" in (risk_of("scripts/x.sh", f("x", 0o755), link) or "")
    assert "a link where an executable" in (risk_of("scripts", Entry(DIR, 0o755), link) or "")
    assert risk_of("notes.txt", f("x", 0o644), link) is None  # a plain file's link: where it leads is judged apart


def test_git_internals_managed_by_git_are_not_file_changes() -> None:
    assert is_git_managed(".git/objects/ab/cdef") and is_git_managed(".git/refs/heads/main")
    assert is_git_managed(".git/index") and is_git_managed(".git/HEAD")
    assert not is_git_managed(".git/config") and not is_git_managed(".git/hooks/pre-commit")
    base = {".git/config": f("a"), ".git/index": f("i")}
    guest = {".git/config": f("b"), ".git/index": f("j"), ".git/objects/aa/bb": f("o")}
    changes = compare(base, base, guest)
    assert [(c.path, c.risky is not None) for c in changes] == [(".git/config", True)]


def test_mode_change_detected_as_far_as_modes_travel() -> None:
    base = {"x": f("a", 0o644), "w": f("b", 0o664)}
    changes = compare(base, base, {"x": f("a", 0o4755), "w": f("b", 0o666)})
    assert [(c.path, c.kind) for c in changes] == [("x", "mode changed")]  # o+w never travels: no change


def test_a_chained_symlink_is_judged_where_it_leads() -> None:
    guest = {
        "a": Entry(DIR, 0o755),
        "a/b": Entry(DIR, 0o755),
        "a/b/s1": Entry(SYMLINK, 0o777, target=".."),  # = a: inside
        "a/b/s2": Entry(SYMLINK, 0o777, target="s1/../../etc/passwd"),  # text says a/etc/passwd; really ../etc
    }
    statuses = by_path({}, {}, guest)
    assert statuses["a/b/s1"] is Status.APPLY
    assert statuses["a/b/s2"] is Status.UNSAFE


def test_a_symlink_through_a_host_side_link_is_refused() -> None:
    host = {"up": Entry(SYMLINK, 0o777, target="..")}  # the user's own link, already on the host
    guest = {"up": Entry(SYMLINK, 0o777, target=".."), "x": Entry(SYMLINK, 0o777, target="up/secret")}
    changes = {c.path: c for c in compare({"up": host["up"]}, host, guest)}
    assert changes["x"].status is Status.UNSAFE
    assert "leaves the project" in changes["x"].notes[0]


def test_guest_names_cannot_inject_markup_or_escape_sequences() -> None:
    from vmsandbox import ui

    hostile = "x[link=file:///etc]y\x1b]8;;http://evil\x07z\x1b[2J"
    shown = ui.printable(hostile)
    assert "\x1b" not in shown and "\x07" not in shown
    assert "\\[link" in shown  # markup escaped
    assert ui.printable("tab\tand\nnewline", markup=False) == "tab\tand\nnewline"


@pytest.mark.parametrize(
    ("hostile", "shown"),
    [
        ("evil\u202etxt.exe", "evil\\u202etxt.exe"),  # right-to-left override: reorders what follows
        ("a\u2066b\u2069c", "a\\u2066b\\u2069c"),  # isolates
        ("in\u200bvisible\ufeff", "in\\u200bvisible\\ufeff"),  # zero-width space, BOM
        ("tag\U000e0041", "tag\\U000e0041"),  # a tag character: invisible
        ("next\u2028line", "next\\u2028line"),  # a line separator
        ("c1\x85\x9b31m", "c1\\x85\\x9b31m"),  # C1 controls (NEL, CSI)
        ("\u0336struck", "\\u0336struck"),  # a combining mark first would strike what comes before it
        ("caf\u00e9 na\u0303o \u4e2d\u6587 \U0001f600", "caf\u00e9 na\u0303o \u4e2d\u6587 \U0001f600"),  # text is text
        ("bad\udcff", "bad\\udcff"),  # an undecodable byte (surrogateescape)
        ("x\ufe0fy\U000e0100", "x\\ufe0fy\\U000e0100"),  # variation selectors: a payload no one sees
        ("const {timeout,\u3164}", "const {timeout,\\u3164}"),  # a Hangul filler: an invisible identifier
        ("a\u034fb", "a\\u034fb"),  # the combining grapheme joiner
        ("z\u0301\u0302\u0303\u0304\u0305", "z\u0301\u0302\u0303\\u0304\\u0305"),  # a stack of marks, cut
    ],
)
def test_what_is_shown_of_a_guest_name_is_what_its_characters_are(hostile: str, shown: str) -> None:
    """Nothing in a guest's name or line can hide, reorder or restyle the text around it (issue 43): shown by
    Unicode category, not by a list of code points."""
    from vmsandbox import ui

    assert ui.printable(hostile, markup=False) == shown


def test_the_page_shows_a_guest_name_as_its_characters_are() -> None:
    from markupsafe import Markup

    from vmsandbox.web import app, highlight

    page = app.TEMPLATES.from_string("<p>{{ name }}</p>{{ safe }}").render(name="a\u202eb<i>", safe=Markup("<b>ok</b>"))
    assert page == "<p>a\\u202eb&lt;i&gt;</p><b>ok</b>"
    assert highlight.plain("x\u2067y") == [Markup("x\\u2067y")]
    assert highlight._markup([["k", "if\u202e"], ["", "<z>"]]) == Markup('<span class="k">if\\u202e</span>&lt;z&gt;')


def test_applied_setuid_file_is_not_a_conflict_afterwards() -> None:
    guest = {"s.sh": f("x", 0o4755)}
    host_after_apply = {"s.sh": f("x", 0o755)}  # bits dropped on the way
    assert compare({}, host_after_apply, guest)[0].status is Status.SAME


def test_derived_trees_of_a_project_without_git() -> None:
    assert holds.derived(".venv/lib/python3.11/site-packages/evil.pth") == ".venv"
    assert holds.derived("web/node_modules/x/index.js") == "node_modules"
    assert holds.derived("pkg/__pycache__/m.cpython-311.pyc") == "__pycache__"
    assert holds.derived("src/app.egg-info/PKG-INFO") == "app.egg-info"
    assert holds.derived("src/main.py") is None
    assert holds.derived("docs/building.md") is None  # a name, not a component


def _plan(tmp_path: Path, found: list[Change]) -> Plan:
    files = paths.session_paths("s")
    target = Target("s", tmp_path, files, os.getuid(), os.getgid())
    g = Gathered(target, found, tmp_path / "src", False, Origin.LIVE, None, 1024**3)
    return make(g)


def test_yes_leaves_what_the_project_ignores_and_says_so(tmp_path: Path) -> None:
    """--yes applies the reviewable changes only: an ignored (or derived) path waits for --include-ignored, a
    risky one for --include-risky; "all" never means the ignored ones."""
    source = Change("src/main.py", None, f("a"), None, Status.APPLY)
    venv = Change(".venv/lib/site-packages/x.pth", None, f("b"), None, Status.APPLY, ignored="derived (.venv)")
    hook = Change(".envrc", None, f("c"), None, Status.APPLY, risky="direnv runs it")
    plan = _plan(tmp_path, [source, venv, hook])
    d = Decisions.safe(plan, Take())
    assert [i.label for i in d.accept] == ["src/main.py"]
    assert [i.label for i in d.ignored] == [".venv/lib/site-packages/x.pth"]
    assert [i.label for i in d.quarantined] == [".envrc"]
    d = Decisions.safe(plan, Take(ignored=True))
    assert sorted(i.label for i in d.accept) == [".venv/lib/site-packages/x.pth", "src/main.py"]
    d = Decisions.safe(plan, Take(risky=True))
    assert sorted(i.label for i in d.accept) == [".envrc", "src/main.py"] and len(d.ignored) == 1


def test_a_scan_stops_at_its_entry_limit(tmp_path: Path) -> None:
    """A guest's tree is read into memory: one of millions of empty files stops the walk, not the host."""
    root = tmp_path / "t"
    (root / "d").mkdir(parents=True)
    for i in range(11):
        (root / "d" / f"f{i}").write_text("x")
    assert len(manifest.scan(root, max_entries=12)) == 12
    with pytest.raises(manifest.TooManyEntriesError, match="more than 10 entries"):
        manifest.scan(root, max_entries=10)


def test_binary_content_waits_for_an_explicit_choice(tmp_path: Path) -> None:
    """A file with a NUL in its first 8,000 bytes (git's test) is not applied by --yes alone."""
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "blob.bin").write_bytes(b"ELF\x00\x01" + b"x" * 100)
    (src / "d" / "late.txt").write_bytes(b"x" * 9000 + b"\x00")  # a NUL past the probe: text, as for git
    assert holds.is_binary(src, "d/blob.bin") and not holds.is_binary(src, "d/late.txt")
    blob = Change("d/blob.bin", None, f("a"), None, Status.APPLY, binary=True)
    text = Change("d/late.txt", None, f("b"), None, Status.APPLY)
    plan = _plan(tmp_path, [blob, text])
    d = Decisions.safe(plan, Take())
    assert [i.label for i in d.accept] == ["d/late.txt"] and [i.label for i in d.binary] == ["d/blob.bin"]
    d = Decisions.safe(plan, Take(binary=True))
    assert sorted(i.label for i in d.accept) == ["d/blob.bin", "d/late.txt"] and d.binary == ()


def test_a_lexer_that_answers_other_words_is_not_believed() -> None:
    """The jailed lexer reads guest bytes too: its answer is shown only when its tokens are the text's own lines,
    word for word (else the text is shown plain)."""
    from vmsandbox.sync.scan import highlight

    text = "x = 1\ny = 2\n"
    assert highlight._same([[["n", "x"], ["", " = 1"]], [["n", "y = 2"]]], text)
    assert not highlight._same([[["n", "x = 1"]], [["n", "y = 3"]]], text)  # another word
    assert not highlight._same([[["n", "x = 1"]]], text)  # a line left out
