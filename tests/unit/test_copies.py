"""Copies of files a session's QEMU may still write (its disks, copied for a checkpoint or a fork): holes kept,
and no more than the file held when the copy began, however it grows meanwhile."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from vmsandbox import filewrite
from vmsandbox.errors import VmsandboxError

MiB = 1024 * 1024


def _disk(path: Path) -> bytes:
    """A 16 MiB file: data at its start and at 5 MiB, holes between and at its end; its bytes."""
    with path.open("wb") as f:
        f.truncate(16 * MiB)
        f.write(b"a" * MiB)
        f.seek(5 * MiB)
        f.write(b"b" * (2 * MiB))
    return path.read_bytes()


def test_a_copy_holds_the_same_bytes_its_holes_still_holes_and_is_private(tmp_path: Path) -> None:
    src, dst = tmp_path / "disk.raw", tmp_path / "copy.raw"
    want = _disk(src)
    src.chmod(0o644)
    dst.write_bytes(b"left over" * 1000)  # made anew over what was there

    assert filewrite.copy_sparse(src, dst) == 3 * MiB
    assert dst.read_bytes() == want
    assert stat.S_IMODE(dst.stat().st_mode) == 0o600
    assert dst.stat().st_blocks * 512 <= src.stat().st_blocks * 512 < 16 * MiB  # the holes did not fill


def test_a_file_that_grows_while_it_is_copied_is_copied_as_far_as_it_reached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A QEMU its guest took over writes on into its disk while the host copies it: the copy ends at the size the
    file had when it began (`cp` followed the file for as long as it grew)."""
    src, dst = tmp_path / "disk.raw", tmp_path / "copy.raw"
    want = _disk(src)
    real = filewrite.copy_data

    def grown_first(fd: int, out: int, end: int, what: str, *, most: int | None = None) -> int:
        with src.open("ab") as f:  # (after the copy opened it)
            f.write(b"c" * (4 * MiB))
        return real(fd, out, end, what, most=most)

    monkeypatch.setattr(filewrite, "copy_data", grown_first)
    filewrite.copy_sparse(src, dst)
    assert src.stat().st_size == 20 * MiB
    assert dst.read_bytes() == want


def test_a_file_cut_short_while_it_is_copied_is_an_error(tmp_path: Path) -> None:
    src, dst = tmp_path / "disk.raw", tmp_path / "copy.raw"
    src.write_bytes(b"a" * MiB)
    with src.open("rb") as f, dst.open("wb") as out, pytest.raises(VmsandboxError, match="got shorter while"):
        filewrite.copy_data(f.fileno(), out.fileno(), 2 * MiB, str(src))


