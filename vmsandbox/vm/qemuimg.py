"""Typed wrapper over qemu-img (it speaks JSON)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
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


def create_overlay(base: Path, dest: Path, size_bytes: int | None = None, *, layer_ok: bool = False) -> None:
    """A qcow2 overlay on base. The base must be a standalone qcow2 — or, with layer_ok, a blueprint layer
    whose own backing file is a standalone qcow2 (chains are never deeper than base → layer → overlay)."""
    base_info = info(base)
    if layer_ok and base_info.format == "qcow2" and base_info.backing_file is not None:
        backing = Path(base_info.backing_file)
        if not backing.is_absolute():
            backing = base.parent / backing
        below = info(backing)
        if below.format == "qcow2" and below.backing_file is None:
            base_info = replace(base_info, backing_file=None)
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
