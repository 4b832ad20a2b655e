"""The base image: a recipe (images/base.yaml + images/base/rootfs/), its build, and the built images.

A built image is a directory `images/base-<version>/` holding disk.qcow2 (standalone, read-only),
vmlinuz, initrd.img and manifest.json. It is built in a `.tmp-*` directory beside it and renamed into
place only when complete, so a half-built image is never listed or used.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmsandbox import confine, paths, proc, ui
from vmsandbox.errors import VmsandboxError
from vmsandbox.schema import check, load_yaml
from vmsandbox.vm import qemuimg

BUILDER_REVISION = "2"  # bump when the build steps below change in a way the recipe files do not show
HOST_CA_DIR = Path("/usr/local/share/ca-certificates")
PREFIX = "base-"
TMP_PREFIX = ".tmp-"
MIN_FREE_BYTES = 6 * 1024**3

RECIPE_FIELDS: dict[str, type] = {
    "suite": str,
    "mirror": str,
    "variant": str,
    "packages": list,
    "kernel_cmdline": str,
    "filesystem_mib": int,
    "chroot_commands": list,
    "enable": list,
    "disable": list,
    "mask": list,
    "remove": list,
}


def recipe_root() -> Path:
    """The images/ directory: inside an installed wheel, or at the top of a source checkout."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "_data" / "images", package.parent / "images"):
        if (candidate / "base.yaml").is_file():
            return candidate
    raise VmsandboxError(
        "the image recipe (images/base.yaml) is missing from this installation", hint="reinstall vmsandbox"
    )


@dataclass(frozen=True)
class Recipe:
    suite: str
    mirror: str
    variant: str
    packages: tuple[str, ...]
    kernel_cmdline: str
    filesystem_mib: int
    chroot_commands: tuple[str, ...]
    enable: tuple[str, ...]
    disable: tuple[str, ...]
    mask: tuple[str, ...]
    remove: tuple[str, ...]
    recipe_file: Path
    rootfs_dir: Path
    ca_certs: tuple[Path, ...]

    def files(self) -> list[Path]:
        return sorted(p for p in self.rootfs_dir.rglob("*") if p.is_file())

    def digest(self) -> str:
        """Hash of everything that shapes the image: recipe file, rootfs files (and modes), CA certs."""
        h = hashlib.sha256()
        h.update(f"builder {BUILDER_REVISION}\n".encode())
        h.update(self.recipe_file.read_bytes())
        for f in self.files():
            rel = f.relative_to(self.rootfs_dir)
            h.update(f"\nfile {rel} {stat.S_IMODE(f.stat().st_mode) & 0o111:o}\n".encode())
            h.update(f.read_bytes())
        for cert in self.ca_certs:
            h.update(f"\nca {cert.name}\n".encode())
            h.update(cert.read_bytes())
        return h.hexdigest()

    @property
    def version(self) -> str:
        return f"{self.suite}-{self.digest()[:12]}"


def host_ca_certs() -> tuple[Path, ...]:
    """The host's locally added CA certificates (what update-ca-certificates adds to Debian's bundle)."""
    if not HOST_CA_DIR.is_dir():
        return ()
    return tuple(sorted(p for p in HOST_CA_DIR.rglob("*.crt") if p.is_file()))


def load_recipe(*, trust_host_ca: bool = True, root: Path | None = None) -> Recipe:
    root = root or recipe_root()
    recipe_file = root / "base.yaml"
    data = check(load_yaml(recipe_file), RECIPE_FIELDS, source=str(recipe_file), required=tuple(RECIPE_FIELDS))
    return Recipe(
        suite=data["suite"],
        mirror=data["mirror"],
        variant=data["variant"],
        packages=tuple(data["packages"]),
        kernel_cmdline=data["kernel_cmdline"],
        filesystem_mib=data["filesystem_mib"],
        chroot_commands=tuple(data["chroot_commands"]),
        enable=tuple(data["enable"]),
        disable=tuple(data["disable"]),
        mask=tuple(data["mask"]),
        remove=tuple(data["remove"]),
        recipe_file=recipe_file,
        rootfs_dir=root / "base" / "rootfs",
        ca_certs=host_ca_certs() if trust_host_ca else (),
    )


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


# ---------------------------------------------------------------- building


