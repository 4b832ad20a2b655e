"""What provenance costs the guest: a write-heavy step run with the journal following writers and keeping
versions (provenance.c), and the same step with that off (`journal tracing off`: the journal still names the
changed paths for a pull), in turn, on one session. The step works on a real project: a clone of this
repository (its git history, carried in as a bundle), byte-compiled, its history written out, the tree copied.

Prints each pair's ratio and the median (these machines are noisy: read the ratios, not the seconds), and the
journal's memory for provenance after the runs (its `usage` line: bytes of versions kept, paths, writers).

    sudo .venv/bin/python bench/provenance.py [--pairs N]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vmsandbox import proc
from vmsandbox.session.end import lifecycle
from vmsandbox.session.options import Options
from vmsandbox.session.record import Record
from vmsandbox.session.settings import Settings
from vmsandbox.session.start import create

JOURNAL = "/usr/local/lib/vmsandbox/journal"
STEP = (
    "set -e; rm -rf clone copy; git clone -q repo.bundle clone; python3 -m compileall -q clone; "
    "git -C clone log -p -300 > clone/history.txt; cp -r clone copy; rm -rf clone copy"
)


def guest(record: Record, command: str) -> str:
    argv = [*record.endpoint("root").ssh_argv("-T"), "--", f"cd {record.project} && {command}"]
    return proc.run(argv, timeout=1800).stdout


def timed(record: Record, tracing: str) -> float:
    guest(record, f"{JOURNAL} tracing {tracing} >/dev/null")
    start = time.monotonic()
    guest(record, STEP)
    return time.monotonic() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=3)
    args = ap.parse_args()
    repo = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp) / "project"
        project.mkdir()
        subprocess.run(["git", "-C", str(repo), "bundle", "create", str(project / "repo.bundle"), "HEAD"],
                       check=True, capture_output=True)  # fmt: skip
        record = create.create(Options(project=project, name=None, settings=Settings(), keep=True))
        try:
            timed(record, "on")  # warm-up: the page cache, the first clone
            ratios, on_s, off_s = [], [], []
            for n in range(args.pairs):
                on = timed(record, "on")
                off = timed(record, "off")
                ratios.append(on / off)
                on_s.append(on)
                off_s.append(off)
                print(f"pair {n + 1}: with provenance {on:.1f} s, without {off:.1f} s, ratio {on / off:.3f}")
            guest(record, f"{JOURNAL} tracing on >/dev/null")
            usage = next((line for line in guest(record, f"{JOURNAL} provenance").splitlines()
                          if line.startswith("usage ")), "usage ? ? ? ?").split()  # fmt: skip
            print(f"median: with {statistics.median(on_s):.1f} s, without {statistics.median(off_s):.1f} s, "
                  f"ratio {statistics.median(ratios):.3f} (target ≤ 1.10)")  # fmt: skip
            print(
                f"journal after the runs: {usage[1]} bytes of versions kept, {usage[2]} paths, {usage[3]} writers, "
                f"{usage[4]} processes followed (bounds: 32 MiB of versions, 200,000 paths, 100,000 writers)"
            )
        finally:
            lifecycle.remove(record)
            shutil.rmtree(project, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
