"""Risky names at any depth and in any spelling a filesystem might equate; symlinks judged where they lead."""

from __future__ import annotations

import pytest

from vmsandbox.confine.resolve import Reach
from vmsandbox.sync.review.risk import nested_git_dir, normalize, risky_name
from vmsandbox.sync.tree.final import Final
from vmsandbox.sync.tree.manifest import DIR, SYMLINK, Entry


def link(target: str) -> Entry:
    return Entry(SYMLINK, 0o777, target=target)


def symlink_escape(path: str, trees: list[dict[str, Entry]]) -> str | None:
    """Why the link at `path` of the guest's tree (trees[0]) leads out once applied over the host's (trees[1], or
    the same tree), or None."""
    guest, host = trees[0], trees[-1]
    target = guest[path].target
    assert target is not None
    verdict = Final({} if len(trees) > 1 else guest, host, guest, fold=False).leads(path, target, {path: guest[path]})
    return None if verdict.reach is Reach.INSIDE else verdict.why


@pytest.mark.parametrize(
    "path",
    [
        ".git/config",
        "sub/.git/config",  # a nested repository's config (core.fsmonitor)
        "a/b/c/.git/hooks/post-checkout",
        "sub/.git",  # a .git *file* (gitdir: …) at any depth
        ".GIT/config",  # case-insensitive filesystems
        "sub/.Git/hooks/pre-commit",
        ".git./config",  # NTFS drops trailing dots and spaces
        ".git /config",
        "GIT~1/config",  # NTFS 8.3 short name
        ".g\u200cit/config",  # HFS+ ignores zero-width non-joiners
        ".v\u017fcode/tasks.json",  # NTFS upper-cases the long s (U+017F) to S: ".vscode" there
        "lib/.gitattributes",
        "vendor/x/.gitmodules",
        ".vmsandbox.yaml",
        "sub/.vmsandbox.yaml",
        ".vmsandbox/blueprints/claude.yaml",
        ".claude/settings.json",
        "pkg/.claude/settings.local.json",
        ".mcp.json",
        ".gemini/settings.json",
        ".codex/config.toml",
        "opencode.json",
        ".opencode/plugin/x.js",
        ".cursor/mcp.json",
        ".exrc",
        "src/.nvim.lua",
        ".dir-locals.el",
        ".pdbrc",
        "mise.toml",
        ".mise.toml",
        ".devcontainer.json",
        "proj.code-workspace",
        "frontend/.vscode/tasks.json",
        "crates/x/.cargo/config.toml",
        "web/.npmrc",
        "web/.yarn/releases/yarn-4.cjs",
        "svc/.github/workflows/ci.yml",
        "Jenkinsfile",
        "sub/JENKINSFILE",
        "tools/gradle/wrapper/gradle-wrapper.properties",
        ".hg/hgrc",
        "rust-toolchain.toml",
    ],
)
def test_risky_at_any_depth_and_in_any_case(path: str) -> None:
    assert risky_name(path) is not None, path


@pytest.mark.parametrize(
    "path",
    [
        "src/main.py",
        ".gitignore",
        ".github/ISSUE_TEMPLATE/bug.md",
        "docs/git.md",
        "gitlab/notes.txt",
        "my.git/readme",
        "vscode-notes.txt",
        ".yarn/cache/x.zip",
    ],
)
def test_ordinary_files_are_not_risky(path: str) -> None:
    assert risky_name(path) is None, path


def test_normalize() -> None:
    assert normalize(".GIT") == ".git"
    assert normalize(".git. . ") == ".git"
    assert normalize("Git~1") == ".git"
    assert normalize("\ufeff.git") == ".git"
    assert normalize("...") == "..."


def test_nested_git_dir() -> None:
    assert nested_git_dir(".git/config") is None  # the project's own repository
    assert nested_git_dir("sub/.git/objects/ab/cd") == "sub/.git"
    assert nested_git_dir("a/b/.GIT") == "a/b/.GIT"
    assert nested_git_dir("src/x.py") is None


@pytest.mark.parametrize(
    ("tree", "path"),
    [
        ({"a": link("/etc/passwd")}, "a"),
        ({"d/a": link("../../x")}, "d/a"),
        ({"a": link("..")}, "a"),
        # chained: s1 is inside (d), s2's text stays inside, but through s1 it climbs out
        ({"d/e/s1": link(".."), "d/e/s2": link("s1/../../etc/passwd")}, "d/e/s2"),
        # through a link that is absolute
        ({"abs": link("/"), "x": link("abs/etc")}, "x"),
        # a loop counts as leaving (it can never be judged inside)
        ({"l1": link("l2/x"), "l2": link("l1/x")}, "l1"),
    ],
)
def test_symlinks_that_leave(tree: dict[str, Entry], path: str) -> None:
    assert symlink_escape(path, [tree]) is not None


@pytest.mark.parametrize(
    ("tree", "path"),
    [
        ({"a": link("b")}, "a"),
        ({"d/a": link("../c")}, "d/a"),
        ({"a": link("b/../c")}, "a"),
        ({"d/e/s1": link(".."), "d/e/s2": link("s1/x")}, "d/e/s2"),
        ({"d": Entry(DIR, 0o755), "d/l": link("../d/../d/x")}, "d/l"),
    ],
)
def test_symlinks_that_stay(tree: dict[str, Entry], path: str) -> None:
    assert symlink_escape(path, [tree]) is None


def test_every_tree_is_followed() -> None:
    guest = {"x": link("up/y"), "up": Entry(DIR, 0o755)}  # in the guest, up is a directory
    host = {"up": link("..")}  # on the host it is a link out
    assert symlink_escape("x", [guest]) is None
    assert symlink_escape("x", [guest, host]) is not None
