"""Root hands a tree to the guest-data account while that account may be rewriting it: nothing outside the
tree is ever changed, whatever is swapped meanwhile."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from vmsandbox.confine import accounts

NOBODY = accounts.Identity(65534, 65534, (), "nobody")


def make_tree(root: Path) -> None:
    (root / "d" / "e").mkdir(parents=True)
    for f in (root / "a.txt", root / "d" / "b.sh", root / "d" / "e" / "c"):
        f.write_text("x")
    (root / "d" / "b.sh").chmod(0o4777)  # setuid and world-writable: never on the host
    (root / "link").symlink_to("/etc/passwd")


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another account needs root")
def test_a_tree_is_handed_over_and_its_unsafe_bits_dropped(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    make_tree(root)
    passwd = os.lstat("/etc/passwd")
    accounts.hand_over(root, NOBODY)
    for p in [root, *root.rglob("*")]:
        st = os.lstat(p)
        assert (st.st_uid, st.st_gid) == (65534, 65534), p
        assert stat.S_ISLNK(st.st_mode) or not st.st_mode & accounts.UNSAFE_BITS, p
    assert stat.S_IMODE(os.lstat(root).st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(root / "d" / "b.sh").st_mode) == 0o775
    after = os.lstat("/etc/passwd")
    assert (after.st_uid, after.st_mode) == (passwd.st_uid, passwd.st_mode)  # the link, not its target


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another account needs root")
def test_a_directory_swapped_for_a_link_meanwhile_is_never_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The account owning the tree swaps a directory for a link to one of ours at the worst moment: right
    after root listed it and began changing what is in it. The files behind the link, which carry the names
    the directory had, keep their owner and their bits; only the tree's own files were handed over."""
    outside = tmp_path / "outside"
    outside.mkdir()
    names = [f"f{i}" for i in range(5)]
    for n in names:
        (outside / n).write_text("root's")
        (outside / n).chmod(0o4755)
    root = tmp_path / "tree"
    (root / "d").mkdir(parents=True)
    for n in names:
        (root / "d" / n).write_text("guest's")
    real_chown = os.chown
    swapped: list[Path] = []

    def chown_then_swap(path: str | Path, uid: int, gid: int, **kwargs: object) -> None:
        real_chown(path, uid, gid, **kwargs)  # type: ignore[arg-type]
        where = str(Path(path).readlink()) if str(path).startswith("/proc/self/fd/") else str(path)
        if not swapped and where.startswith(f"{root / 'd'}/"):
            (root / "d").rename(root / "d.real")
            (root / "d").symlink_to(outside)
            swapped.append(root / "d")

    monkeypatch.setattr(os, "chown", chown_then_swap)
    accounts.hand_over(root, NOBODY)
    assert swapped
    for n in names:
        st = os.lstat(outside / n)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o4755), n
    assert sum(os.lstat(root / "d.real" / n).st_uid == 65534 for n in names) >= 1
