"""The paths a guest's commits touch, classed like the working tree's files (no git run here: its output is)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vmsandbox.sync.git.review import Kind, RefReview, Touch, parse_diff_tree, parse_numstat, risk_of_entry
from vmsandbox.sync.review.take import Take

C1, C2 = "a" * 40, "b" * 40
Z = "0" * 40


def meta(src: str, dst: str, status: str) -> str:
    return f":{src} {dst} {Z} {'1' * 40} {status}"


def test_a_commit_touching_hooks_and_env_loaders_is_risky() -> None:
    out = "\0".join(
        [
            C1,
            meta("000000", "100644", "A"), ".envrc",
            meta("000000", "100755", "A"), ".husky/pre-commit",
            meta("000000", "100644", "A"), "README.md",
            C2,  # a merge, against its second parent: an evil merge shows too
            meta("100755", "100755", "M"), "scripts/build.sh",
            meta("000000", "120000", "A"), "docs/link",
            meta("000000", "160000", "A"), "vendor/lib",
        ]
    ) + "\0"  # fmt: skip
    found = parse_diff_tree(out)
    risky = {t.path: t.why for _c, t in found if t is not None}
    assert set(risky) == {".envrc", ".husky/pre-commit", "scripts/build.sh", "docs/link", "vendor/lib"}
    assert risky["scripts/build.sh"] == "executable, its content changed"
    assert [c for c, t in found if t is None] == [C1]  # README.md, in the first commit


def test_a_path_named_like_a_commit_id_is_a_path() -> None:
    out = "\0".join([C1, meta("000000", "100644", "A"), C2, meta("000000", "100644", "A"), ".envrc"]) + "\0"
    found = parse_diff_tree(out)
    assert found == [(C1, None), (C1, Touch(".envrc", risk_of_entry("000000", "100644", "A", ".envrc") or ""))]


def test_output_that_is_not_diff_tree_is_refused() -> None:
    with pytest.raises(ValueError, match="unexpected"):
        parse_diff_tree(f"{C1}\0garbage\0")


@pytest.mark.parametrize(
    ("src", "dst", "status", "path", "risky"),
    [
        ("000000", "100644", "A", "src/main.py", False),
        ("100644", "100755", "M", "run.sh", True),
        ("100644", "000000", "D", ".github/workflows/ci.yml", True),  # deleting CI is a risky change too
        ("100644", "100644", "M", ".GIT./config", True),
    ],
)
def test_risk_of_one_entry(src: str, dst: str, status: str, path: str, risky: bool) -> None:
    assert (risk_of_entry(src, dst, status, path) is not None) is risky


def test_numstat_names_the_binary_paths_and_a_path_cannot_pose_as_a_commit() -> None:
    out = "\0".join([C1, "1\t0\t.gitignore", "-\t-\tlib/tool.so", C2, f"-\t-\t{C1}", "3\t1\tREADME.md"]) + "\0"
    assert parse_numstat(out) == {"lib/tool.so", C1}
    with pytest.raises(ValueError, match="unexpected"):
        parse_numstat(f"{C1}\0garbage\0")


def test_a_ref_is_held_by_each_kind_until_that_kind_is_taken() -> None:
    review = RefReview(
        "main",
        3,
        (
            Touch(".envrc", "an environment loader"),
            Touch(".venv/lib/site.pth", "ignored by the project (.gitignore)", Kind.IGNORED),
            Touch("tool.so", "binary", Kind.BINARY),
        ),
    )
    assert [t.kind for t in review.holds(Take())] == [Kind.RISKY, Kind.IGNORED, Kind.BINARY]
    assert [t.path for t in review.holds(Take(risky=True, binary=True))] == [".venv/lib/site.pth"]
    assert review.holds(Take(risky=True, ignored=True, binary=True)) == ()
    line = review.line("s1", Take(risky=True))
    assert ".venv/lib/site.pth" in line and "tool.so" in line and ".envrc" not in line
    assert "`vmsandbox pull s1 --include-ignored --include-binary` fetches it" in line


def test_refs_a_killed_pull_left_staged_are_found_loose_or_packed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vmsandbox.sync.git import review
    from vmsandbox.sync.git.repository import Repository

    dropped: list[str] = []
    monkeypatch.setattr(review, "drop_staged", lambda _repo, session: dropped.append(session))
    project = tmp_path / "p"
    (project / ".git" / "refs" / "vmsandbox-incoming" / "s1").mkdir(parents=True)
    (project / ".git" / "packed-refs").write_text(f"{C1} refs/vmsandbox-incoming/s2/main\n{C2} refs/heads/main\n")
    repo = Repository(project, None)
    assert [review.drop_leftover(repo, s) for s in ("s1", "s2", "s3", "s")] == [True, True, False, False]
    assert dropped == ["s1", "s2"]
    assert review.drop_leftover(Repository(tmp_path / "no-git", None), "s1") is False
