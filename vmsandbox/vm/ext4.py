"""ext4 images on the host, with e2fsprogs only (no mount, no loop device): made from a directory, checked,
read back. Used for the base image's root filesystem and for a session's workspace disk."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from vmsandbox import proc
from vmsandbox.confine import Identity, Limits
from vmsandbox.jail import Jail

# A new file reads as zeros: mkfs marks every inode table zeroed and writes none of those zeros (writing them
# allocated ~300 MiB of an 8 GiB disk), and the guest's kernel has no ext4lazyinit to run at boot (slow under
# TCG), as with lazy_itable_init=0.
PREZEROED = "assume_storage_prezeroed=1"


def make(
    source: Path,
    image: Path,
    size: str,
    *,
    label: str,
    inodes: int | None = None,
    extended: Sequence[str] = (),
    hint: str | None = None,
) -> None:
    """An ext4 filesystem of `size` (mkfs.ext4 units, e.g. 4096M or 8388608k) in a new sparse file at image,
    holding source's tree."""
    if image.exists() or image.is_symlink():
        raise ValueError(f"{image} exists: mkfs here assumes a new file, which reads as zeros")
    argv: list[str | Path] = ["mkfs.ext4", "-q", "-L", label]
    if inodes is not None:
        argv += ["-N", str(inodes)]
    argv += ["-E", ",".join([PREZEROED, *extended]), "-d", source, image, size]
    proc.run(argv, hint=hint)


def remove_dir(image: Path, name: str) -> None:
    """rmdir an (empty) directory at the top of the filesystem (mkfs makes a lost+found nobody asked for)."""
    proc.run(["debugfs", "-w", "-R", f"rmdir {name}", image])


def replay_and_check(
    device: str, *, as_user: Identity | None, limits: Limits | None, cwd: Path, fd: int
) -> proc.Result:
    """e2fsck -f -p: replay the journal of a filesystem whose machine died, fix what is safe to fix.
    Exit codes 0-2 mean usable. `device` names the inherited descriptor fd (/proc/self/fd/N). Jailed: it writes
    only the image (through that descriptor), nothing of the host's file system."""
    return proc.run(
        ["e2fsck", "-f", "-p", device], check=False, as_user=as_user, limits=limits, cwd=cwd, pass_fds=(fd,),
        jail=Jail(),
    )  # fmt: skip


def dump_tree(device: str, *, as_user: Identity | None, limits: Limits | None, cwd: Path, fd: int) -> None:
    """Copy the whole filesystem into cwd (debugfs rdump), jailed: a crafted image that makes debugfs write
    elsewhere finds every other path read-only."""
    proc.run(
        ["debugfs", "-R", "rdump / .", device], as_user=as_user, limits=limits, cwd=cwd, pass_fds=(fd,),
        jail=Jail(writable=(cwd,)),
    )  # fmt: skip
