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


def create_overlay(base: Path, dest: Path, size_bytes: int | None = None) -> None:
    """A qcow2 overlay on base. The base must be a standalone qcow2 (never itself an overlay)."""
    base_info = info(base)
    if base_info.format != "qcow2" or base_info.backing_file is not None:
        raise VmsandboxError(
            f"{base} is not a standalone qcow2 image (format {base_info.format}, "
            f"backing file {base_info.backing_file})",
            hint="rebuild the base image with `vmsandbox image build --force`",
        )
    argv: list[str | Path] = ["qemu-img", "create", "-q", "-f", "qcow2", "-b", base, "-F", "qcow2", dest]
    if size_bytes is not None:
        argv.append(str(max(size_bytes, base_info.virtual_size)))
    proc.run(argv)
