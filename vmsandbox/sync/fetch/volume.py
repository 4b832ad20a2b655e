"""Where the mirror of a session's guest tree lives, and the bound the kernel keeps on it.

Under root the mirror gets a file system of its own: an ext4 image in the session directory (`mirror.img`,
root's, 0600, sparse), made when a pull first needs the mirror and loop-mounted at `mirror/` (nodev, nosuid,
noexec, noatime). Its length is what the mirror may ever take of the host's disk: the session's bound (`bound`:
spend.FACTOR x sync_limit) plus what the project's own tree takes there (its directories, the files kept whole,
an inode each, see `size`); its inodes are the bound's blocks (at most `max_entries`) plus the project's
entries. So the receiver, however it spends the bound (bytes, empty directories, links, hard links, extended
attributes), is stopped by the kernel at it: ENOSPC, whatever it makes and however fast. The bound's own inode
tables come out of it: an entry costs at least its inode, as the meter charges it a block.

Only the host's kernel writes the image's metadata, and nothing else on the host parses it (no fsck, no
debugfs): the receiver writes files through the mount, as the guest-data account; the image itself is root's
in root's private session directory. An image that is not mounted (after a reboot or a crash) is never
mounted again: the mirror is a cache of the guest's tree, made anew from the baseline (and the next pull reads
the whole tree); so it needs no journal. It is made anew too when the bound grew (a higher `sync_limit`; a file
system is not grown in place: that needs CAP_SYS_RESOURCE, which not every root has), and kept when it shrank
(each pull takes less; the mirror keeps the bound it was made with). A transfer the kernel stopped leaves the
mirror within its bound, and what earlier pulls brought stays. `drop` is how a session's end, `rm` and
`rm --stale` remove it (a lazy unmount: a process still in it never keeps the session from going).

Without root (a plain member of the libvirt group) nothing can be mounted: the mirror is a directory at
`mirror/guest`, and its bound is spend's ledger, counted as the receiver works, so one transfer can pass it
before it is stopped (a mirror past the session's bound is then dropped: sync.fetch.mirror). The same holds
under root where the kernel has no loop device to give (a container): said once, when the mirror is made.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from vmsandbox import proc, ui
from vmsandbox.confine import accounts
from vmsandbox.errors import VmsandboxError
from vmsandbox.paths import SessionPaths
from vmsandbox.sync.fetch import delta, spend
from vmsandbox.sync.tree import placeholders
from vmsandbox.sync.tree.manifest import DIR, FILE, SYMLINK, Tree
from vmsandbox.vm import ext4

log = logging.getLogger(__name__)

BLOCK = 4096  # the file system's block (set, not left to mkfs: a small one would get 1 KiB blocks)
INODE = 256  # an inode's size: room for a placeholder's digest attribute beside it, so it takes no block
GROUP = BLOCK * 8 * BLOCK  # what one block group covers: its bitmaps, its descriptor, its inode table's tail
PER_GROUP = 4 * BLOCK
FIXED = 1024**2  # the superblock, the root and lost+found, the top's own files
SPARE_INODES = 16  # the 11 ext4 keeps, and the top's own (lost+found, `guest`, the one being made, BOUND)
FAST_SYMLINK = 60  # a link's target shorter than this lives in its inode
MKFS = ("-b", str(BLOCK), "-I", str(INODE), "-m", "0", "-O", "^has_journal,^resize_inode")
MOUNT = "loop,nodev,nosuid,noexec,noatime"
LABEL = "vmsandbox-mirror"
BOUND = "bound.json"  # in the file system's top (root's): the bound it was made for
MAKING = ".making"  # beside `guest` while the mirror is made: a mirror half made is never taken for one


@dataclass(frozen=True)
class Size:
    """An image for a mirror: `length` bytes (the most it takes of the host's disk, ever), `inodes` entries;
    `bound` of it is what the guest's changes may take."""

    length: int
    inodes: int
    bound: int


@dataclass(frozen=True)
class Held:
    """The mirror, ready: in a file system of its own (`own`: the kernel keeps `bound`), or a directory whose
    bound is the ledger's (spend)."""

    own: bool
    bound: int


def size(base: Tree, bound: int, max_entries: int) -> Size:
    """What an image must be to hold the mirror of `base` (placeholders for its files, sync.tree.placeholders) and
    `bound` bytes more, as ext4 spends them: a block at least per directory, the blocks of each file kept whole
    and of each long link, an inode per entry."""
    dirs: dict[str, int] = {"": 0}  # a directory's entries, in bytes (a name, padded, and 8 more)
    kept = 0
    for rel, entry in base.items():
        parent, _, name = rel.rpartition("/")
        dirs[parent] = dirs.get(parent, 0) + 8 + _up(len(os.fsencode(name)), 4)
        if entry.kind == DIR:
            dirs.setdefault(rel, 0)
        elif entry.kind == FILE and not placeholders.eligible(rel, entry):
            kept += _up(entry.size, BLOCK)
        elif entry.kind == SYMLINK and len(os.fsencode(entry.target or "")) >= FAST_SYMLINK:
            kept += BLOCK
    for used in dirs.values():  # (a block's last 12 bytes are its checksum; past one block, an index block)
        blocks = -(-(used + 24) // (BLOCK - 12))
        kept += (blocks + (blocks > 1)) * BLOCK
    inodes = len(base) + SPARE_INODES + min(max_entries, bound // BLOCK)
    ours = FIXED + kept + (len(base) + SPARE_INODES) * INODE
    groups = -(-(ours + bound) // GROUP)
    return Size(_up(ours + bound + groups * PER_GROUP, BLOCK), inodes, bound)


def ensure(files: SessionPaths, base: Tree, *, bound: int, max_entries: int) -> Held:
    """The session's mirror, made if it is not there (or not as it must be): the baseline's tree with
    placeholders for its files (`base`), the guest-data account's; in a file system of its own under root."""
    own = _own(files)
    if own is not None and own.get("bound", 0) >= bound:  # (a lower sync_limit bounds each pull; the mirror
        return Held(True, own["bound"])  # keeps the bound it was made with)
    if own is None and not files.mirror_image.exists() and files.guest_tree.is_dir() and not _is_mount(files):
        return Held(False, bound)  # a directory: a plain user's, or root's where nothing could be mounted
    drop(files)
    made = _make(files, base, size(base, bound, max_entries))
    return Held(made, bound)


def drop(files: SessionPaths) -> None:
    """The mirror gone from the host's disk (unmounted, its image removed, or its directory) with what
    described it: the next pull makes it anew and reads the whole tree."""
    if _is_mount(files):
        proc.run(
            ["umount", "--lazy", files.mirror],
            hint=f"is something mounted at {files.mirror}? `findmnt {files.mirror}`; then `vmsandbox rm --stale`",
        )
    files.mirror_image.unlink(missing_ok=True)
    if files.mirror.is_symlink():
        files.mirror.unlink()
    elif files.mirror.is_dir():
        shutil.rmtree(files.mirror)  # (by descriptors: nothing in it is followed)
    for stale in (files.root / spend.LEDGER, files.hashes("mirror")):
        stale.unlink(missing_ok=True)


def _make(files: SessionPaths, base: Tree, want: Size) -> bool:
    """The mirror made: in a file system of its own when we are root and the kernel mounts one (True)."""
    files.mirror.mkdir(mode=0o700)
    own = os.geteuid() == 0 and _mount_new(files, want)
    accounts.private_dir(files.mirror)  # (the top of the file system: root's) the guest-data account may pass
    making = files.mirror / MAKING
    try:
        placeholders.make(files.baseline, making, base)
    except OSError as exc:
        drop(files)
        raise VmsandboxError(
            f"could not make the mirror of session {files.root.name}'s guest tree: {exc.strerror}",
            hint=f"free space where vmsandbox keeps its state ({files.root.parent.parent}), then pull again",
        ) from exc
    accounts.hand_over(making, accounts.guest_data_account())
    making.rename(files.guest_tree)
    if delta.load(files.root) != {}:  # it described a mirror that held more than the baseline
        delta.forget(files.root)
    log.info(
        "session %s: its mirror made, %s",
        files.root.name,
        f"in {want.length / 1024**2:,.1f} MiB of its own ({want.inodes:,} inodes)" if own else "a directory",
    )
    return own


def _mount_new(files: SessionPaths, want: Size) -> bool:
    """A new image of `want`'s size mounted at the mirror's place; False (said) where that cannot be."""
    try:
        ext4.make(
            None,
            files.mirror_image,
            f"{want.length // 1024}k",
            label=LABEL,
            inodes=want.inodes,
            extended=("nodiscard", "root_owner=0:0"),
            options=MKFS,
        )
        files.mirror_image.chmod(0o600)
        proc.run(["mount", "-t", "ext4", "-o", MOUNT, files.mirror_image, files.mirror])
    except VmsandboxError as exc:
        files.mirror_image.unlink(missing_ok=True)
        ui.warn(
            f"the mirror of session {files.root.name} has no file system of its own ({exc.message.splitlines()[0]}): "
            "what it holds is counted as it fills, not bounded by the kernel"
        )
        return False
    (files.mirror / BOUND).write_text(json.dumps({"bound": want.bound, "length": want.length, "inodes": want.inodes}))
    return True


def _own(files: SessionPaths) -> dict[str, int] | None:
    """What the mirror's own file system was made for, if it is mounted, made whole and is the session's."""
    if not _is_mount(files) or _backing(files.mirror.stat().st_dev) != os.path.realpath(files.mirror_image):
        return None
    if not files.guest_tree.is_dir() or files.guest_tree.is_symlink():
        return None
    try:
        found = json.loads((files.mirror / BOUND).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _is_mount(files: SessionPaths) -> bool:
    try:
        here = files.mirror.lstat()
    except FileNotFoundError:
        return False
    return stat.S_ISDIR(here.st_mode) and here.st_dev != files.root.stat().st_dev


def _backing(dev: int, sysfs: Path = Path("/sys/dev/block")) -> str | None:
    """The file behind a loop device, as the kernel names it."""
    try:
        return (sysfs / f"{os.major(dev)}:{os.minor(dev)}" / "loop" / "backing_file").read_text().strip()
    except OSError:
        return None


def _up(n: int, unit: int) -> int:
    return -(-n // unit) * unit
