"""Density benchmark: how many idle sessions this host holds. Starts kept sessions (warm, the default shape)
one after another and, at 1 session and after every `--step` more, reports the host RSS of their QEMU
processes (total and mean), the host's free memory, and the latency of `vmsandbox exec NAME -- true` (median
of 3) against the latency at one session. Stops at `--max` sessions, or once the latency is above
`--limit` times the one-session latency (the figure the issue asks: sessions held with exec <= 2x). Every
session is destroyed at the end.

    sudo .venv/bin/python bench/density.py [--max 40] [--step 4] [--limit 2.0]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vmsandbox.image import store
from vmsandbox.session.end import lifecycle
from vmsandbox.session.host import images
from vmsandbox.session.options import Options
from vmsandbox.session.record import Record
from vmsandbox.session.settings import Settings
from vmsandbox.session.start import create


def qemu_rss_mib(record: Record) -> float:
    pid = int(Path(f"/run/libvirt/qemu/{record.domain}.pid").read_text())
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def free_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return 0.0


def exec_latency(name: str) -> float:
    took = []
    for _ in range(3):
        start = time.monotonic()
        argv = [sys.executable, "-m", "vmsandbox", "exec", name, "--", "true"]
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        took.append(time.monotonic() - start)
    return statistics.median(took)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max", type=int, default=40)
    parser.add_argument("--step", type=int, default=4)
    parser.add_argument("--limit", type=float, default=2.0)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="vmsandbox-density-", dir="/var/tmp"))
    work.chmod(0o711)
    os.environ.setdefault("VMSANDBOX_STATE_DIR", str(work / "state"))
    images.default_template(store.current_image())
    sessions: list[Record] = []
    first = 0.0
    try:
        while len(sessions) < args.max:
            project = work / f"p{len(sessions)}"
            project.mkdir()
            (project / "README").write_text("idle\n")
            sessions.append(create.create(Options(project=project, name=None, settings=Settings(), keep=True)))
            if len(sessions) != 1 and len(sessions) % args.step:
                continue
            time.sleep(5)  # let the newest settle
            latency = exec_latency(sessions[-1].name)
            first = first or latency
            rss = [qemu_rss_mib(r) for r in sessions]
            print(
                f"{len(sessions):3d} sessions: QEMU RSS total {sum(rss):7.0f} MiB, mean {statistics.mean(rss):4.0f} "
                f"MiB; host available {free_mib():6.0f} MiB; exec -- true {latency:.2f}s ({latency / first:.2f}x)",
                flush=True,
            )
            if latency > args.limit * first:
                print(f"exec latency above {args.limit}x the one-session latency: stopping", flush=True)
                break
    finally:
        for r in sessions:
            lifecycle.remove(r)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
