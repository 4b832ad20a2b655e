"""Workspace benchmark on a generated tree of 10,000 files (~100 MB): bringing it in, and pulling back a
1-file and a 100-file change, each next to plain `rsync -a` of the same tree over the same SSH connection;
then what the session holds on the host's disk (baseline, workspace disk, mirror) against the project.

Prints ratios measured in one run (these machines are noisy: read the ratios, not the seconds).

    sudo .venv/bin/python bench/sync.py [--files N] [--size BYTES]
    sudo .venv/bin/python bench/sync.py --scale --files 10000 --size 1024   # 10,000 against 100,000 files
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from vmsandbox import paths, proc, ui
from vmsandbox.session.end import lifecycle
from vmsandbox.session.options import Options
from vmsandbox.session.record import Record
from vmsandbox.session.settings import Settings
from vmsandbox.session.start import create
from vmsandbox.session.start.project import opened
from vmsandbox.sync.inward import capture as capturing
from vmsandbox.sync.review.plan import Decisions
from vmsandbox.sync.review.take import Take


def timed(fn: Callable[[], object]) -> float:
    start = time.monotonic()
    fn()
    return time.monotonic() - start


def make_tree(root: Path, files: int, size: int) -> None:
    for i in range(files):
        d = root / f"dir{i % 100:03d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"file{i:05d}.dat").write_bytes(os.urandom(size))


def guest(record: Record, command: str) -> None:
    proc.run([*record.endpoint("root").ssh_argv("-T"), "--", command])


def allocated(path: Path) -> int:
    """Bytes a file or a tree takes on disk (blocks, not sizes: holes and placeholders take none)."""
    os.sync()  # (a mirror's image: what the kernel holds of it in memory, written and counted)
    if path.is_file():
        return path.stat().st_blocks * 512
    return sum(p.lstat().st_blocks * 512 for p in path.rglob("*") if not p.is_symlink())


def pull(record: Record) -> None:
    plan = lifecycle.review(record, limit=64 * 1024**3)
    out = lifecycle.decide(record, plan, Decisions.safe(plan, Take()))
    assert not out.failed, out.failed


def capture_once(project: Path, scratch: paths.SessionPaths) -> None:
    """The capture as a session makes it: the project opened and checked once, copied from that descriptor."""
    with opened(project) as tree:
        capturing.capture(tree, scratch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=10_240)
    parser.add_argument(
        "--scale", action="store_true", help="Only: a 1-file pull at --files files and at 10x as many (ratio)."
    )
    args = parser.parse_args()
    if args.scale:
        scale(args.files, args.size)
        return
    work = Path(tempfile.mkdtemp(prefix="vmsandbox-bench-", dir="/var/tmp"))
    work.chmod(0o711)
    os.environ.setdefault("VMSANDBOX_STATE_DIR", str(work / "state"))
    project = work / "project"
    ui.err.quiet = True
    try:
        make_tree(project, args.files, args.size)
        mb = args.files * args.size / 1e6
        local_copy = timed(lambda: shutil.copytree(project, work / "copy", symlinks=True))
        scratch = paths.SessionPaths(work / "scratch")
        scratch.root.mkdir()
        capture = timed(lambda: capture_once(project, scratch))
        record = create.create(Options(project=project, name=None, settings=Settings(), keep=True))
        try:
            ep = record.endpoint("root")
            rsh = f"{ep.rsync_rsh()} -l root"
            rsync_in = timed(
                lambda: proc.run(["rsync", "-a", "-e", rsh, f"{project}/", f"{ep.host_alias}:/var/tmp/in/"])
            )
            full_dest = work / "full"
            rsync_out = timed(
                lambda: proc.run(["rsync", "-a", "-e", rsh, f"{ep.host_alias}:{project}/", f"{full_dest}/"])
            )
            pull0 = timed(lambda: pull(record))  # the first fetch after boot: it makes the mirror
            guest(record, f"echo changed >> {project}/dir000/file00000.dat")
            pull1 = timed(lambda: pull(record))
            guest(record, f"for f in {project}/dir001/*.dat; do echo changed >> $f; done")
            changed = len(list((project / "dir001").iterdir()))
            pull100 = timed(lambda: pull(record))
            files = record.files
            mirror = files.mirror_image if files.mirror_image.exists() else files.guest_tree  # (its own file system)
            held = [allocated(files.baseline), allocated(files.workspace_disk), allocated(mirror)]
        finally:
            lifecycle.remove(record)
        print(f"tree: {args.files} files, {mb:.0f} MB")
        print(
            f"bring in: vmsandbox capture {capture:.1f}s | local copy {local_copy:.1f}s | rsync -a over SSH "
            f"{rsync_in:.1f}s → capture/local {capture / local_copy:.2f}, capture/rsync {capture / rsync_in:.2f}"
        )
        print(f"first pull, no change (makes the mirror): {pull0:.1f}s")
        print(f"pull back 1 file:   {pull1:.1f}s vs full rsync -a {rsync_out:.1f}s → ratio {pull1 / rsync_out:.2f}")
        ratio = pull100 / rsync_out
        print(f"pull back {changed} files: {pull100:.1f}s vs full rsync -a {rsync_out:.1f}s → ratio {ratio:.2f}")
        mib = [b / 1024**2 for b in held]
        print(
            f"on disk: baseline {mib[0]:.0f} MiB + workspace disk {mib[1]:.0f} MiB + mirror {mib[2]:.1f} MiB = "
            f"{sum(held) / allocated(project):.2f}x the project ({allocated(project) / 1024**2:.0f} MiB)"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    sys.stdout.flush()


def one_file_pull(work: Path, files: int, size: int) -> float:
    """Seconds a pull of a 1-file change takes in a session on a tree of `files` files (after a first pull)."""
    project = work / f"project-{files}"
    make_tree(project, files, size)
    record = create.create(Options(project=project, name=None, settings=Settings(), keep=True))
    try:
        pull(record)  # settle: the first fetch after boot (and the hash caches filled)
        guest(record, f"echo changed >> {project}/dir000/file00000.dat")
        return timed(lambda: pull(record))
    finally:
        lifecycle.remove(record)
        shutil.rmtree(project, ignore_errors=True)


def scale(files: int, size: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="vmsandbox-bench-", dir="/var/tmp"))
    work.chmod(0o711)
    os.environ.setdefault("VMSANDBOX_STATE_DIR", str(work / "state"))
    ui.err.quiet = True
    try:
        small = one_file_pull(work, files, size)
        large = one_file_pull(work, files * 10, size)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"pull of a 1-file change: {files} files {small:.1f}s, {files * 10} files {large:.1f}s")
    print(f"ratio {files * 10} / {files} files: {large / small:.2f} (target <= 2)")


if __name__ == "__main__":
    main()
