"""The tree debootstrap made, kept for the next build of the same package set (as mkosi's incremental cache).

A build whose recipe changed only in what is laid over the tree (files, units, chroot commands, CA
certificates) unpacks the tree the last debootstrap of the same suite, mirror, variant and packages made,
instead of installing every package again (a minute or more of dpkg). It is kept as one uncompressed tar with
numeric owners, modes and extended attributes, root's alone, under the cache directory; only the newest per
suite. It goes stale: after MAX_AGE, or with `image build --force`, the build runs debootstrap again (and picks
up the mirror's updates) and keeps that tree instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from vmsandbox import proc, ui
from vmsandbox.image import store
from vmsandbox.image.recipe import Recipe

MAX_AGE = 7 * 24 * 3600
TAR_OPTIONS = ("--numeric-owner", "--xattrs", "--xattrs-include=*")  # file capabilities and ACLs are xattrs


def key(recipe: Recipe) -> str:
    """What debootstrap is given, hashed: the same key, the same tree (up to the mirror's updates)."""
    given = [recipe.suite, recipe.mirror, recipe.variant, sorted(recipe.packages)]
    return hashlib.sha256(json.dumps(given).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Stage:
    directory: Path
    recipe: Recipe

    @property
    def tar(self) -> Path:
        return self.directory / f"{self.recipe.suite}-{key(self.recipe)}.tar"

    def usable(self, now: float | None = None) -> bool:
        try:
            st = self.tar.lstat()
        except FileNotFoundError:
            return False
        fresh = (now if now is not None else time.time()) - st.st_mtime < MAX_AGE
        # root's own, written by a build: anything else is not unpacked as root
        return fresh and st.st_uid == os.geteuid() and not st.st_mode & 0o022 and self.tar.is_file()

    def unpack(self, rootfs: Path) -> bool:
        """Unpack the kept tree into rootfs (made here); False when there is none to use. One that does not
        unpack (a truncated file, a full disk) is removed with what it unpacked: debootstrap runs instead."""
        if not self.usable():
            return False
        made = time.strftime("%Y-%m-%d", time.localtime(self.tar.stat().st_mtime))
        try:
            with ui.step(f"Unpacking the Debian {self.recipe.suite} tree debootstrap made on {made} (cached)"):
                rootfs.mkdir(mode=0o755)
                proc.run(["tar", "-x", "-p", *TAR_OPTIONS, "-f", self.tar, "-C", rootfs])
        except proc.CommandError as exc:
            ui.warn(f"the kept debootstrap tree did not unpack, so debootstrap runs again: {exc.message}")
            store.remove_tree(rootfs)
            with contextlib.suppress(OSError):
                self.tar.unlink()
            return False
        return True

    def keep(self, rootfs: Path) -> None:
        """Keep rootfs as the tree for this package set, replacing older ones of the suite. Best effort: a
        build does not fail because its tree could not be kept."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        partial = self.tar.with_name(f".{self.tar.name}.{os.getpid()}")
        try:
            with ui.step("Keeping the installed tree for the next build of these packages"):
                proc.run(["tar", "-c", *TAR_OPTIONS, "-f", partial, "-C", rootfs, "."])
                partial.chmod(0o600)
                partial.replace(self.tar)
        except (OSError, proc.CommandError) as exc:
            ui.warn(f"the installed tree was not kept for the next build: {exc}")
            with contextlib.suppress(OSError):
                partial.unlink()
            return
        for older in self.directory.glob(f"{self.recipe.suite}-*.tar"):
            if older != self.tar:
                with contextlib.suppress(OSError):
                    older.unlink()
        for left in self.directory.glob(".*.tar.*"):  # what killed builds were writing, an hour on
            with contextlib.suppress(OSError):
                if time.time() - left.stat().st_mtime > 3600:
                    left.unlink()
