"""Built images on disk: base images (`images/base-<version>/`) and blueprint layers (`images/bp-…/`), each a
directory with disk.qcow2, vmlinuz, initrd.img and manifest.json. Listing, the current one, removal, and the
build lock and the `.tmp-*` dance every build goes through, so a half-built image is never listed or used.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmsandbox import paths, proc, ui
from vmsandbox.confine import access, accounts
from vmsandbox.errors import VmsandboxError
from vmsandbox.image.recipe import load_recipe

PREFIX = "base-"
TMP_PREFIX = ".tmp-"


@dataclass(frozen=True)
class Image:
    version: str
    path: Path
    manifest: dict[str, Any]

    @property
    def disk(self) -> Path:
        return self.path / paths.IMAGE_DISK

    @property
    def kernel(self) -> Path:
        return self.path / paths.IMAGE_KERNEL

    @property
    def initrd(self) -> Path:
        return self.path / paths.IMAGE_INITRD

    @property
    def kernel_cmdline(self) -> str:
        return str(self.manifest["kernel_cmdline"])

    def summary(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "path": str(self.path),
            "built_at": self.manifest.get("built_at"),
            "build_seconds": self.manifest.get("build_seconds"),
            "disk_bytes": self.manifest.get("sizes", {}).get("disk_bytes"),
            "kernel": self.manifest.get("kernel_version"),
            "recipe_hash": self.manifest.get("recipe_hash"),
        }


def list_images(images_dir: Path | None = None, *, prefix: str = PREFIX) -> list[Image]:
    """Complete images (base images, or with another prefix blueprint layers), newest first. Directories in
    progress (`.tmp-*`) are never listed."""
    root = images_dir or paths.images_dir()
    found: list[Image] = []
    if not root.is_dir():
        return found
    for d in root.iterdir():
        if not d.name.startswith(prefix) or not (d / paths.IMAGE_MANIFEST).is_file():
            continue
        try:
            found.append(get_image_at(d, prefix=prefix))
        except (OSError, ValueError):
            continue
    return sorted(found, key=lambda i: str(i.manifest.get("built_at", "")), reverse=True)


def get_image(version: str) -> Image:
    for image in list_images():
        if image.version == version:
            return image
    raise VmsandboxError(f"no base image with version {version}", hint="see `vmsandbox image ls`")


def current_image() -> Image:
    """The image for the current recipe if built, else the newest built one (with a warning)."""
    images = list_images()
    if not images:
        raise VmsandboxError("no base image has been built yet", hint="run `vmsandbox image build`")
    wanted = load_recipe().version
    for image in images:
        if image.version == wanted:
            return image
    ui.warn(
        f"using base image {images[0].version}; the current recipe would build {wanted} "
        "(run `vmsandbox image build` to update)"
    )
    return images[0]


@contextlib.contextmanager
def build_lock(root: Path) -> Iterator[None]:
    with access.flocked(root / ".build.lock", wait="another image build is running; waiting for it to finish…"):
        yield


def mounts_under(path: Path) -> list[Path]:
    """Mount points at or below path, deepest first (debootstrap mounts /proc and /sys in its target)."""
    prefix = str(path.resolve())
    found = []
    with Path("/proc/self/mountinfo").open() as fh:
        for line in fh:
            mount_point = line.split()[4].replace("\\040", " ")
            if mount_point == prefix or mount_point.startswith(prefix + "/"):
                found.append(Path(mount_point))
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def remove_tree(path: Path) -> None:
    """Remove a build directory, first unmounting anything mounted inside it (never rm through /proc)."""
    if not path.exists():
        return
    for mount_point in mounts_under(path):
        proc.run(["umount", "--lazy", mount_point], check=False)
    if mounts_under(path):
        raise VmsandboxError(f"cannot unmount everything under {path}", hint=f"unmount it and remove {path}")
    shutil.rmtree(path, ignore_errors=True)


def remove_stale(root: Path) -> list[Path]:
    """Remove `.tmp-*` directories a killed build left behind. Call only while holding the build lock."""
    stale = sorted(root.glob(f"{TMP_PREFIX}*"))
    for path in stale:
        remove_tree(path)
    return stale


def build_in_place(
    root: Path,
    final: Path,
    build_into: Callable[[Path], None],
    *,
    force: bool,
    in_use: Callable[[], list[str]] = list,
) -> bool:
    """Under the build lock, build into a `.tmp-*` directory beside `final` and rename it into place, so a
    half-built image is never listed or used. False when `final` exists (another build may have finished it
    while we waited for the lock) and force is not set. A forced rebuild never replaces an image that
    `in_use()` names users of (sessions' overlays and layers rest on its exact bytes): checked before the
    build and again at the swap (sessions record their image before they make their overlay)."""
    if not os.access(root, os.W_OK | os.X_OK):
        raise access.not_writable(root)
    with build_lock(root):
        if final.exists() and not force:
            return False
        _refuse_if_used(final, in_use)
        remove_stale(root)
        work = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=root))
        try:
            with accounts.umask(0o022):  # an image is for every account (QEMU's, the guest's users)
                build_into(work)
            access.shared_dir(work)  # readable by all; the libvirt group's members may remove it (`image rm`)
            access.shared_dir(work / paths.IMAGE_TEMPLATES)  # every member may add a template for its VM shape
            _refuse_if_used(final, in_use)
            if final.exists():
                old = root / f"{TMP_PREFIX}old-{final.name}"
                final.rename(old)
                remove_tree(old)
            work.rename(final)
        finally:
            remove_tree(work)
    return True


def _refuse_if_used(final: Path, in_use: Callable[[], list[str]]) -> None:
    users = in_use() if final.exists() else []
    if users:
        raise VmsandboxError(
            f"{final.name} is in use by: {', '.join(users)}; rebuilding it would change the disk under them",
            hint="remove those sessions (`vmsandbox rm NAME`) and remove those blueprint images "
            "(`vmsandbox image rm VERSION`) first; a changed recipe builds a new version beside it instead",
        )


def get_image_at(path: Path, *, prefix: str = PREFIX) -> Image:
    manifest = json.loads((path / paths.IMAGE_MANIFEST).read_text())
    return Image(version=path.name.removeprefix(prefix), path=path, manifest=manifest)


def remove_image(image: Image, users: list[str], *, what: str) -> None:
    """Remove a built image (base or blueprint layer) unless `users` name something that uses it."""
    if users:
        raise VmsandboxError(
            f"{what} {image.version} is in use by: {', '.join(users)}",
            hint="remove those sessions (`vmsandbox rm NAME`) and remove those blueprint images first",
        )
    with build_lock(image.path.parent):
        tmp = image.path.parent / f"{TMP_PREFIX}rm-{image.path.name}"
        image.path.rename(tmp)  # disappears from `image ls` at once
        remove_tree(tmp)


def remove(version: str, users: list[str]) -> None:
    """Remove a built base image unless `users` (sessions, layers) name something that uses it."""
    remove_image(get_image(version), users, what="base image")
