"""Building the base image locally from Debian packages: debootstrap, the recipe's files and units, the host's
CA certificates, an ext4 filesystem made from the tree (no loop devices), converted to qcow2."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from vmsandbox import failpoint, paths, proc, ui
from vmsandbox.confine import access
from vmsandbox.errors import VmsandboxError
from vmsandbox.image import bootstrapcache
from vmsandbox.image.recipe import Recipe, load_recipe
from vmsandbox.image.store import PREFIX, Image, build_in_place, get_image_at, remove_tree
from vmsandbox.vm import ext4, qemuimg

log = logging.getLogger(__name__)

MIN_FREE_BYTES = 6 * 1024**3


def _require_build_host(root: Path) -> None:
    if os.geteuid() != 0:
        raise VmsandboxError(
            "building the base image needs root (debootstrap, file ownership in the image)",
            hint="run `sudo vmsandbox image build`",
        )
    for tool in ("debootstrap", "mkfs.ext4", "qemu-img", "chroot"):
        proc.which(tool)
    free = shutil.disk_usage(root).free
    if free < MIN_FREE_BYTES:
        raise VmsandboxError(
            f"only {free / 1024**3:.1f} GiB free under {root}; a build needs {MIN_FREE_BYTES // 1024**3} GiB",
            hint="free some space or point VMSANDBOX_DATA_DIR at a bigger disk",
        )


def build(
    *,
    force: bool = False,
    trust_host_ca: bool = True,
    recipe: Recipe | None = None,
    images_dir: Path | None = None,
    in_use: Callable[[str], list[str]] | None = None,
) -> tuple[Image, bool]:
    """Build the base image for the current recipe. Returns (image, built): built is False for a no-op."""
    recipe = recipe or load_recipe(trust_host_ca=trust_host_ca)
    root = images_dir or paths.images_dir()
    access.store_root(root)
    version = recipe.version
    final = root / f"{PREFIX}{version}"
    if final.exists() and not force:
        return get_image_at(final), False
    _require_build_host(root)
    users = (lambda: in_use(version)) if in_use else list
    # --force starts from a fresh debootstrap too (for the mirror's updates): no unpacked earlier tree
    built = build_in_place(root, final, lambda work: _build_into(recipe, work, fresh=force), force=force, in_use=users)
    return get_image_at(final), built


def _build_into(recipe: Recipe, work: Path, *, fresh: bool = False) -> None:
    started = time.time()
    failpoint.hit("image.begin")
    rootfs = work / "rootfs"
    stage = bootstrapcache.Stage(paths.cache_dir() / "bootstrap", recipe)
    if fresh or not stage.unpack(rootfs):
        _bootstrap(recipe, rootfs)
        stage.keep(rootfs)
    failpoint.hit("image.bootstrap")
    with ui.step("Configuring the guest (CA certificates, units, sshd, masks)"):
        _customise(recipe, rootfs)
    packages = _package_list(rootfs)
    kernel_version = _copy_boot_files(rootfs, work)
    rootfs_bytes = _tree_size(rootfs)
    with ui.step(f"Making a {recipe.filesystem_mib} MiB ext4 filesystem and converting it to qcow2"):
        raw = work / "disk.raw"
        ext4.make(
            rootfs,
            raw,
            f"{recipe.filesystem_mib}M",
            label="root",
            hint="is the recipe's filesystem_mib big enough for the packages?",
        )
        remove_tree(rootfs)
        failpoint.hit("image.convert")
        disk = work / paths.IMAGE_DISK
        qemuimg.convert_to_qcow2(raw, disk)
        raw.unlink()
    disk_info = qemuimg.info(disk)
    manifest = {
        "version": recipe.version,
        "recipe_hash": recipe.digest(),
        "suite": recipe.suite,
        "mirror": recipe.mirror,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "build_seconds": round(time.time() - started, 1),
        "kernel_version": kernel_version,
        "kernel_cmdline": recipe.kernel_cmdline,
        "host_ca_certs": [c.name for c in recipe.ca_certs],
        "sizes": {
            "disk_bytes": disk_info.actual_size,
            "disk_virtual_bytes": disk_info.virtual_size,
            "rootfs_bytes": rootfs_bytes,
        },
        "packages": packages,
    }
    (work / paths.IMAGE_MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    for name in (paths.IMAGE_DISK, paths.IMAGE_KERNEL, paths.IMAGE_INITRD, paths.IMAGE_MANIFEST):
        (work / name).chmod(0o444)  # never written after it is built
    work.chmod(0o755)


def _bootstrap(recipe: Recipe, rootfs: Path) -> None:
    """debootstrap the recipe's suite and packages into rootfs, its output's last line under the spinner."""
    cache = paths.cache_dir() / "debootstrap" / recipe.suite
    cache.mkdir(parents=True, exist_ok=True)
    with ui.step(f"Installing Debian {recipe.suite} and {len(recipe.packages)} packages (debootstrap)") as detail:

        def progress(line: str) -> None:  # its last line under the spinner; all of them in the log (--verbose)
            if line.strip():
                detail(line.strip()[:100])
                log.info("debootstrap: %s", line)

        proc.run(
            [
                "debootstrap",
                f"--variant={recipe.variant}",
                f"--cache-dir={cache}",
                f"--include={','.join(recipe.packages)}",
                recipe.suite,
                rootfs,
                recipe.mirror,
            ],
            hint=f"check that the mirror {recipe.mirror} is reachable (`apt-get update` on this host)",
            on_line=progress,
        )


def _customise(recipe: Recipe, rootfs: Path) -> None:
    _trust_host_cas(recipe, rootfs)
    _lay_files(recipe, rootfs)
    for command in recipe.chroot_commands:
        proc.run(["chroot", rootfs, *shlex.split(command)])
    _apply_units(recipe, rootfs)
    for removed in recipe.remove:
        (rootfs / removed).unlink(missing_ok=True)
    (rootfs / "etc/machine-id").write_text("")  # a fresh one per boot
    (rootfs / "etc/hostname").write_text("vmsandbox\n")
    (rootfs / "etc/resolv.conf").unlink(missing_ok=True)
    (rootfs / "etc/resolv.conf").write_text("# no DNS in the guest: names resolve on the host's proxy\n")
    for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for f in (rootfs / leftover).glob("*"):
            if f.is_file():
                f.unlink()


def _trust_host_cas(recipe: Recipe, rootfs: Path) -> None:
    if not recipe.ca_certs:
        return
    dest = rootfs / "usr/local/share/ca-certificates/vmsandbox-host"
    dest.mkdir(parents=True, exist_ok=True)
    for cert in recipe.ca_certs:
        shutil.copyfile(cert, dest / cert.name)
    proc.run(["chroot", rootfs, "update-ca-certificates"])


def _lay_files(recipe: Recipe, rootfs: Path) -> None:
    for src in recipe.files():
        target = rootfs / src.relative_to(recipe.rootfs_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink():
            target.unlink()
        shutil.copyfile(src, target)
        target.chmod(0o755 if os.access(src, os.X_OK) else 0o644)


def _apply_units(recipe: Recipe, rootfs: Path) -> None:
    """Enable, disable and mask as the guest's own systemctl does it offline in the chroot: [Install] sections
    whole (WantedBy=, RequiredBy=, Also=, Alias=), the same links `systemctl enable` makes on a booted guest."""
    for verb, units in (("enable", recipe.enable), ("disable", recipe.disable), ("mask", recipe.mask)):
        if units:
            proc.run(["chroot", rootfs, "systemctl", verb, *units])


def _package_list(rootfs: Path) -> dict[str, str]:
    result = proc.run(["chroot", rootfs, "dpkg-query", "-W", "-f", "${Package}\t${Version}\n"])
    return dict(line.split("\t", 1) for line in result.stdout.splitlines() if "\t" in line)


def _copy_boot_files(rootfs: Path, work: Path) -> str:
    kernels = sorted((rootfs / "boot").glob("vmlinuz-*"))
    if not kernels:
        raise VmsandboxError("the image has no kernel in /boot", hint="the recipe must install a linux-image package")
    kernel = kernels[-1]
    kernel_version = kernel.name.removeprefix("vmlinuz-")
    initrd = rootfs / "boot" / f"initrd.img-{kernel_version}"
    if not initrd.is_file():
        raise VmsandboxError(f"no initrd for kernel {kernel_version}", hint="is initramfs-tools installed?")
    shutil.copyfile(kernel, work / paths.IMAGE_KERNEL)
    shutil.copyfile(initrd, work / paths.IMAGE_INITRD)
    return kernel_version


def _tree_size(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            with contextlib.suppress(OSError):
                total += (Path(dirpath) / f).lstat().st_size
    return total
