"""Reading a dead VM's workspace disk: the reader VM (what a pull does now: a VM restored from the warm-start
template mounts the disk, rsync fetches the whole tree into the mirror) against the host parsers it replaced
(`e2fsck -f -p` then `debugfs -R "rdump / ."` on a sparse copy of the disk, as the old code ran them, here
without their jail: the cheapest the old way could be).

A session on a generated tree (default 2,000 files of 10 KiB) changes 100 files and its VM is destroyed; then
both ways read the disk, interleaved, `--rounds` times each; medians and their ratio are printed (these
machines are noisy: read the ratio, not the seconds).

    sudo .venv/bin/python bench/deadpull.py [--files N] [--size BYTES] [--rounds N]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sync import guest, make_tree  # bench/ is on the path: this runs as a script

from vmsandbox import proc
from vmsandbox.session.end import lifecycle
from vmsandbox.session.options import Options
from vmsandbox.session.record import Record
from vmsandbox.session.settings import Settings
from vmsandbox.session.start import create
from vmsandbox.vm.virt import Hypervisor


def host_parsers(record: Record, work: Path) -> float:
    copy = work / "disk.copy"
    out = work / "tree"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    started = time.monotonic()
    proc.run(["cp", "--sparse=always", record.files.workspace_disk, copy])
    proc.run(["e2fsck", "-f", "-p", copy], check=False)
    proc.run(["debugfs", "-R", "rdump / .", copy], cwd=out)
    took = time.monotonic() - started
    copy.unlink()
    return took


def reader_vm(record: Record) -> float:
    started = time.monotonic()
    gathered = lifecycle.gather(record, limit=64 * 1024**3)
    took = time.monotonic() - started
    assert sum(1 for _ in gathered.changes) >= 100, len(gathered.changes)
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--size", type=int, default=10 * 1024)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="vmsandbox-bench-dead-", dir="/var/tmp"))
    project = work / "project"
    make_tree(project, args.files, args.size)
    record = create.create(Options(project=project, name=f"bench-dead-{int(time.time()) % 100000}",
                                   settings=Settings(), keep=True))  # fmt: skip
    try:
        guest(record, f"cd {project} && for f in dir00*/file000*.dat dir01*/file000*.dat; do echo x >> $f; done")
        guest(record, f"cd {project} && for i in $(seq 100); do echo $i > new$i.txt; done; sync")
        with Hypervisor(record.libvirt_uri) as hv:
            hv.destroy(record.domain)
        old: list[float] = []
        new: list[float] = []
        for _ in range(args.rounds):
            old.append(host_parsers(record, work))
            new.append(reader_vm(record))
        o, n = statistics.median(old), statistics.median(new)
        print(f"tree: {args.files} files of {args.size} bytes, 100+ changed; {args.rounds} rounds each, interleaved")
        print(f"host parsers (e2fsck + debugfs rdump, unjailed): median {o:.1f} s  {[round(x, 1) for x in old]}")
        print(f"reader VM (restore, mount, rsync, scan):         median {n:.1f} s  {[round(x, 1) for x in new]}")
        print(f"reader VM / host parsers: {n / o:.1f}x")
    finally:
        lifecycle.remove(Record.load(record.name))
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
