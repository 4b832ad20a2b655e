"""Bootstrap benchmark: debootstrap against mmdebstrap, each installing the base recipe's suite, variant and
packages into an empty directory with an empty package cache (both download everything), one after the other
in one run. Prints each tool's seconds, the ratio, and what each made (packages, bytes) so that "the same
image" can be checked, not assumed.

    sudo .venv/bin/python bench/bootstrap.py [--keep-going]

Needs root, network access to the recipe's mirror, debootstrap and mmdebstrap (`apt-get install mmdebstrap`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vmsandbox.image.recipe import Recipe, load_recipe


def _size(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            try:
                total += (Path(dirpath) / f).lstat().st_size
            except OSError:
                continue
    return total


def _packages(root: Path) -> dict[str, str]:
    out = subprocess.run(
        ["chroot", str(root), "dpkg-query", "-W", "-f", "${Package}\t${Version}\n"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(line.split("\t", 1) for line in out.splitlines() if "\t" in line)


def _run(argv: list[str]) -> float:
    started = time.monotonic()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.monotonic() - started


def debootstrap(recipe: Recipe, work: Path) -> float:
    cache = work / "deb-cache"
    cache.mkdir()
    argv = ["debootstrap", f"--variant={recipe.variant}", f"--cache-dir={cache}"]
    argv += [f"--include={','.join(recipe.packages)}", recipe.suite, str(work / "deb"), recipe.mirror]
    return _run(argv)


def mmdebstrap(recipe: Recipe, work: Path) -> float:
    argv = ["mmdebstrap", "--mode=root", f"--variant={recipe.variant}", "--format=directory"]
    argv += [f"--include={','.join(recipe.packages)}", recipe.suite, str(work / "mm"), recipe.mirror]
    return _run(argv)


def main() -> int:
    if os.geteuid() != 0:
        print("needs root (both tools chroot and set file ownership)", file=sys.stderr)
        return 2
    for tool in ("debootstrap", "mmdebstrap"):
        if shutil.which(tool) is None:
            print(f"{tool} is missing: apt-get install {tool}", file=sys.stderr)
            return 2
    recipe = load_recipe()
    with tempfile.TemporaryDirectory(prefix="vmsandbox-bench-", dir="/var/tmp") as tmp:
        work = Path(tmp)
        seconds = {"debootstrap": debootstrap(recipe, work), "mmdebstrap": mmdebstrap(recipe, work)}
        made = {"debootstrap": work / "deb", "mmdebstrap": work / "mm"}
        pkgs = {tool: _packages(root) for tool, root in made.items()}
        named = len(recipe.packages)
        print(f"recipe {recipe.version}: {recipe.suite}, variant {recipe.variant}, {named} packages named")
        for tool, root in made.items():
            print(f"{tool:12} {seconds[tool]:6.1f} s  {len(pkgs[tool])} packages  {_size(root) / 1024**2:7.1f} MiB")
        only_deb = sorted(set(pkgs["debootstrap"]) - set(pkgs["mmdebstrap"]))
        only_mm = sorted(set(pkgs["mmdebstrap"]) - set(pkgs["debootstrap"]))
        print(f"only in debootstrap's: {' '.join(only_deb) or '-'}")
        print(f"only in mmdebstrap's:  {' '.join(only_mm) or '-'}")
        print(f"mmdebstrap / debootstrap: {seconds['mmdebstrap'] / seconds['debootstrap']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
