from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from vmsandbox.errors import VmsandboxError
from vmsandbox.sync.land import write
from vmsandbox.sync.review.threeway import Change, Status, same_entry
from vmsandbox.sync.tree import manifest

OWNER = write.Owner(os.getuid(), os.getgid())


def change(root: Path, source: Path, path: str, *, guest: bool = True) -> Change:
    return Change(
        path,
        manifest.entry_of(root / path),
        manifest.entry_of(source / path) if guest else None,
        manifest.entry_of(root / path),
        Status.APPLY,
    )


def test_writes_file_with_mode_without_setuid(tmp_path: Path) -> None:
    root, src = tmp_path / "root", tmp_path / "src"
    (src / "d").mkdir(parents=True)
    root.mkdir()
    (src / "d" / "f").write_text("new")
    (src / "d" / "f").chmod(0o4755)
    write.apply_one(root, src, change(root, src, "d/f"), OWNER)
    assert (root / "d" / "f").read_text() == "new"
    assert (root / "d" / "f").stat().st_mode & 0o7777 == 0o755
    assert not [p for p in (root / "d").iterdir() if p.name.startswith(write.TMP_PREFIX)]


def test_never_writes_through_a_host_symlink(tmp_path: Path) -> None:
    root, src, outside = tmp_path / "root", tmp_path / "src", tmp_path / "outside"
    for d in (root, src / "link", outside):
        d.mkdir(parents=True)
    (root / "link").symlink_to(outside)  # a symlinked directory already on the host
    (src / "link" / "evil").write_text("x")
    c = Change("link/evil", None, manifest.entry_of(src / "link" / "evil"), None, Status.APPLY)
    with pytest.raises(write.UnsafePathError):
        write.apply_one(root, src, c, OWNER)
    assert list(outside.iterdir()) == []


def test_host_changed_since_review_is_left_alone(tmp_path: Path) -> None:
    root, src = tmp_path / "root", tmp_path / "src"
    root.mkdir()
    src.mkdir()
    (root / "f").write_text("old")
    (src / "f").write_text("guest")
    c = change(root, src, "f")
    (root / "f").write_text("host edit after the review")
    with pytest.raises(VmsandboxError, match="changed on the host"):
        write.apply_one(root, src, c, OWNER)
    assert (root / "f").read_text() == "host edit after the review"


def test_deletes_and_type_changes_in_order(tmp_path: Path) -> None:
    root, src = tmp_path / "root", tmp_path / "src"
    (root / "gone").mkdir(parents=True)
    (root / "gone" / "x").write_text("x")
    (root / "t").write_text("was a file")
    (src / "t").mkdir(parents=True)
    (src / "t" / "inner").write_text("i")
    changes = [
        change(root, src, "gone", guest=False),
        change(root, src, "gone/x", guest=False),
        change(root, src, "t"),
        Change("t/inner", None, manifest.entry_of(src / "t" / "inner"), None, Status.APPLY),
    ]
    for c in write.order(changes):
        write.apply_one(root, src, c, OWNER)
    assert not (root / "gone").exists()
    assert (root / "t" / "inner").read_text() == "i"


def test_symlink_created_as_symlink(tmp_path: Path) -> None:
    root, src = tmp_path / "root", tmp_path / "src"
    root.mkdir()
    src.mkdir()
    (src / "l").symlink_to("target-inside")
    write.apply_one(root, src, change(root, src, "l"), OWNER)
    assert (root / "l").readlink() == Path("target-inside")


