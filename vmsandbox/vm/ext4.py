"""ext4 images on the host, with e2fsprogs only (no mount, no loop device): made from a directory, or empty. Used
for the base image's root filesystem, a session's workspace disk and its mirror's file system (which the host's
kernel mounts: sync.fetch.volume). Never read back on the host: a disk the guest wrote is read by a VM
(session.end.diskreader)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from vmsandbox import proc

# A new file reads as zeros: mkfs marks every inode table zeroed and writes none of those zeros (writing them
# allocated ~300 MiB of an 8 GiB disk), and the guest's kernel has no ext4lazyinit to run at boot (slow under
# TCG), as with lazy_itable_init=0.
PREZEROED = "assume_storage_prezeroed=1"


def make(
    source: Path | None,
    image: Path,
    size: str,
    *,
    label: str,
    inodes: int | None = None,
    extended: Sequence[str] = (),
    options: Sequence[str] = (),
    hint: str | None = None,
) -> None:
    """An ext4 filesystem of `size` (mkfs.ext4 units, e.g. 4096M or 8388608k) in a new sparse file at image,
    holding source's tree (None: empty); `options`: more of mkfs.ext4's (-b, -m, -O ...)."""
    if image.exists() or image.is_symlink():
        raise ValueError(f"{image} exists: mkfs here assumes a new file, which reads as zeros")
    argv: list[str | Path] = ["mkfs.ext4", "-q", "-L", label, *options]
    if inodes is not None:
        argv += ["-N", str(inodes)]
    argv += ["-E", ",".join([PREZEROED, *extended])]
    if source is not None:
        argv += ["-d", source]
    argv += [image, size]
    proc.run(argv, hint=hint)


def remove_dir(image: Path, name: str) -> None:
    """rmdir an (empty) directory at the top of the filesystem (mkfs makes a lost+found nobody asked for)."""
    proc.run(["debugfs", "-w", "-R", f"rmdir {name}", image])
