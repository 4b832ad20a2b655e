"""The change journal's answer (hostile guest text, parsed strictly) and the mirror delta it drives: after a
fetch of the named paths, the delta equals what a whole walk of the mirror would find."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from vmsandbox.sync.fetch import delta, journal
from vmsandbox.sync.review.threeway import Status, compare
from vmsandbox.sync.tree import hashcache, manifest, views
from vmsandbox.sync.tree.hashcache import HashCache

ID = "0123456789abcdef0123456789abcdef"


def test_an_answer_names_paths_and_a_new_cursor() -> None:
    a = journal.parse(f"ok {ID} 42 3\nsrc/a.py\nsp\\x20ace\nnon\\xffutf8\n")
    assert a.cursor == journal.Cursor(ID, 42)
    assert a.paths == sorted(["src/a.py", "sp ace", "non\udcffutf8"])


def test_paths_under_another_named_path_are_left_to_it() -> None:
    a = journal.parse(f"ok {ID} 9 5\nbuild/out.o\nbuild\nold/deep/er/f\nold\nolder\n")
    assert a.paths == ["build", "old", "older"]


def test_a_walk_keeps_its_cursor_and_says_why() -> None:
    a = journal.parse(f"walk {ID} 7 hard-linked-file-changed\n")
    assert (a.cursor, a.paths) == (journal.Cursor(ID, 7), None)
    assert "hard-linked-file-changed" in a.why


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\x1b]0;pwned\x07",
        f"ok {ID} 1 2\na\n",  # fewer paths than announced (cut off)
        f"ok {ID} 1 1\na\nb\n",  # more
        f"ok {ID} 1 1\n../etc/passwd\n",
        f"ok {ID} 1 1\n/etc/passwd\n",
        f"ok {ID} 1 1\na//b\n",
        f"ok {ID} 1 1\na/./b\n",
        f"ok {ID} 1 1\na\\x00b\n",
        f"ok {ID} 1 1\na\\b\n",  # a backslash that is no escape
        f"ok {ID} 1 1\na\\x2\n",
        f"ok {ID} 1 1\n\x1b[2Jx\n",
        f"ok {ID} 1 1\nä\n",
        f"ok {ID} 1 1\na b\n",
        f"ok {ID} 1 1\n\n",
        f"ok {ID} 1 1\na",  # no final newline
        f"ok {ID} 99999999999999999999999 0\n",
        f"ok {ID} -1 0\n",
        "ok not-an-id 1 0\n",
        f"ok {ID} 1 x\n",
        f"maybe {ID} 1 0\n",
        f"ok {ID} 1 0 extra\n",
    ],
)
def test_anything_else_is_a_walk(text: str) -> None:
    a = journal.parse(text)
    assert a.paths is None
    assert a.cursor is None or text.startswith("walk")


def test_a_walk_with_an_unknown_reason_does_not_echo_it() -> None:
    a = journal.parse(f"walk {ID} 3 \x1b]0;x\x07\n")
    assert a.paths is None and "\x1b" not in a.why


def test_cursors_are_kept_and_a_damaged_one_matches_no_journal(tmp_path: Path) -> None:
    assert journal.load(tmp_path) == journal.ORIGIN
    journal.save(tmp_path, journal.Cursor(ID, 5))
    assert journal.load(tmp_path) == journal.Cursor(ID, 5)
    journal.cursor_file(tmp_path).write_text("{")
    assert journal.load(tmp_path) not in (journal.ORIGIN, journal.Cursor(ID, 5))


# ---------------------------------------------------------------- the delta after a fetch of named paths


@pytest.fixture
def trees(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    monkeypatch.setattr(hashcache, "RACY_NS", 0)
    base = tmp_path / "base"
    for d in ("a/b", "c", "old/deep"):
        (base / d).mkdir(parents=True)
    (base / "a/b/f").write_text("f")
    (base / "c/g").write_text("g")
    (base / "old/deep/h").write_text("h")
    (base / "top").write_text("top")
    mirror = tmp_path / "mirror"
    shutil.copytree(base, mirror, symlinks=True)
    return base, mirror


def refreshed(base: Path, mirror: Path, known: delta.Delta, listed: list[str], tmp: Path) -> delta.Delta:
    delta.refresh(mirror, manifest.scan(base), known, listed, HashCache.load(tmp / "h.json"))
    return known


def test_the_delta_after_named_paths_equals_a_whole_walk(trees: tuple[Path, Path], tmp_path: Path) -> None:
    base, mirror = trees
    known: delta.Delta = {}
    (mirror / "top").write_text("changed")
    (mirror / "a/b/new").write_text("new")
    shutil.rmtree(mirror / "old")  # a directory and all under it gone: only "old" is named
    (mirror / "fresh/x").mkdir(parents=True)  # a new tree: only its top is named
    (mirror / "fresh/x/y").write_text("y")
    (mirror / "c").chmod(0o700)
    listed = ["top", "a/b/new", "old", "fresh", "c"]
    refreshed(base, mirror, known, listed, tmp_path)
    assert known == delta.between(manifest.scan(base), manifest.scan(mirror))
    assert known["old/deep/h"] is None and known["fresh/x/y"] is not None and "c/g" not in known
    # a directory replaced by a file: what was under it is gone too
    shutil.rmtree(mirror / "a")
    (mirror / "a").write_text("now a file")
    refreshed(base, mirror, known, ["a"], tmp_path)
    assert known == delta.between(manifest.scan(base), manifest.scan(mirror))
    # changed back to what the baseline has: no longer a difference
    (mirror / "top").write_text("top")
    refreshed(base, mirror, known, ["top"], tmp_path)
    assert "top" not in known
    assert delta.view(manifest.scan(base), known) == manifest.scan(mirror)


def test_no_symlink_in_the_mirror_is_followed(trees: tuple[Path, Path], tmp_path: Path) -> None:
    base, mirror = trees
    outside = tmp_path / "outside"
    (outside / "secret").parent.mkdir()
    (outside / "secret").write_text("host secret")
    shutil.rmtree(mirror / "c")
    (mirror / "c").symlink_to(outside)  # the guest swapped a directory for a link out of the tree
    known: delta.Delta = {}
    refreshed(base, mirror, known, ["c", "c/secret"], tmp_path)
    assert known["c"] == manifest.Entry(manifest.SYMLINK, 0o777, len(str(outside)), target=str(outside))
    assert "c/secret" not in known and known["c/g"] is None
    assert manifest.entry_under(mirror, "c/secret") is None
    assert manifest.scan_under(mirror, "c/secret") == {}


def test_a_lookup_reads_only_what_is_asked_and_cannot_be_listed(trees: tuple[Path, Path]) -> None:
    base, _ = trees
    (base / "ln").symlink_to("a")
    look = views.Lookup(base)
    assert look["top"].kind == manifest.FILE and "nothing" not in look and look.get("ln/b") is None
    assert set(look.known) == {"top", "nothing", "ln/b"}
    with pytest.raises(TypeError):
        list(look)


def test_a_review_of_the_named_paths_is_the_review_of_the_whole_tree(trees: tuple[Path, Path]) -> None:
    base, mirror = trees
    project = base.parent / "project"
    shutil.copytree(base, project, symlinks=True)
    (mirror / "top").write_text("guest")
    (mirror / "c/g").write_text("guest")
    (project / "c/g").write_text("host")  # both changed it: a conflict
    (project / "host-only").write_text("h")
    b, g = manifest.scan(base), manifest.scan(mirror)
    known = delta.between(b, g)
    whole = compare(b, manifest.scan(project), g)
    named = compare(b, views.Lookup(project), delta.view(b, known), only=known)
    assert [(c.path, c.status) for c in named] == [(c.path, c.status) for c in whole]
    assert {c.path: c.status for c in named} == {"c/g": Status.CONFLICT, "top": Status.APPLY}


def test_a_stored_manifest_makes_entries_as_asked_and_an_overlay_hides_what_is_gone() -> None:
    base = views.Stored(
        {"a": {"kind": "file", "mode": 0o644, "size": 1, "digest": "x"}, "b": {"kind": "dir", "mode": 0o755}}
    )
    assert base.made == {} and "a" in base and len(base) == 2
    assert base["a"] == manifest.Entry(manifest.FILE, 0o644, 1, digest="x") and set(base.made) == {"a"}
    over = views.Overlay(base, {"a": None, "c": manifest.Entry(manifest.DIR, 0o700)})
    assert "a" not in over and over.get("a") is None and over["b"].kind == manifest.DIR
    assert sorted(over) == ["b", "c"] and len(over) == 2
    assert over == {"b": manifest.Entry(manifest.DIR, 0o755), "c": manifest.Entry(manifest.DIR, 0o700)}
