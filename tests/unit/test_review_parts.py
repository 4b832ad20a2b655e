"""The review's parts that need no VM: hunks and their composition, the mass-change guard, credential names,
conflict markers, `.vmsandboxignore` and taking paths out of a capture."""

from __future__ import annotations

from pathlib import Path

import pathspec
import pytest

from vmsandbox.sync import credentials, hunks, inbound, mass, merge, tree
from vmsandbox.sync.compare import Change, Status
from vmsandbox.sync.tree import DIR, FILE, Entry

OLD = b"".join(b"line %d\n" % i for i in range(1, 21))
NEW = OLD.replace(b"line 2\n", b"two\n").replace(b"line 10\n", b"").replace(b"line 19\n", b"nineteen\nand more\n")


def test_hunks_compose_back_to_either_text_and_anything_between() -> None:
    found = hunks.hunks(OLD, NEW)
    assert len(found) == 3
    assert hunks.compose(OLD, NEW, {h.index for h in found}) == NEW
    assert hunks.compose(OLD, NEW, set()) == OLD
    only_middle = hunks.compose(OLD, NEW, {1})
    assert only_middle == OLD.replace(b"line 10\n", b"")
    assert hunks.compose(OLD, NEW, {0, 2}) == NEW.replace(b"line 11\n", b"line 10\nline 11\n")


@pytest.mark.parametrize(
    ("old", "new"),
    [(b"", b"a\nb\n"), (b"a\nb\n", b""), (b"a", b"a\n"), (b"x\r\ny\r\n", b"x\r\nz\r\n"), (b"a\n", b"a\n")],
)
def test_hunks_hold_at_the_edges(old: bytes, new: bytes) -> None:
    every = {h.index for h in hunks.hunks(old, new)}
    assert hunks.compose(old, new, every) == new
    assert hunks.compose(old, new, set()) == old


def _changes(n: int, size: int = 10, where: str = "src/pkg") -> list[Change]:
    return [
        Change(f"{where}/f{i}.py", None, Entry(FILE, 0o644, size, digest="d"), None, Status.APPLY) for i in range(n)
    ]


def test_a_mass_change_is_named_by_what_crossed_the_threshold() -> None:
    limits = mass.Limits(files=100, size=1000)
    assert limits.judge(_changes(100, 1)) is None
    assert "101 changed paths" in (limits.judge(_changes(101, 1)) or "")
    assert "mass_change_size" in (limits.judge(_changes(2, 600)) or "")


def test_a_mass_change_is_grouped_by_directory_and_kind() -> None:
    found = [*_changes(30), *_changes(5, where="docs"), *_changes(2, where="src/pkg/deep/er")]
    groups = mass.grouped(found)
    assert [(g.where, g.kind, g.count) for g in groups] == [
        ("src/pkg/", "added", 32),
        ("docs/", "added", 5),
    ]


@pytest.mark.parametrize(
    ("path", "named"),
    [(".env", True), ("config/.env.production", True), (".env.example", False), ("keys/server.pem", True),
     ("home/.aws/credentials", True), (".aws/credentials", True), ("id_ed25519", True), ("src/main.py", False),
     ("credentials.py", False), ("terraform.tfvars", True)],
)  # fmt: skip
def test_credential_file_names(path: str, named: bool) -> None:
    assert (credentials.by_name(path) is not None) is named


def test_placeholders_are_not_credentials() -> None:
    assert credentials.PLACEHOLDER.search("key=vmsandbox-placeholder-" + "ab" * 16)
    assert not credentials.PLACEHOLDER.search("key=ghp_" + "ab" * 18)


def test_markers_left_in_an_edit_are_found() -> None:
    assert merge.has_markers(b"a\n<<<<<<< host\nb\n=======\nc\n>>>>>>> guest\n")
    assert merge.has_markers(b"=======\n")
    assert not merge.has_markers(b"a <<<<<<< b\nno markers at line starts\n")


def test_the_ignore_file_takes_paths_out_of_the_capture(tmp_path: Path) -> None:
    base = tmp_path / "baseline"
    (base / "secrets").mkdir(parents=True)
    (base / "secrets" / "prod.key").write_text("k")
    (base / "src").mkdir()
    (base / "src" / "a.py").write_text("a")
    (base / "src" / "local.cfg").write_text("c")
    manifest = tree.scan(base)
    spec = pathspec.GitIgnoreSpec.from_lines(["secrets/", "*.cfg", "!src/a.py"])
    left_out = inbound.ignored(manifest, spec)
    assert left_out == ["secrets", "src/local.cfg"]
    removed = inbound.remove(base, manifest, left_out)
    assert removed == 3
    assert sorted(manifest) == ["src", "src/a.py"]
    assert sorted(p.name for p in base.rglob("*")) == ["a.py", "src"]
    assert manifest["src"].kind == DIR