@contextlib.contextmanager
def build_lock(root: Path) -> Iterator[None]:
    lock_path = root / ".build.lock"
    with lock_path.open("a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            ui.info("another image build is running; waiting for it to finish…")
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


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
    *, force: bool = False, trust_host_ca: bool = True, recipe: Recipe | None = None, images_dir: Path | None = None
) -> tuple[Image, bool]:
    """Build the base image for the current recipe. Returns (image, built): built is False for a no-op."""
    recipe = recipe or load_recipe(trust_host_ca=trust_host_ca)
    root = images_dir or paths.images_dir()
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    version = recipe.version
    final = root / f"{PREFIX}{version}"
    if final.exists() and not force:
        return get_image_at(final), False
    _require_build_host(root)
    built = build_in_place(root, final, lambda work: _build_into(recipe, work), force=force)
    return get_image_at(final), built


def build_in_place(root: Path, final: Path, build_into: Callable[[Path], None], *, force: bool) -> bool:
    """Under the build lock, build into a `.tmp-*` directory beside `final` and rename it into place, so a
    half-built image is never listed or used. False when `final` exists (another build may have finished it
    while we waited for the lock) and force is not set."""
    with build_lock(root):
        if final.exists() and not force:
            return False
        remove_stale(root)
        work = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=root))
        try:
            with confine.umask(0o022):  # an image is for every account (QEMU's, the guest's users)
                build_into(work)
            if final.exists():
                old = root / f"{TMP_PREFIX}old-{final.name}"
                final.rename(old)
                remove_tree(old)
            work.rename(final)
        finally:
            remove_tree(work)
    return True


def get_image_at(path: Path, *, prefix: str = PREFIX) -> Image:
    manifest = json.loads((path / paths.IMAGE_MANIFEST).read_text())
    return Image(version=path.name.removeprefix(prefix), path=path, manifest=manifest)


def _build_into(recipe: Recipe, work: Path) -> None:
    started = time.time()
    rootfs = work / "rootfs"
    cache = paths.cache_dir() / "debootstrap" / recipe.suite
    cache.mkdir(parents=True, exist_ok=True)
    with ui.step(f"Installing Debian {recipe.suite} and {len(recipe.packages)} packages (debootstrap)"):
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
        )
    with ui.step("Configuring the guest (CA certificates, units, sshd, masks)"):
        _customise(recipe, rootfs)
    packages = _package_list(rootfs)
    kernel_version = _copy_boot_files(rootfs, work)
    rootfs_bytes = _tree_size(rootfs)
    with ui.step(f"Making a {recipe.filesystem_mib} MiB ext4 filesystem and converting it to qcow2"):
        raw = work / "disk.raw"
        # Initialise inode tables and journal now: otherwise every boot pays ext4lazyinit under TCG.
        # The zeros cost nothing in the qcow2.
        proc.run(
            [
                "mkfs.ext4",
                "-q",
                "-L",
                "root",
                "-E",
                "lazy_itable_init=0,lazy_journal_init=0",
                "-d",
                rootfs,
                raw,
                f"{recipe.filesystem_mib}M",
            ],
            hint="is the recipe's filesystem_mib big enough for the packages?",
        )
        remove_tree(rootfs)
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


def _customise(recipe: Recipe, rootfs: Path) -> None:
    _trust_host_cas(recipe, rootfs)
    _lay_files(recipe, rootfs)
    for command in recipe.chroot_commands:
        proc.run(["chroot", rootfs, *shlex.split(command)])
    _apply_units(recipe, rootfs / "etc/systemd/system")
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


def _apply_units(recipe: Recipe, units: Path) -> None:
    for unit in recipe.enable:
        _enable(units, unit)
    for unit in recipe.disable:
        for wants in units.glob("*.wants"):
            (wants / unit).unlink(missing_ok=True)
    for unit in recipe.mask:
        link = units / unit
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")


def _enable(units: Path, unit: str) -> None:
    text = (units / unit).read_text()
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "WantedBy":
            for target in value.split():
                wants = units / f"{target}.wants"
                wants.mkdir(exist_ok=True)
                link = wants / unit
                link.unlink(missing_ok=True)
                link.symlink_to(f"/etc/systemd/system/{unit}")


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


def remove(version: str, *, in_use: Callable[[str], list[str]]) -> None:
    """Remove a built base image unless something uses it (`in_use` names the sessions and layers that do)."""
    remove_image(get_image(version), in_use(version), what="base image")


def remove_image(image: Image, users: list[str], *, what: str) -> None:
    """Remove a built image (base or blueprint layer) unless `users` name something that uses it."""
    if users:
        raise VmsandboxError(
            f"{what} {image.version} is in use by: {', '.join(users)}",
            hint="destroy those sessions (`vmsandbox destroy NAME`) and remove those blueprint images first",
        )
    with build_lock(image.path.parent):
        tmp = image.path.parent / f"{TMP_PREFIX}rm-{image.path.name}"
        image.path.rename(tmp)  # disappears from `image ls` at once
        remove_tree(tmp)