def test_a_link_or_a_fifo_in_a_disk_s_place_is_refused_and_not_waited_on(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("host's")
    link, fifo = tmp_path / "link.raw", tmp_path / "fifo.raw"
    link.symlink_to(secret)
    os.mkfifo(fifo)
    with pytest.raises(VmsandboxError, match="cannot read"):
        filewrite.copy_sparse(link, tmp_path / "from-link")
    assert not (tmp_path / "from-link").exists()

    said: list[BaseException] = []

    def copy() -> None:
        try:
            filewrite.copy_sparse(fifo, tmp_path / "from-fifo")
        except BaseException as exc:  # noqa: BLE001 (looked at below)
            said.append(exc)

    worker = threading.Thread(target=copy, daemon=True)
    worker.start()
    worker.join(30)
    if worker.is_alive():  # (it waits for a writer: let it go)
        os.close(os.open(fifo, os.O_WRONLY))
        worker.join()
        pytest.fail("the copy waited for a writer of the FIFO")
    assert len(said) == 1 and "is not a regular file" in str(said[0])


def test_data_moved_ahead_of_the_copy_stops_it_at_what_the_file_had_allocated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A QEMU can make its disk a terabyte of holes and keep its few MiB of data ahead of the copy (moving it
    forward costs it nothing): the copy stops past what the file held when it began, and leaves nothing."""
    src, dst = tmp_path / "disk.raw", tmp_path / "copy.raw"
    with src.open("wb") as f:
        f.truncate(1 << 40)
        f.write(b"a" * MiB)
    real = filewrite.copy_data

    def moved_ahead(fd: int, out: int, end: int, what: str, *, most: int | None = None) -> int:
        with src.open("r+b") as f:  # (as the data it had, written again further on, after the copy opened it)
            for at in range(1 << 30, (1 << 30) + 24 * MiB, MiB):
                f.seek(at)
                f.write(b"b" * MiB)
        return real(fd, out, end, what, most=most)

    monkeypatch.setattr(filewrite, "copy_data", moved_ahead)
    with pytest.raises(VmsandboxError, match="grew while it was copied: it held 1,048,576 bytes"):
        filewrite.copy_sparse(src, dst)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["disk.raw"]  # no copy, no part of one


def test_a_copy_replaces_what_has_the_copy_s_name_and_writes_through_nothing(tmp_path: Path) -> None:
    src, dst, other = tmp_path / "disk.raw", tmp_path / "copy.raw", tmp_path / "other"
    want = _disk(src)
    other.write_bytes(b"another file")
    dst.hardlink_to(other)
    filewrite.copy_sparse(src, dst)
    assert dst.read_bytes() == want and other.read_bytes() == b"another file"
    dst.unlink()
    os.mkfifo(dst)  # (opened, it would wait for a reader)
    for pid in (os.getpid(), 4_194_305, 1):  # this process's, one past the kernel's largest pid, a running one's
        (tmp_path / f".copy.raw.{pid}.copy").write_text("a copy killed half way")
    filewrite.copy_sparse(src, dst)
    assert stat.S_ISREG(dst.stat().st_mode) and dst.read_bytes() == want
    assert sorted(p.name for p in tmp_path.iterdir()) == [".copy.raw.1.copy", "copy.raw", "disk.raw", "other"]


def test_a_copy_without_room_for_what_its_file_holds_is_refused_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, dst = tmp_path / "disk.raw", tmp_path / "copy.raw"
    _disk(src)
    monkeypatch.setattr("vmsandbox.filewrite.shutil.disk_usage", lambda _p: SimpleNamespace(free=MiB))
    with pytest.raises(VmsandboxError, match=r"needs 0\.0 GiB that .* has not") as refused:
        filewrite.copy_sparse(src, dst)
    assert refused.value.hint is not None and "free space" in refused.value.hint
    assert not dst.exists()


def test_a_disk_is_copied_no_larger_than_the_host_made_it_whatever_it_claims_to_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its QEMU sets its size and what it counts as allocated (reserved extents count, and are holes to the copy):
    the size the host gave it bounds both."""
    src, dst = tmp_path / "workspace.raw", tmp_path / "copy.raw"
    want = _disk(src)
    with src.open("r+b") as f:
        os.posix_fallocate(f.fileno(), 16 * MiB, 200 * MiB)  # grown, and 200 MiB counted as held
    assert src.stat().st_blocks * 512 > 200 * MiB
    filewrite.copy_sparse(src, dst, most=16 * MiB)
    assert dst.read_bytes() == want  # as made: what it grew by is not copied

    src.write_bytes(b"a" * MiB)  # a disk made of 64 MiB that holds 1 MiB
    os.truncate(src, 64 * MiB)
    real = filewrite.copy_data

    def spread(fd: int, out: int, end: int, what: str, *, most: int | None = None) -> int:
        with src.open("r+b") as f:  # data written all over it once the copy opened it
            for at in range(8 * MiB, 48 * MiB, MiB):
                f.seek(at)
                f.write(b"c" * MiB)
        return real(fd, out, end, what, most=most)

    monkeypatch.setattr(filewrite, "copy_data", spread)
    with pytest.raises(VmsandboxError, match="grew while it was copied: it held 1,048,576 bytes"):
        filewrite.copy_sparse(src, dst, most=64 * MiB)


def test_each_overlay_of_a_fork_is_copied_no_larger_than_a_disk_of_its_size_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vmsandbox.vm import qemuimg

    overlays = [tmp_path / "top.qcow2", tmp_path / "low.qcow2"]
    for o in overlays:
        o.write_bytes(b"q" * MiB)
    bounds: list[int | None] = []

    def copied(_source: Path, _dest: Path, *, most: int | None = None) -> int:
        bounds.append(most)
        return 0

    monkeypatch.setattr(filewrite, "copy_sparse", copied)
    monkeypatch.setattr(qemuimg, "rebase_pinned", lambda *_a, **_kw: None)
    qemuimg.copy_above(overlays, tmp_path / "base.qcow2", tmp_path / "fork.qcow2", 20 * 1024**3)
    largest = 20 * 1024**3 + 20 * 1024**3 // qemuimg.METADATA_SHARE + qemuimg.METADATA_ROOM
    assert bounds == [largest, largest]