def test_rejects_traversal_paths(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f").write_text("x")
    fd = os.open(tmp_path / "src" / "f", os.O_RDONLY)
    try:
        with pytest.raises(write.UnsafePathError):
            write.write_from(tmp_path, "../escape", fd, None, 0o644, OWNER)
    finally:
        os.close(fd)
    assert not (tmp_path.parent / "escape").exists()


def test_modes_land_masked_and_zeros_land_as_holes(tmp_path: Path) -> None:
    root, src = tmp_path / "root", tmp_path / "src"
    root.mkdir()
    src.mkdir()
    with (src / "sparse").open("wb") as fh:
        fh.write(b"head")
        fh.seek(64 * 1024**2)
        fh.write(b"tail")
    (src / "sparse").chmod(0o6777)
    write.apply_one(root, src, change(root, src, "sparse"), OWNER)
    st = (root / "sparse").stat()
    assert st.st_mode & 0o7777 == 0o775  # no setuid/setgid, not world-writable
    assert st.st_size == 64 * 1024**2 + 4
    assert st.st_blocks * 512 <= 256 * 1024  # the 64 MiB of zeros became a hole
    assert (root / "sparse").read_bytes()[-4:] == b"tail"


def test_a_file_swapped_after_the_review_is_not_applied(tmp_path: Path) -> None:
    root, src = tmp_path / "root", tmp_path / "src"
    root.mkdir()
    src.mkdir()
    (src / "f").write_text("what the review showed")
    c = change(root, src, "f")
    (src / "f").write_text("something else, same length!!")
    with pytest.raises(VmsandboxError, match="changed since the review"):
        write.apply_one(root, src, c, OWNER)
    assert not (root / "f").exists()
    assert not [p for p in root.iterdir() if p.name.startswith(write.TMP_PREFIX)]


def test_a_source_swapped_for_a_symlink_is_never_read(tmp_path: Path) -> None:
    root, src, secret = tmp_path / "root", tmp_path / "src", tmp_path / "secret"
    root.mkdir()
    src.mkdir()
    secret.write_text("host secret")
    (src / "f").write_text("x")
    c = change(root, src, "f")
    (src / "f").unlink()
    (src / "f").symlink_to(secret)
    with pytest.raises(VmsandboxError):
        write.apply_one(root, src, c, OWNER)
    assert not (root / "f").exists()


def test_a_disk_filling_up_mid_file_leaves_the_old_version_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC in the middle of a file (the space check passed, then something else filled the disk): the
    project keeps the old version and no temporary file; the error names the cause."""
    root, src = tmp_path / "root", tmp_path / "src"
    root.mkdir()
    src.mkdir()
    (root / "f").write_text("old version\n")
    (src / "f").write_bytes(os.urandom(3 * manifest.CHUNK))
    c = change(root, src, "f")
    real_write, written = os.write, [0]

    def filling(fd: int, data: bytes | memoryview) -> int:
        if written[0] > manifest.CHUNK:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written[0] += len(data)
        return real_write(fd, data)

    monkeypatch.setattr("vmsandbox.sync.land.write.os.write", filling)
    with pytest.raises(OSError, match="No space left on device"):
        write.apply_one(root, src, c, OWNER)
    assert (root / "f").read_text() == "old version\n"
    assert [p.name for p in root.iterdir()] == ["f"]


@pytest.mark.parametrize(("guest", "landed"), [(0o100, 0o700), (0o000, 0o700), (0o555, 0o755), (0o2777, 0o775)])
def test_a_directory_lands_with_its_owners_rwx_whatever_the_guest_set(tmp_path: Path, guest: int, landed: int) -> None:
    """(Audit F2: a guest's 0100 directory landed as it was, its owner could not list it, and what the guest had
    put in it was hidden from every later review.) A mode the guest set and the mode it landed as are the same
    change: the next pull does not show it again."""
    root = tmp_path / "root"
    root.mkdir()
    for rel in ("new", "kept"):
        c = Change(rel, None, manifest.Entry(manifest.DIR, guest), None, Status.APPLY)
        if rel == "kept":
            (root / rel).mkdir(mode=0o755)
            c = Change(rel, manifest.Entry(manifest.DIR, 0o755), manifest.Entry(manifest.DIR, guest),
                       manifest.entry_of(root / rel), Status.APPLY)  # fmt: skip
        write.apply_one(root, tmp_path / "src", c, OWNER)
        assert (root / rel).stat().st_mode & 0o7777 == landed
        assert same_entry(manifest.entry_of(root / rel), manifest.Entry(manifest.DIR, guest))
    assert not same_entry(
        manifest.Entry(manifest.DIR, 0o755), manifest.Entry(manifest.DIR, 0o700)
    )  # (the bits that land differ)
