from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from vmsandbox import paths
from vmsandbox.errors import VmsandboxError
from vmsandbox.image import store
from vmsandbox.image.recipe import load_recipe

REPO_IMAGES = Path(__file__).resolve().parents[2] / "images"


@pytest.fixture
def recipe_copy(tmp_path: Path) -> Path:
    dest = tmp_path / "images"
    shutil.copytree(REPO_IMAGES, dest)
    return dest


def test_shipped_recipe_is_valid_and_has_what_sessions_need() -> None:
    recipe = load_recipe(trust_host_ca=False, root=REPO_IMAGES)
    for pkg in ("linux-image-cloud-amd64", "openssh-server", "rsync", "sudo", "git", "docker.io", "apparmor"):
        assert pkg in recipe.packages
    assert "vmsandbox-identity.service" in recipe.enable
    assert "systemd-networkd-wait-online.service" in recipe.mask
    assert "apparmor=0" in recipe.kernel_cmdline and "console=ttyS0" in recipe.kernel_cmdline


def test_version_changes_with_any_recipe_input(recipe_copy: Path, tmp_path: Path) -> None:
    v1 = load_recipe(trust_host_ca=False, root=recipe_copy).version
    assert load_recipe(trust_host_ca=False, root=recipe_copy).version == v1  # stable
    script = recipe_copy / "base/rootfs/usr/local/lib/vmsandbox/net"
    script.write_text(script.read_text() + "# changed\n")
    v2 = load_recipe(trust_host_ca=False, root=recipe_copy).version
    assert v2 != v1
    script.chmod(0o644)  # the executable bit is part of the recipe too
    assert load_recipe(trust_host_ca=False, root=recipe_copy).version != v2


def test_recipe_typo_is_an_error_naming_the_key(recipe_copy: Path) -> None:
    f = recipe_copy / "base.yaml"
    f.write_text(f.read_text().replace("packages:", "pakages:"))
    with pytest.raises(VmsandboxError, match="unknown key `pakages`"):
        load_recipe(root=recipe_copy)


def fake_image(root: Path, version: str, built_at: str) -> Path:
    d = root / f"base-{version}"
    d.mkdir(parents=True)
    (d / paths.IMAGE_MANIFEST).write_text(json.dumps({"built_at": built_at, "kernel_cmdline": "x"}))
    return d


def test_list_ignores_builds_in_progress_and_incomplete_dirs(tmp_path: Path) -> None:
    root = tmp_path / "imgs"
    fake_image(root, "a", "2026-01-01T00:00:00Z")
    fake_image(root, "b", "2026-02-01T00:00:00Z")
    (root / ".tmp-xyz").mkdir()
    (root / "base-half").mkdir()  # no manifest: never complete
    assert [i.version for i in store.list_images(root)] == ["b", "a"]


def test_remove_refused_while_in_use_then_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_image(paths.images_dir(), "v1", "2026-01-01T00:00:00Z")
    with pytest.raises(VmsandboxError, match="in use by: session s1"):
        store.remove("v1", ["session s1"])
    assert store.list_images()
    store.remove("v1", [])
    assert store.list_images() == []
    assert list(paths.images_dir().glob(".tmp-*")) == []


def test_remove_stale_builds(tmp_path: Path) -> None:
    (tmp_path / ".tmp-1" / "rootfs" / "etc").mkdir(parents=True)
    keep = fake_image(tmp_path, "ok", "2026-01-01T00:00:00Z")
    assert store.remove_stale(tmp_path) == [tmp_path / ".tmp-1"]
    assert not (tmp_path / ".tmp-1").exists() and keep.exists()


def test_no_image_says_how_to_build() -> None:
    with pytest.raises(VmsandboxError) as err:
        store.current_image()
    assert err.value.hint == "run `vmsandbox image build`"


def test_layers_keep_one_version_and_are_refused_while_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """A layer's version is the same from `image ls`, from a session's record and from `image rm`."""
    from vmsandbox.cli import base, main
    from vmsandbox.image import layers

    from .conftest import saved_record

    fake_image(paths.images_dir(), "v1", "2026-01-01T00:00:00Z")
    layer = paths.images_dir() / "bp-claude-abc"
    layer.mkdir()
    (layer / paths.IMAGE_MANIFEST).write_text(json.dumps({"built_at": "x", "base_version": "v1"}))
    assert [i.version for i in layers.list_layers()] == ["claude-abc"]
    assert store.get_image_at(layer, prefix=layers.PREFIX).version == "claude-abc"
    saved_record("s1", image_version="claude-abc")
    with pytest.raises(SystemExit) as exc:
        main.main(["image", "rm", "claude-abc"])
    assert exc.value.code == base.EXIT_FAILED and layer.exists()
    with pytest.raises(VmsandboxError, match="in use by: blueprint image claude-abc"):
        store.remove("v1", ["blueprint image claude-abc"])
    layers.remove_layer("claude-abc", [])
    assert not layer.exists() and layers.list_layers() == []


def test_a_failed_build_step_shows_the_end_of_its_output_bounded() -> None:
    from vmsandbox import proc
    from vmsandbox.session.start import layer

    document = '{"versions": {' + '"1.0": {},' * 50_000 + "}"  # a registry's answer: one line of 500 kB
    shown = proc.tail_of(document + "\n", lines=layer.TAIL_LINES)
    assert len(shown) == proc.TAIL_CHARS + 1 and shown.startswith("…") and shown.endswith("}")
    lines = "\n".join(f"line {i}" for i in range(100))
    assert proc.tail_of(lines, lines=layer.TAIL_LINES).splitlines()[0] == "line 85"
    assert proc.tail_of("  \n", lines=layer.TAIL_LINES) == ""
