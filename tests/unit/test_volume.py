"""Where the mirror lives and who keeps its bound (sync.fetch.volume): the size of its own file system, reckoned
from the project and the bound; a mirror made once and then used; dropped whole; the ledger where nothing can
be mounted; and the kernel's refusal read as the bound it is (meter, spend). Mounting needs root and a real
kernel: tests/integration/test_hostile_guest.py boots a guest against it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from vmsandbox import proc, ui
from vmsandbox.confine import accounts
from vmsandbox.errors import VmsandboxError
from vmsandbox.paths import SessionPaths
from vmsandbox.sync.fetch import delta, meter, spend, volume
from vmsandbox.sync.tree import manifest
from vmsandbox.sync.tree.hashcache import HashCache
from vmsandbox.sync.tree.manifest import Entry
from vmsandbox.vm import ext4

MIB = 1024**2
DIGEST = "ab" * 32


def project(files: int, *, dirs: int = 0, kept: int = 0, long_links: int = 0) -> dict[str, Entry]:
    """A manifest: `files` files the mirror holds as placeholders, `kept` it holds whole (git's refs),
    `long_links` links whose target needs a block."""
    found: dict[str, Entry] = {f"f{i}": Entry(manifest.FILE, 0o644, 5000, DIGEST) for i in range(files)}
    found |= {f"d{i}": Entry(manifest.DIR, 0o755) for i in range(dirs)}
    if kept:
        found |= {".git": Entry(manifest.DIR, 0o755), ".git/refs": Entry(manifest.DIR, 0o755)}
        found |= {f".git/refs/r{i}": Entry(manifest.FILE, 0o644, 41, DIGEST) for i in range(kept)}
    found |= {f"l{i}": Entry(manifest.SYMLINK, 0o777, target="t" * 200) for i in range(long_links)}
    return found


def test_the_image_is_the_bound_and_what_the_project_takes() -> None:
    """With `sync_limit: 16M` the session's bound is 64 MiB: the image is that and the little an empty project
    takes; the guest's entries get one inode per block of the bound, so 40,000 empty directories (issue 57:
    158 MiB of the host's disk) can never all be made."""
    bound = spend.FACTOR * 16 * MIB
    empty = volume.size({}, bound, 2_000_000)
    assert bound < empty.length <= bound + 2 * MIB and empty.length % volume.BLOCK == 0
    assert empty.inodes == volume.SPARE_INODES + bound // volume.BLOCK < 40_000
    capped = volume.size({}, spend.FACTOR * 16 * 1024 * MIB, 2_000_000)  # the default: 16 GiB a pull
    assert capped.inodes == volume.SPARE_INODES + 2_000_000  # the most a guest's tree may hold, not 16 M


def test_a_placeholder_costs_an_inode_and_a_file_kept_whole_its_blocks() -> None:
    bound = 64 * MIB
    empty = volume.size({}, bound, 10**6)
    placeholders = volume.size(project(1000), bound, 10**6)
    # an inode each, and their names in the top directory (three blocks more, and its index), no data
    assert placeholders.inodes == empty.inodes + 1000
    assert placeholders.length - empty.length >= 1000 * volume.INODE + 3 * volume.BLOCK
    assert placeholders.length - empty.length <= 1000 * volume.INODE + 5 * volume.BLOCK
    refs = volume.size(project(0, kept=10), bound, 10**6)  # git's refs are real copies: a block each
    assert refs.length - empty.length >= 10 * volume.BLOCK + 2 * volume.BLOCK  # and their two directories
    links = volume.size(project(0, long_links=3), bound, 10**6)
    assert links.length - empty.length >= 3 * volume.BLOCK
    dirs = volume.size(project(0, dirs=100), bound, 10**6)
    assert dirs.length - empty.length >= 100 * (volume.BLOCK + volume.INODE)


@pytest.fixture
def session(tmp_path: Path) -> tuple[SessionPaths, manifest.Manifest]:
    """A session directory with its baseline and manifest, as capture leaves it (no mirror yet)."""
    if os.geteuid() != 0:
        pytest.skip("placeholders carry a trusted.* attribute, which only root can set")
    files = SessionPaths(tmp_path / "s")
    files.baseline.mkdir(parents=True)
    (files.baseline / "src").mkdir()
    (files.baseline / "src" / "main.py").write_text("print('hi')\n")
    (files.baseline / "README").write_text("read me\n")
    delta.save(files.root, {})
    return files, manifest.scan(files.baseline)


def test_without_a_file_system_of_its_own_the_mirror_is_a_directory_made_once(
    session: tuple[SessionPaths, manifest.Manifest], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain user mounts nothing: the mirror is a directory at mirror/guest, made the first time a pull
    needs it, then used as it is; the ledger bounds it (spend)."""
    files, base = session
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert not files.mirror.exists()  # the capture made none
    held = volume.ensure(files, base, bound=4 * MIB, max_entries=1000)
    assert held == volume.Held(own=False, bound=4 * MIB)
    scanned = manifest.scan(files.guest_tree, cache=HashCache(None, placeholders=True))
    assert scanned == base and not files.mirror_image.exists()
    assert files.mirror.stat().st_mode & 0o007 == 0 and not (files.mirror / volume.MAKING).exists()
    (files.guest_tree / "pulled").write_text("what a pull brought\n")
    assert volume.ensure(files, base, bound=4 * MIB, max_entries=1000) == held
    assert (files.guest_tree / "pulled").exists() and delta.load(files.root) == {}


def test_a_mirror_made_anew_is_the_baseline_and_its_old_delta_is_forgotten(
    session: tuple[SessionPaths, manifest.Manifest], monkeypatch: pytest.MonkeyPatch
) -> None:
    files, base = session
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    volume.ensure(files, base, bound=4 * MIB, max_entries=1000)
    (files.guest_tree / "pulled").write_text("x\n")
    delta.save(files.root, {"pulled": Entry(manifest.FILE, 0o644, 2, DIGEST)})
    spend.add(files.root, meter.Tally(spent=3 * MIB, entries=7))
    volume.drop(files)
    assert not files.mirror.exists() and not (files.root / spend.LEDGER).exists()
    volume.drop(files)  # (nothing left to drop: no error)
    volume.ensure(files, base, bound=4 * MIB, max_entries=1000)
    assert not (files.guest_tree / "pulled").exists()
    assert delta.load(files.root) is None  # it described what is gone: the next pull reads the whole tree


def test_a_half_made_mirror_is_never_taken_for_one(
    session: tuple[SessionPaths, manifest.Manifest], monkeypatch: pytest.MonkeyPatch
) -> None:
    files, base = session
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    (files.mirror / volume.MAKING).mkdir(parents=True)  # a pull killed while it made the mirror
    (files.mirror / volume.MAKING / "src").mkdir()
    volume.ensure(files, base, bound=4 * MIB, max_entries=1000)
    assert sorted(p.name for p in files.mirror.iterdir()) == ["guest"]


def test_where_the_kernel_mounts_nothing_root_is_told_and_the_ledger_bounds_it(
    session: tuple[SessionPaths, manifest.Manifest], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Root in a container without loop devices: no half-made image is left, the mirror is a directory, and
    a warning says the bound is counted, not the kernel's."""
    files, base = session
    made: list[list[str]] = []

    def mkfs(_source: Path | None, image: Path, size: str, **kwargs: Any) -> None:
        image.write_bytes(b"")
        made.append([size, str(kwargs["inodes"]), *map(str, kwargs["options"])])

    def mount(argv: list[object], **_kwargs: object) -> None:
        raise VmsandboxError(f"`{argv[0]}` failed: mount: failed to setup loop device")

    said: list[str] = []
    monkeypatch.setattr(ext4, "make", mkfs)
    monkeypatch.setattr(proc, "run", mount)
    monkeypatch.setattr(ui, "warn", said.append)
    monkeypatch.setattr(accounts, "guest_data_account", lambda: None)  # (whether `host setup` ran or not)
    held = volume.ensure(files, base, bound=64 * MIB, max_entries=1000)
    assert held == volume.Held(own=False, bound=64 * MIB) and files.guest_tree.is_dir()
    assert not files.mirror_image.exists()
    want = volume.size(base, 64 * MIB, 1000)
    assert made == [[f"{want.length // 1024}k", str(want.inodes), *volume.MKFS]]
    assert "-O" in volume.MKFS and "^has_journal" in volume.MKFS[volume.MKFS.index("-O") + 1]
    assert len(said) == 1 and "session s" in said[0] and "not bounded by the kernel" in said[0]
    assert volume.ensure(files, base, bound=64 * MIB, max_entries=1000) == held  # asked once, not every pull
    assert len(made) == 1


def test_the_mount_never_lets_a_device_a_setuid_bit_or_a_program_through() -> None:
    assert set(volume.MOUNT.split(",")) >= {"loop", "nodev", "nosuid", "noexec"}


def test_the_file_systems_refusal_stops_the_transfer_with_the_bound_it_is() -> None:
    """rsync goes on past a refused directory (and says so for each of 20,000): its first word that the file
    system is full ends the transfer, named as the bound the budget says it is; a line the guest's sender
    wrote does not."""
    killed: list[int] = []
    budget = meter.Budget(bytes=10**9, entries=10**6, full="more than session s's mirror may hold (64 MiB)")
    m = meter.Meter(7, budget, proc=Path("/nonexistent"), kill=killed.append)
    m.line('rsync: [sender] read errors mapping "/p/x": No space left on device (28)')
    assert killed == [] and m.passed is None
    m.line('rsync: [generator] recv_generator: mkdir "/s/mirror/guest/d1736" failed: No space left on device (28)')
    assert killed == [7] and m.passed == "more than session s's mirror may hold (64 MiB)"
    quota = meter.Meter(8, budget, proc=Path("/nonexistent"), kill=killed.append)
    quota.line('rsync: [receiver] write failed on "/s/mirror/guest/f": Disk quota exceeded (122)')
    assert killed == [7, 8]


def test_in_a_file_system_of_its_own_the_session_s_bound_is_not_counted(tmp_path: Path) -> None:
    """Without the ledger: no walk, no refusal from what a ledger says, the host's free space read where the
    session lives (the mirror's own file system is inside it), and the kernel's refusal named as the bound."""
    files = SessionPaths(tmp_path / "s")
    files.root.mkdir()
    spend.save(files.root, spend.Spend(bytes=10**12, entries=10**9))  # (a ledger left over: not read)
    budget = spend.room(files, 16 * MIB, max_entries=2_000_000, kernel=spend.FACTOR * 16 * MIB)
    assert budget.bytes == 16 * MIB and "in one pull" in budget.why
    assert budget.full == "more than session s's mirror may hold (64 MiB, 4 x sync_limit), past its bound"
    assert not files.guest_tree.exists()  # never walked
    (tmp_path / "t").mkdir()
    counted = spend.room(SessionPaths(tmp_path / "t"), 16 * MIB, max_entries=2_000_000)
    assert counted.full == "more than this machine's disk has free"


def test_a_refused_transfer_leaves_a_mirror_within_its_bound_and_drops_one_past_it(tmp_path: Path) -> None:
    """Stopped at a bound: the next pull reads the whole tree. In a file system of its own (the kernel's bound)
    what earlier pulls brought stays; counted, a mirror the receiver took past the session's bound before the
    meter read it is dropped (or no later pull would have room), one within it stays."""
    from vmsandbox.sync.fetch import mirror

    files = SessionPaths(tmp_path / "s")
    files.guest_tree.mkdir(parents=True)
    (files.guest_tree / "earlier").write_bytes(b"e" * 3 * MIB)
    for held in (volume.Held(own=True, bound=MIB), volume.Held(own=False, bound=4 * MIB)):
        delta.save(files.root, {})
        refused = mirror._refused(files, "more than 1 MiB in one pull", "s", held)
        assert refused.message.startswith("the guest sent more than 1 MiB in one pull: it was stopped")
        assert refused.hint is not None and "`vmsandbox shell s`" in refused.hint and "sync_limit" in refused.hint
        assert (files.guest_tree / "earlier").exists() and delta.load(files.root) is None
    for i in range(300):  # what the receiver made before the meter read it: past the session's 4 MiB
        (files.guest_tree / f"d{i}").mkdir()
    mirror._refused(files, "more than 1 MiB in one pull", "s", volume.Held(own=False, bound=4 * MIB))
    assert not files.mirror.exists() and not (files.root / spend.LEDGER).exists()
