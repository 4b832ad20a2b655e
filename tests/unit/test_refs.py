"""The guest's refs are read as files by us, never by git: names and ids checked, links never followed."""

from __future__ import annotations

from pathlib import Path

import pytest

from vmsandbox.sync.git import refs

A, B = "a" * 40, "b" * 40


def repo(root: Path) -> Path:
    git = root / ".git"
    (git / "refs" / "heads" / "feature").mkdir(parents=True)
    (git / "refs" / "tags").mkdir(parents=True)
    (git / "objects").mkdir()
    return git


@pytest.mark.parametrize(
    "name",
    ["refs/heads/main", "refs/heads/feature/x", "refs/tags/v1.0", "refs/heads/a_b+c-d"],
)
def test_valid_refs(name: str) -> None:
    assert refs.valid_ref(name)


@pytest.mark.parametrize(
    "name",
    [
        "refs/remotes/origin/main",  # not a branch or tag of the guest's
        "refs/heads/../../etc",
        "refs/heads/.hidden",
        "refs/heads/x.lock",
        "refs/heads/a..b",
        "refs/heads/a@{1}",
        "refs/heads/",
        "refs/heads/a b",
        "refs/heads/\x1b[2J",
        "HEAD",
    ],
)
def test_refused_ref_names(name: str) -> None:
    assert not refs.valid_ref(name)


def test_loose_refs_win_and_bad_ones_are_left_out(tmp_path: Path) -> None:
    git = repo(tmp_path)
    packed = ["# pack-refs with: peeled", f"{A} refs/heads/main", f"^{B}", f"{A} refs/tags/v1"]
    packed += [f"{A} refs/heads/x.lock", "zz refs/tags/v2"]  # a bad name, a bad id
    (git / "packed-refs").write_text("\n".join(packed) + "\n")
    (git / "refs/heads/main").write_text(f"{B}\n")  # loose wins over packed
    (git / "refs/heads/feature/sym").write_text("ref: refs/heads/main\n")  # symbolic: left out
    (git / "refs/heads/big").write_text(A + "\n" + "x" * 10_000)  # not a ref file
    (git / "refs/tags/link").symlink_to("/etc/passwd")  # never followed
    assert refs.read_refs(git) == {"refs/heads/main": B, "refs/tags/v1": A}


def test_a_refs_directory_that_is_a_link_is_not_walked(tmp_path: Path) -> None:
    git = repo(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "x").mkdir(parents=True)
    (elsewhere / "x" / "stolen").write_text(f"{A}\n")
    (git / "refs" / "tags").rmdir()
    (git / "refs" / "tags").symlink_to(elsewhere)
    assert refs.read_refs(git) == {}


def test_a_refs_directory_above_the_ref_spaces_that_is_a_link_is_not_read(tmp_path: Path) -> None:
    """`.git/refs` itself linked to another repository's refs (root reads them): nothing of it is read."""
    git = repo(tmp_path)
    other = repo(tmp_path / "other")
    (other / "refs/heads/secret-branch").write_text(f"{A}\n")
    for sub in ("heads/feature", "heads", "tags"):
        (git / "refs" / sub).rmdir()
    (git / "refs").rmdir()
    (git / "refs").symlink_to(other / "refs")
    assert refs.read_refs(git) == {}


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda g: (g / "commondir").write_text("/etc\n"), "commondir"),
        (
            lambda g: (g / "objects" / "info").mkdir() or (g / "objects/info/alternates").write_text("/x\n"),
            "alternates",
        ),
    ],
)
def test_a_repository_pointing_elsewhere_is_refused(tmp_path: Path, make: object, why: str) -> None:
    git = repo(tmp_path)
    make(git)  # type: ignore[operator]
    with pytest.raises(refs.Refused, match=why):
        refs.check_guest_gitdir(git)


def test_a_git_file_or_link_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / ".git").write_text("gitdir: /etc/.git\n")
    with pytest.raises(refs.Refused, match="gitdir"):
        refs.check_guest_gitdir(tmp_path / "a" / ".git")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / ".git").symlink_to(tmp_path / "a")
    with pytest.raises(refs.Refused, match="symlink"):
        refs.check_guest_gitdir(tmp_path / "b" / ".git")


def test_only_new_or_moved_refs_come_back() -> None:
    base = {"refs/heads/main": A, "refs/tags/v1": A}
    guest = {"refs/heads/main": B, "refs/tags/v1": A, "refs/heads/new": A}
    assert refs.changed_refs(base, guest) == {"refs/heads/main": B, "refs/heads/new": A}
