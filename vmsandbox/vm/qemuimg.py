"""Typed wrapper over qemu-img (it speaks JSON)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from vmsandbox import proc
from vmsandbox.errors import VmsandboxError


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


def copy_above(top: Path, base: Path, dest: Path) -> None:
    """`dest`: one qcow2 overlay on `base` that reads as `top` does (every image between them folded in).
    `base` must be in `top`'s backing chain."""
    proc.run(["qemu-img", "convert", "-q", "-f", "qcow2", "-O", "qcow2", "-B", base, "-F", "qcow2", top, dest])
