"""The mirror's placeholders (sync.placeholders): no second copy of the project's data, yet every scan of the
mirror reads the baseline's hashes, rsync's quick check sees the baseline's sizes and times, and a review
reads real data. Only root can make a placeholder."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

import pytest

from vmsandbox.sync.tree import manifest, placeholders
from vmsandbox.sync.tree.hashcache import HashCache

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="trusted.* attributes need root")

OBJECT = ".git/objects/ab/" + "c" * 38
PACK = ".git/objects/pack/pack-" + "d" * 40 + ".pack"


def make_baseline(root: Path) -> manifest.Manifest:
    (root / "src").mkdir(parents=True)
    (root / "src/big.bin").write_bytes(os.urandom(1024 * 1024))
    (root / "src/run.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "src/run.sh").chmod(0o640)
    os.utime(root / "src/run.sh", ns=(1_600_000_000_000_000_000, 1_600_000_000_123_456_789))
    (root / "empty").write_bytes(b"")
    (root / "link").symlink_to("src/run.sh")
    for rel, data in ((".git/HEAD", b"ref: refs/heads/main\n"), (".git/refs/heads/main", b"a" * 40 + b"\n")):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    for rel in (OBJECT, PACK):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(os.urandom(5000))
    (root / ".git/objects/info").mkdir()
    (root / ".git/objects/info/alternates").write_text("/elsewhere\n")
    return manifest.scan(root)


@pytest.fixture
def trees(tmp_path: Path) -> tuple[Path, Path, manifest.Manifest]:
    baseline, mirror = tmp_path / "baseline", tmp_path / "mirror"
    entries = make_baseline(baseline)
    if not placeholders.supported(tmp_path):
        pytest.skip("this file system keeps no trusted.* attributes")
    placeholders.make(baseline, mirror, entries)
    return baseline, mirror, entries


def blocks(path: Path) -> int:
    return os.lstat(path).st_blocks


def stands_for(path: Path) -> str | None:
    fd = os.open(path, os.O_RDONLY)
    try:
        return manifest.placeholder_digest(fd)
    finally:
        os.close(fd)


def mirror_scan(mirror: Path) -> manifest.Manifest:
    return manifest.scan(mirror, cache=HashCache(None, placeholders=True))


def test_the_mirror_holds_no_data_but_scans_as_the_baseline(trees: tuple[Path, Path, manifest.Manifest]) -> None:
    baseline, mirror, entries = trees
    assert blocks(mirror / "src/big.bin") == 0 < blocks(baseline / "src/big.bin")
    assert mirror_scan(mirror) == entries
    for rel in ("src/big.bin", "src/run.sh", OBJECT, PACK):  # rsync's quick check: same size and mtime
        a, b = os.lstat(baseline / rel), os.lstat(mirror / rel)
        assert (a.st_size, a.st_mtime_ns, stat.S_IMODE(a.st_mode)) == (
            b.st_size,
            b.st_mtime_ns,
            stat.S_IMODE(b.st_mode),
        )
    assert not [p for p in (mirror / "src").iterdir() if p.name.startswith(placeholders.TMP)]


def test_git_metadata_stays_real_and_objects_do_not(trees: tuple[Path, Path, manifest.Manifest]) -> None:
    baseline, mirror, _ = trees
    for rel in (".git/HEAD", ".git/refs/heads/main", ".git/objects/info/alternates"):
        assert (mirror / rel).read_bytes() == (baseline / rel).read_bytes()
    for rel in (OBJECT, PACK):
        assert blocks(mirror / rel) == 0
        assert (mirror / rel).read_bytes() == bytes(5000)


def test_without_placeholders_a_scan_reads_zeros(trees: tuple[Path, Path, manifest.Manifest]) -> None:
    """Only the mirror's scans take the attribute: a scan of anything else hashes what is there."""
    _, mirror, entries = trees
    plain = manifest.scan(mirror)
    assert plain["src/big.bin"].digest == hashlib.sha256(bytes(1024 * 1024)).hexdigest()
    assert plain["src/big.bin"] != entries["src/big.bin"]


def test_fill_puts_the_baseline_data_in_with_the_placeholders_mode_and_times(
    trees: tuple[Path, Path, manifest.Manifest],
) -> None:
    baseline, mirror, entries = trees
    (mirror / "src/run.sh").chmod(0o750)  # as rsync does on a mode-only change: in place
    before = os.lstat(mirror / "src/run.sh")
    assert placeholders.fill(mirror, baseline, entries, ["src/run.sh", "src/big.bin", "missing", "src"]) == []
    for rel in ("src/run.sh", "src/big.bin"):
        assert (mirror / rel).read_bytes() == (baseline / rel).read_bytes()
        assert stands_for(mirror / rel) is None
    after = os.lstat(mirror / "src/run.sh")
    assert (stat.S_IMODE(after.st_mode), after.st_mtime_ns, after.st_uid) == (0o750, before.st_mtime_ns, before.st_uid)
    assert mirror_scan(mirror)["src/run.sh"] == manifest.Entry(
        manifest.FILE, 0o750, after.st_size, entries["src/run.sh"].digest
    )
    assert placeholders.fill(mirror, baseline, entries, ["src/big.bin"]) == []  # a real file: left alone


