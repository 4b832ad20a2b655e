"""The mirror's own file system on the host's real kernel (sync.fetch.volume; no VM): made when first needed and
then used, made anew when it is not mounted or its bound changed, dropped whole; and a writer as the guest-data
account, jailed as the receiver is, stopped at the bound by the kernel whatever it makes: 40,000 empty
directories, links, attributes. tests/integration/test_hostile_guest.py pulls from a real guest against it."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from vmsandbox import proc
from vmsandbox.confine import accounts
from vmsandbox.confine.jail import Jail
from vmsandbox.paths import SessionPaths
from vmsandbox.sync.fetch import delta, volume
from vmsandbox.sync.tree import manifest
from vmsandbox.sync.tree.manifest import Entry

pytestmark = [pytest.mark.no_vm, pytest.mark.root("only root mounts a file system")]

MIB = 1024**2


@pytest.fixture
def session() -> Iterator[tuple[SessionPaths, manifest.Manifest]]:
    """A session directory as capture leaves it, where the guest-data account may pass (pytest's is root's)."""
    place = Path(tempfile.mkdtemp(prefix="vmsandbox-it-mirror-", dir="/var/tmp"))
    files = SessionPaths(place / "s")
    try:
        place.chmod(0o755)
        files.root.mkdir(mode=0o700)
        accounts.private_dir(files.root)
        (files.baseline / "src").mkdir(parents=True)
        (files.baseline / "src" / "main.py").write_bytes(os.urandom(300_000))
        (files.baseline / "README").write_text("read me\n")
        delta.save(files.root, {})
        yield files, manifest.scan(files.baseline)
    finally:
        volume.drop(files)
        shutil.rmtree(place, ignore_errors=True)


def mounted(files: SessionPaths) -> bool:
    return files.mirror.is_dir() and files.mirror.stat().st_dev != files.root.stat().st_dev


def test_the_mirror_is_made_once_in_its_own_file_system_and_dropped_whole(
    session: tuple[SessionPaths, manifest.Manifest],
) -> None:
    files, base = session
    held = volume.ensure(files, base, bound=8 * MIB, max_entries=10_000)
    assert held == volume.Held(own=True, bound=8 * MIB) and mounted(files)
    options = proc.run(["findmnt", "-n", "-o", "OPTIONS", files.mirror]).stdout.split(",")
    assert {"nodev", "nosuid", "noexec"} <= set(options)
    image = files.mirror_image.stat()
    assert image.st_uid == 0 and image.st_mode & 0o777 == 0o600  # root's: the receiver never sees it
    assert image.st_size == volume.size(base, 8 * MIB, 10_000).length
    assert files.guest_tree.stat().st_uid == accounts.guest_data_account().uid  # type: ignore[union-attr]
    main = files.guest_tree / "src" / "main.py"
    assert main.stat().st_size == 300_000 and main.stat().st_blocks == 0  # a placeholder: no second copy
    (files.guest_tree / "pulled").write_text("a pull's\n")
    assert volume.ensure(files, base, bound=8 * MIB, max_entries=10_000) == held
    assert (files.guest_tree / "pulled").exists()  # used as it is
    lower = volume.ensure(files, base, bound=4 * MIB, max_entries=10_000)  # a lower sync_limit: each pull's
    assert lower == held and (files.guest_tree / "pulled").exists()  # the mirror keeps the bound it has
    volume.ensure(files, base, bound=16 * MIB, max_entries=10_000)  # a higher one: made anew for it
    assert not (files.guest_tree / "pulled").exists()
    assert json.loads((files.mirror / volume.BOUND).read_text())["bound"] == 16 * MIB
    volume.drop(files)
    assert not mounted(files) and not files.mirror.exists() and not files.mirror_image.exists()


def test_an_image_left_unmounted_is_never_mounted_again(session: tuple[SessionPaths, manifest.Manifest]) -> None:
    """After a reboot or a crash the image is there and nothing is mounted: the mirror is made anew (nothing
    parses the old image), and the delta that described it is forgotten: the next pull reads the whole tree."""
    files, base = session
    volume.ensure(files, base, bound=8 * MIB, max_entries=10_000)
    (files.guest_tree / "pulled").write_text("a pull's\n")
    delta.save(files.root, {"pulled": Entry(manifest.FILE, 0o644, 9, "ab" * 32)})
    proc.run(["umount", files.mirror])
    with files.mirror_image.open("rb") as held:  # held open, the old inode's number cannot be given to the new image
        old = os.fstat(held.fileno()).st_ino
        assert volume.ensure(files, base, bound=8 * MIB, max_entries=10_000).own and mounted(files)
        assert files.mirror_image.stat().st_ino != old and not (files.guest_tree / "pulled").exists()
    assert delta.load(files.root) is None


def test_a_writer_is_stopped_at_the_bound_whatever_it_makes(session: tuple[SessionPaths, manifest.Manifest]) -> None:
    """As the receiver runs (the guest-data account, jailed, writing only the mirror): 40,000 empty directories,
    then links and attributes in what room is left. The kernel says no at the bound, and the image, whose length
    is the bound and the project's share, never takes more of the host's disk."""
    files, base = session
    bound = 4 * 4 * MIB  # `sync_limit: 4M`
    volume.ensure(files, base, bound=bound, max_entries=2_000_000)
    length = files.mirror_image.stat().st_size
    script = """
import errno, os
made = 0
try:
    for i in range(40000):
        os.mkdir("d%d" % i)
        made += 1
except OSError as e:
    assert e.errno == errno.ENOSPC, e
print(made)
for kind in ("link", "xattr"):
    try:
        for i in range(100000):
            if kind == "link":
                os.symlink("x" * 4000, "l%d" % i)
            else:
                os.setxattr("d%d" % (i % made), "user.k%d" % i, b"v" * 3000)
    except OSError as e:
        assert e.errno in (errno.ENOSPC, errno.EDQUOT), e
"""
    who = accounts.guest_data_account()
    limits = accounts.guest_data_limits(bound)
    jail = Jail((files.guest_tree,))
    r = proc.run(
        ["/usr/bin/python3", "-c", script], as_user=who, limits=limits, jail=jail, cwd=files.guest_tree, check=False
    )
    assert r.returncode == 0, r.stderr
    made = int(r.stdout.split()[0])
    assert 0 < made < bound // 4096  # each directory a block at least: fewer than the bound has blocks
    os.sync()
    assert files.mirror_image.stat().st_blocks * 512 <= length
    fs = os.statvfs(files.mirror)
    assert fs.f_bavail * fs.f_frsize < 64 * 1024 or fs.f_favail == 0  # full: the kernel, not a count, said no
