"""Typed wrapper over qemu-img (it speaks JSON)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vmsandbox import filewrite, proc
from vmsandbox.errors import VmsandboxError

QCOW2_MAGIC = b"QFI\xfb"
QCOW2_HEADER = 104  # bytes of a qcow2 v3 header: its incompatible features at 72
QCOW2_EXTERNAL_DATA = 1 << 2  # the incompatible feature bit of an external data file
COPY_ROOM = 1024**3  # bytes left free at least after a fork's overlays are copied
# a qcow2 image the host made for a disk of N bytes holds at most N bytes of data and its tables: with 64 KiB
# clusters, 8 bytes of L2 table and 2 of refcount per cluster (N/6,554), its header, L1 and refcount table besides
# (taken as N/512 and 64 MiB: room to spare)
METADATA_SHARE, METADATA_ROOM = 512, 64 * 1024**2


@dataclass(frozen=True)
class ImageInfo:
    path: Path
    format: str
    virtual_size: int
    actual_size: int
    backing_file: str | None


def info(path: Path) -> ImageInfo:
    result = proc.run(["qemu-img", "info", "--output=json", "-U", path])
    data = json.loads(result.stdout)
    return ImageInfo(
        path=path,
        format=data["format"],
        virtual_size=int(data["virtual-size"]),
        actual_size=int(data.get("actual-size", 0)),
        backing_file=data.get("backing-filename"),
    )


def convert_to_qcow2(raw: Path, dest: Path) -> None:
    proc.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, dest])


def chain(path: Path) -> list[ImageInfo]:
    """The image and every image below it, top first (qemu-img follows the backing files)."""
    result = proc.run(["qemu-img", "info", "--backing-chain", "--output=json", "-U", path])
    data = json.loads(result.stdout)
    return [
        ImageInfo(
            path=Path(d["filename"]),
            format=d["format"],
            virtual_size=int(d["virtual-size"]),
            actual_size=int(d.get("actual-size", 0)),
            backing_file=d.get("backing-filename"),
        )
        for d in (data if isinstance(data, list) else [data])
    ]


def create_overlay(base: Path, dest: Path, size_bytes: int | None = None, *, depth: int = 1) -> None:
    """A qcow2 overlay on base. Base's chain must be qcow2 all the way down and at most `depth` images long:
    1 for a base image, 2 for a blueprint layer (base → layer), 3 for a warm-start template of a layer."""
    images = chain(base)
    if len(images) > depth or any(i.format != "qcow2" for i in images):
        described = " → ".join(f"{i.path.name} ({i.format})" for i in reversed(images))
        raise VmsandboxError(
            f"{base} is not a chain of at most {depth} qcow2 image(s): {described}",
            hint="rebuild the image with `vmsandbox image build --force`",
        )
    argv: list[str | Path] = ["qemu-img", "create", "-q", "-f", "qcow2", "-b", base, "-F", "qcow2", dest]
    if size_bytes is not None:
        argv.append(str(max(size_bytes, images[0].virtual_size)))
    proc.run(argv)


def overlay_unopened(base: Path, dest: Path, size_bytes: int) -> None:
    """A qcow2 overlay on the qcow2 image `base`, made without opening it (`-u`): its header may have been
    rewritten by a session's QEMU (to name a FIFO: qemu-img would wait on it for ever; another host to reach),
    so its size comes from the caller."""
    proc.run(["qemu-img", "create", "-q", "-u", "-f", "qcow2", "-b", base, "-F", "qcow2", dest, str(size_bytes)])


def overlay_on_raw(base: Path, dest: Path) -> None:
    """A qcow2 overlay on a raw image (its format given, never probed): what is written goes to the overlay,
    the raw image is only read. Made without opening the raw image (`-u`, its size from stat): the caller may
    not be able to read it (libvirt's QEMU account does)."""
    size = str(base.stat().st_size)
    proc.run(["qemu-img", "create", "-q", "-u", "-f", "qcow2", "-b", base, "-F", "raw", dest, size])


def rebase(image: Path, backing: Path) -> None:
    """Make `backing` the backing file of `image` without changing what `image` reads as: what its old
    backing chain held that `backing` does not is copied into `image` first. Neither may be in use."""
    proc.run(["qemu-img", "rebase", "-q", "-f", "qcow2", "-b", backing, "-F", "qcow2", image])


def rebase_pinned(images: Sequence[Path], base: Path, most: int, *, keep: int = 0) -> None:
    """Fold into `images[0]` what the images below it hold, without changing what it reads as: `images` (top first)
    above `base` are the chain the host recorded, told to qemu-img (`--image-opts`, and the new backing as a
    `json:` chain) rather than read from headers a session's QEMU may have rewritten. Its new backing: the last
    `keep` of `images` (their chain pinned too) on `base`, or `base` itself. Every one of `images` must keep its
    data in itself and read as at most `most` bytes (plain_qcow2: a header the QEMU rewrote to claim a petabyte
    would keep a rebase walking for hours). `base` and what is below it are read by their headers (images the
    host shares, root's). None may be in use."""
    for image in images:
        plain_qcow2(image, most)
    lower = list(images[len(images) - keep :]) if keep else []
    backing = lower[0] if lower else base
    argv: list[str | Path] = ["qemu-img", "rebase", "-q", "--image-opts", pinned(images, base)]
    # onto `base` itself, named by its path: qemu-img finds it at the bottom of the chain it was told and reads
    # only what the images above it hold (a `json:` backing is opened anew, and every cluster of the disk
    # compared: 1.3-3.5 s against 0.04 s for a session's 20 GiB disk). Were it not found, `base` would be opened
    # by its header: root's image, as below. The lower images' chain is pinned in a `json:` backing.
    new = str(base.absolute()) if not lower else "json:" + json.dumps(_chain_json([*lower, base]))
    proc.run([*argv, "-b", new, "-F", "qcow2"])
    # the header names what it reads: the new backing's path, not the json it was told
    proc.run(["qemu-img", "rebase", "-q", "-u", "-f", "qcow2", "-b", backing, "-F", "qcow2", images[0]])


def _chain_json(chain: Sequence[Path]) -> dict[str, object]:
    """The blockdev options of chain[0] with chain[1:] below it (the last one's own backing as its header says)."""
    node: dict[str, object] = {"driver": "qcow2", "file": {"driver": "file", "filename": str(chain[-1].absolute())}}
    for path in reversed(chain[:-1]):
        node = {"driver": "qcow2", "file": {"driver": "file", "filename": str(path.absolute())}, "backing": node}
    return node


def copy_above(overlays: Sequence[Path], base: Path, dest: Path, most: int) -> None:
    """`dest`: one qcow2 overlay on `base` that reads as the top of `overlays` does (every image between them folded
    in). `overlays`: the images above `base`, top first, as the host made them — qemu-img is told each one's
    backing image instead of reading it from their headers, which a session's QEMU can rewrite (to name a file of
    the host's: it would be read into `dest`), and an image whose header asks for an external data file (another
    way to name one) or claims more than `most` bytes is refused; `base` and the images below it are read as their
    headers say (images the host shares: root's, read-only). Every overlay is read from a copy of its own beside
    `dest` (a running QEMU of the session could change a header between its check and its use), the top's copy
    then rebased onto `base` with what the others hold (`qemu-img convert -B` would copy the top's clusters
    only)."""
    largest = most + most // METADATA_SHARE + METADATA_ROOM  # what an overlay of the host's can hold
    need = sum(min(o.stat().st_blocks * 512, largest) for o in overlays)
    free = shutil.disk_usage(dest.parent).free
    if need + COPY_ROOM > free:
        raise VmsandboxError(
            f"copying {need / 1024**3:.1f} GiB of overlays for it needs room that {dest.parent} has not "
            f"({free / 1024**3:.1f} GiB free)",
            hint="free space there (`vmsandbox gc`, `vmsandbox rm` of sessions you no longer need)",
        )
    copies = [dest, *(dest.with_name(f".{dest.name}.{n}") for n in range(1, len(overlays)))]
    try:
        for original, copy in zip(overlays, copies, strict=True):
            filewrite.copy_sparse(original, copy, most=largest)  # what it held then: its QEMU may write on
        rebase_pinned(copies, base, most)
    finally:
        for copy in copies[1:]:
            copy.unlink(missing_ok=True)


def plain_qcow2(path: Path, most: int) -> None:
    """Raises unless `path` is a qcow2 image that keeps its data in itself (no external data file) and reads as at
    most `most` bytes."""
    with path.open("rb") as f:
        head = f.read(QCOW2_HEADER)
    if len(head) < QCOW2_HEADER or head[:4] != QCOW2_MAGIC:
        raise VmsandboxError(f"{path} is not a qcow2 image")
    version = int.from_bytes(head[4:8], "big")
    incompatible = int.from_bytes(head[72:80], "big") if version >= 3 else 0
    if incompatible & QCOW2_EXTERNAL_DATA:
        raise VmsandboxError(f"{path} names an external data file in its header: it is not an overlay the host made")
    if int.from_bytes(head[24:32], "big") > most:
        raise VmsandboxError(f"{path} claims a larger disk than its session's: it is not an overlay the host made")


def pinned(overlays: Sequence[Path], base: Path) -> str:
    """qemu-img's --image-opts for the top of `overlays` (top first, absolute paths), each one's backing the next,
    the last's `base` (qcow2 all)."""
    opts: list[str] = []
    at = ""
    for path in (*overlays, base):
        escaped = str(path.absolute()).replace(",", ",,")
        opts += [f"{at}driver=qcow2", f"{at}file.driver=file", f"{at}file.filename={escaped}"]
        at += "backing."
    return ",".join(opts)
