"""An interrupted image build never leaves a half-built image that `image ls` shows or a session would use."""

from __future__ import annotations

import json
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from vmsandbox import paths
from vmsandbox.image import store

from .conftest import Cli, VmFactory, default_signals, wait_for

pytestmark = pytest.mark.root("it builds base images (debootstrap, file ownership in the image)")


def processes_mentioning(text: str) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    return [line for line in ps.splitlines() if text in line and "ps -eo" not in line]


# One real interruption per signal class: one that vmsandbox catches and cleans up after (SIGTERM; SIGINT unwinds
# through the same clean-up, and a Ctrl-C is played on a real boot in test_lifecycle) and one it cannot (SIGKILL).
@pytest.mark.no_vm
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["term", "kill"])
def test_interrupted_build(sig: signal.Signals, cli: Cli, tmp_path: Path, base_image: store.Image) -> None:
    data = tmp_path / "data"
    (data / "images").mkdir(parents=True)
    (data / "cache").symlink_to(paths.cache_dir())  # reuse the downloaded packages
    env = cli.env(VMSANDBOX_DATA_DIR=str(data))
    images = data / "images"

    def ls() -> list[object]:
        r = cli.run("image", "ls", "--json", env=env)
        assert r.returncode == 0
        return [json.loads(line) for line in r.stdout.splitlines()]  # an object a line

    before = ls()
    p = subprocess.Popen(
        cli.argv("image", "build", "--force"),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=default_signals,  # noqa: PLW1509 - signal dispositions only
    )
    try:
        wait_for(lambda: any(images.glob(".tmp-*/rootfs/var/lib/dpkg")), 300, "debootstrap to start unpacking")
        time.sleep(2)
        p.send_signal(sig)
        _out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert ls() == before == []
    # children got the signal too (SIGKILL: through the parent-death signal); none keeps writing
    wait_for(lambda: not processes_mentioning(str(images)), 60, "build processes to end")
    if sig is signal.SIGKILL:
        assert list(images.glob(".tmp-*")), "a killed build leaves its temporary directory to the next build"
        store.remove_stale(images)  # what the next build does first, under the lock
    else:
        assert p.returncode == 128 + sig, err.decode()
    assert list(images.glob(".tmp-*")) == []
    assert store.mounts_under(data) == []


def test_a_build_killed_in_conversion_is_cleaned_up_by_the_next_and_an_image_in_use_is_kept(
    cli: Cli, base_image: store.Image, vm_factory: VmFactory, project: Path
) -> None:
    """Killed between the filesystem and the qcow2: no image listed, its temporary directory left; the next
    build removes it before anything else and starts from the tree debootstrap made for these packages, kept
    by the first (or an earlier) build; it is killed there (from there on it is a build like CI's own). A
    forced rebuild of an image a session uses is refused (it would change the disk under the session)."""
    data = Path(tempfile.mkdtemp(prefix="vmsandbox-it-data-", dir="/var/tmp"))
    try:
        (data / "images").mkdir()
        (data / "cache").symlink_to(paths.cache_dir())  # reuse the downloaded packages
        env = cli.env(VMSANDBOX_DATA_DIR=str(data))
        images = data / "images"
        k = cli.run("image", "build", env={**env, "VMSANDBOX_FAILPOINTS": "image.convert=kill-after:0"}, timeout=900)
        assert k.returncode == -9, k.stderr.decode()
        assert cli.run("image", "ls", "--json", env=env).stdout == b""  # no image: no line
        (left,) = images.glob(".tmp-*")
        assert (left / "disk.raw").exists()  # the filesystem it made, a few GiB of sparse file
        kept = paths.cache_dir() / "bootstrap"
        assert [t.name for t in kept.glob("bookworm-*.tar")], k.stderr.decode()  # the installed tree, kept
        n = cli.run("image", "build", env={**env, "VMSANDBOX_FAILPOINTS": "image.bootstrap=kill-after:0"}, timeout=900)
        assert n.returncode == -9, n.stderr.decode()
        assert "tree debootstrap made on" in n.stderr.decode() and "(cached)" in n.stderr.decode(), n.stderr.decode()
        (fresh,) = images.glob(".tmp-*")  # its own; the killed build's is gone
        assert fresh != left and not left.exists()
        unpacked = fresh / "rootfs"
        assert (unpacked / "etc/debian_version").read_text().startswith("12.")
        assert (unpacked / "usr/bin/sudo").stat().st_mode & 0o4000  # modes and owners as dpkg left them
        assert (unpacked / "usr/bin/sudo").stat().st_uid == 0
        assert cli.run("image", "ls", "--json", env=env).stdout == b""  # no image: no line
        assert store.mounts_under(data) == []
    finally:
        store.remove_tree(data)

    def bases() -> list[dict[str, object]]:  # (the other worker may add blueprint layers meanwhile)
        return [i for i in map(json.loads, cli.run("image", "ls", "--json").stdout.splitlines()) if i["kind"] == "base"]

    listed = bases()
    record = vm_factory.make(project)
    assert record.start == "warm"  # restored from the template, not booted
    owned_name = record.name
    f = cli.run("image", "build", "--force")
    assert f.returncode == 1
    said = f.stderr.decode()
    assert "is in use by: " in said and f"session {owned_name}" in said.split("is in use by: ")[1], said
    assert bases() == listed  # the base image the session uses, as it was
    assert cli.run("rm", owned_name).returncode == 0