def test_a_placeholder_the_baseline_cannot_fill_is_removed(trees: tuple[Path, Path, manifest.Manifest]) -> None:
    baseline, mirror, entries = trees
    (baseline / "src/big.bin").write_bytes(b"pushed since")  # the baseline moved on
    moved = manifest.entry_of(baseline / "src/big.bin")
    assert moved is not None
    changed = {**entries, "src/big.bin": moved}
    assert placeholders.fill(mirror, baseline, changed, ["src/big.bin"]) == ["src/big.bin"]
    assert not (mirror / "src/big.bin").exists()
    (mirror / OBJECT).rename(mirror / "src/moved")  # a placeholder moved by the receiver: not its data there
    assert placeholders.fill(mirror, baseline, entries, ["src/moved"]) == ["src/moved"]
    assert not (mirror / "src/moved").exists()


def test_thin_makes_placeholders_of_files_equal_to_the_baseline(trees: tuple[Path, Path, manifest.Manifest]) -> None:
    baseline, mirror, entries = trees
    shutil.rmtree(mirror)
    shutil.copytree(baseline, mirror, symlinks=True)  # as a dead VM's disk is read: the whole tree
    (mirror / "src/run.sh").write_text("changed by the guest\n")
    placeholders.thin(mirror, entries, ["src/big.bin", ".git/HEAD", "src/run.sh", "gone"])
    assert blocks(mirror / "src/big.bin") == 0
    assert (mirror / ".git/HEAD").read_bytes() == b"ref: refs/heads/main\n"  # never a placeholder
    assert (mirror / "src/run.sh").read_text() == "changed by the guest\n"  # another size: left alone
    assert mirror_scan(mirror)["src/big.bin"] == entries["src/big.bin"]


def test_a_symlinked_directory_in_the_mirror_is_not_followed(
    trees: tuple[Path, Path, manifest.Manifest], tmp_path: Path
) -> None:
    """The receiver may have swapped a directory for a symlink: fill and thin never write through it."""
    baseline, mirror, entries = trees
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big.bin").write_bytes(b"x" * (1024 * 1024))
    shutil.rmtree(mirror / "src")
    (mirror / "src").symlink_to(outside)
    assert placeholders.fill(mirror, baseline, entries, ["src/big.bin"]) == []
    placeholders.thin(mirror, entries, ["src/big.bin"])
    assert (outside / "big.bin").read_bytes() == b"x" * (1024 * 1024)
    assert [p.name for p in outside.iterdir()] == ["big.bin"]


def test_only_root_can_make_a_placeholder(tmp_path: Path) -> None:
    """What the design rests on: the guest-data account (here: nobody) cannot set a trusted.* attribute on
    its own file, so neither rsync's receiver nor the guest behind it can forge a placeholder."""
    if not placeholders.supported(tmp_path):
        pytest.skip("this file system keeps no trusted.* attributes")
    own = tmp_path / "own"
    own.write_bytes(b"guest data")
    os.chown(own, 65534, 65534)
    tmp_path.chmod(0o755)
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        code = 2
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            os.setxattr(own, manifest.PLACEHOLDER_XATTR, bytes(32))
            code = 1
        except PermissionError:
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0  # refused: EPERM
    assert stands_for(own) is None


def test_a_malformed_attribute_is_not_a_placeholder(tmp_path: Path) -> None:
    if not placeholders.supported(tmp_path):
        pytest.skip("this file system keeps no trusted.* attributes")
    f = tmp_path / "f"
    f.write_bytes(b"data")
    os.setxattr(f, manifest.PLACEHOLDER_XATTR, b"not a digest")  # (12 bytes, not 32)
    assert (
        manifest.scan(tmp_path, cache=HashCache(None, placeholders=True))["f"].digest
        == hashlib.sha256(b"data").hexdigest()
    )


def test_unsettle_moves_named_files_a_second_back_and_nothing_else(
    trees: tuple[Path, Path, manifest.Manifest], tmp_path: Path
) -> None:
    """rsync compares the bytes of what the journal named (a quick check of size and time cannot skip it); a
    named directory's files, a symlink and what a symlinked directory leads to keep their times."""
    baseline, mirror, entries = trees
    placeholders.fill(mirror, baseline, entries, ["src/run.sh"])
    before = {rel: os.lstat(mirror / rel).st_mtime_ns for rel in ("src/run.sh", "src/big.bin", "link")}
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f").write_text("x")
    os.utime(outside / "f", ns=(0, 5 * 10**9))
    (mirror / "out").symlink_to(outside)
    placeholders.unsettle(mirror, ["src/run.sh", "src", "link", "out/f", "gone"])
    assert os.lstat(mirror / "src/run.sh").st_mtime_ns == before["src/run.sh"] - 10**9
    assert os.lstat(mirror / "src/big.bin").st_mtime_ns == before["src/big.bin"]
    assert os.lstat(mirror / "link").st_mtime_ns == before["link"]
    assert os.lstat(mirror / "src/run.sh").st_mtime_ns % 10**9 == 123_456_789  # (whole seconds: rsync's unit)
    assert os.lstat(outside / "f").st_mtime_ns == 5 * 10**9
