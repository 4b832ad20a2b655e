"""The base image's recipe: images/base.yaml (suite, packages, units, kernel command line) and the files laid
over the rootfs (images/base/rootfs/), plus the host's local CA certificates when trusted. Its hash is the
image's version: the same recipe builds the same version, and builds it once."""

from __future__ import annotations

import hashlib
import stat
from dataclasses import dataclass
from pathlib import Path

from vmsandbox.document import load_yaml
from vmsandbox.errors import VmsandboxError
from vmsandbox.filemodels import RecipeFile
from vmsandbox.schema import check

BUILDER_REVISION = "3"  # bump when the build steps change in a way the recipe files do not show
HOST_CA_DIR = Path("/usr/local/share/ca-certificates")


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
    data = check(load_yaml(recipe_file), RecipeFile, source=str(recipe_file))
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
