"""The kept debootstrap tree: which recipes share it, when it may be unpacked as root, what replaces what."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from vmsandbox import proc
from vmsandbox.image import bootstrapcache
from vmsandbox.image.recipe import Recipe, load_recipe

REPO_IMAGES = Path(__file__).resolve().parents[2] / "images"


@pytest.fixture
def recipe() -> Recipe:
    return load_recipe(trust_host_ca=False, root=REPO_IMAGES)


def test_the_key_is_what_debootstrap_is_given_and_nothing_else(recipe: Recipe) -> None:
    k = bootstrapcache.key(recipe)
    assert bootstrapcache.key(replace(recipe, packages=tuple(reversed(recipe.packages)))) == k  # a set
    assert bootstrapcache.key(replace(recipe, chroot_commands=(), enable=(), kernel_cmdline="x")) == k
    for changed in (
        replace(recipe, suite="trixie"),
        replace(recipe, mirror="http://mirror.example/debian"),
        replace(recipe, variant="buildd"),
        replace(recipe, packages=(*recipe.packages, "vim")),
    ):
        assert bootstrapcache.key(changed) != k


def test_only_a_fresh_private_file_of_ours_is_unpacked(recipe: Recipe, tmp_path: Path) -> None:
    stage = bootstrapcache.Stage(tmp_path / "bootstrap", recipe)
    assert not stage.usable()
    assert stage.unpack(tmp_path / "rootfs") is False and not (tmp_path / "rootfs").exists()
    stage.directory.mkdir()
    stage.tar.write_bytes(b"tar")
    stage.tar.chmod(0o600)
    made = stage.tar.stat().st_mtime
    assert stage.usable(now=made + 60)
    assert not stage.usable(now=made + bootstrapcache.MAX_AGE + 1)  # stale: debootstrap again
    for mode in (0o620, 0o602):  # another account could have swapped its contents
        stage.tar.chmod(mode)
        assert not stage.usable(now=made + 60)
    stage.tar.chmod(0o600)
    stage.tar.unlink()
    stage.tar.symlink_to(tmp_path / "elsewhere.tar")
    (tmp_path / "elsewhere.tar").write_bytes(b"tar")
    assert not stage.usable()
    if os.geteuid() == 0:
        stage.tar.unlink()
        stage.tar.write_bytes(b"tar")
        os.chown(stage.tar, 4321, 4321)
        assert not stage.usable()


def test_a_tree_that_does_not_unpack_is_dropped_and_debootstrap_runs(
    recipe: Recipe, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stage = bootstrapcache.Stage(tmp_path / "bootstrap", recipe)
    stage.directory.mkdir()
    stage.tar.write_bytes(b"truncated")
    stage.tar.chmod(0o600)
    rootfs = tmp_path / "rootfs"

    def tar_fails(argv: list[str], **_: object) -> proc.Result:
        (rootfs / "half").write_text("unpacked so far")
        raise proc.CommandError(proc.Result(tuple(map(str, argv)), 2, "", "tar: Unexpected EOF in archive"))

    monkeypatch.setattr(proc, "run", tar_fails)
    assert stage.unpack(rootfs) is False  # the build goes on to debootstrap
    assert not rootfs.exists() and not stage.tar.exists()
