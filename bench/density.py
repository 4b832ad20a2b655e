"""Density benchmark: how many idle sessions this host holds. Starts kept sessions (warm, the default shape)
one after another and, at 1 session and after every `--step` more, reports their QEMUs' memory — proportional
(PSS: a page of the template's memory that N sessions map counts 1/N each) and resident (RSS), totals and
means —, the host's available memory, how many more sessions admission would take (`host ls`'s ROOM), and the
latency of `vmsandbox exec NAME -- true` (median of 3) against the latency at one session. Stops at `--max`
sessions, once the latency is above `--limit` times the one-session latency (the figure the issue asks:
sessions held with exec <= 2x), or when admission refuses the next one (it says why). Then wakes them all at
once (`true` over every session's SSH together): the time that takes and the least memory available meanwhile.
Every session is destroyed at the end.

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

from vmsandbox.errors import VmsandboxError
from vmsandbox.image import store
from vmsandbox.session.end import lifecycle
from vmsandbox.session.host import images
from vmsandbox.session.options import Options
from vmsandbox.session.place import room
from vmsandbox.session.place.hostspec import DEFAULT_KEEP_FREE_MIB
from vmsandbox.session.record import Record
from vmsandbox.session.settings import Settings
from vmsandbox.session.start import create
from vmsandbox.vm.memory import usage


def used(record: Record) -> usage.Usage | None:
    """What the session's QEMU takes now (None: it is gone — the OOM killer takes the largest first)."""
    return usage.of_domain(record.domain)


def free_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return 0.0


def exec_argv(name: str) -> list[str]:
    return [sys.executable, "-m", "vmsandbox", "exec", name, "--", "true"]


def exec_latency(name: str) -> float:
    took = []
    for _ in range(3):
        start = time.monotonic()
        subprocess.run(exec_argv(name), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        took.append(time.monotonic() - start)
    return statistics.median(took)


WAKE_TIMEOUT = 300  # seconds a login may take while every guest wakes (ssh's own 10 s is for one at a time)


def wake_all(sessions: list[Record], first: float) -> None:
    """`true` in every session at once, over each one's own SSH (what a session's wake costs the host is its
    guest's work and one ssh client: not a vmsandbox process each): how long until all answered, and the least
    memory the host had available meanwhile."""
    start = time.monotonic()
    running = [
        subprocess.Popen(
            [
                *r.endpoint().ssh_argv("-T", "-o", "ControlMaster=no", "-o", f"ConnectTimeout={WAKE_TIMEOUT}"),
                "--",
                "true",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for r in sessions
    ]
    least = free_mib()
    while any(p.poll() is None for p in running):
        least = min(least, free_mib())
        time.sleep(0.1)
    took = time.monotonic() - start
    failed = sum(p.returncode != 0 for p in running)
    found = [u for u in (used(r) for r in sessions) if u is not None]
    print(
        f"wake all {len(sessions)} at once: {took:.1f}s until every one answered ({took / first:.1f}x one exec), "
        f"{failed} failed, {len(sessions) - len(found)} QEMUs gone; host available at least {least:.0f} MiB "
        f"meanwhile; QEMU PSS total {sum(u.pss_mib for u in found)} MiB after",
        flush=True,
    )


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
    settings = Settings()
    sessions: list[Record] = []
    first = 0.0
    try:
        while len(sessions) < args.max:
            project = work / f"p{len(sessions)}"
            project.mkdir()
            (project / "README").write_text("idle\n")
            try:
                sessions.append(create.create(Options(project=project, name=None, settings=settings, keep=True)))
            except VmsandboxError as exc:
                print(f"admission refused session {len(sessions) + 1}: {exc.message}", flush=True)
                break
            if len(sessions) != 1 and len(sessions) % args.step:
                continue
            time.sleep(5)  # let the newest settle
            latency = exec_latency(sessions[-1].name)
            first = first or latency
            found = [u for u in (used(r) for r in sessions) if u is not None]
            pss, rss = [u.pss_mib for u in found], [u.rss_mib for u in found]
            reserved = usage.reserved_mib()  # the shared files' holes, which admission leaves out too
            available = int(free_mib()) - reserved
            more = room.fits(available, DEFAULT_KEEP_FREE_MIB, settings.memory_mib, int(statistics.median(pss)))
            print(
                f"{len(sessions):3d} sessions: QEMU PSS total {sum(pss):6d} MiB, mean {statistics.mean(pss):4.0f} "
                f"(RSS total {sum(rss):6d}, mean {statistics.mean(rss):4.0f}); host available {available:6d} MiB "
                f"({reserved} reserved), room for {more} more; exec -- true {latency:.2f}s ({latency / first:.2f}x)",
                flush=True,
            )
            if latency > args.limit * first:
                print(f"exec latency above {args.limit}x the one-session latency: stopping", flush=True)
                break
        if sessions and first:
            wake_all(sessions, first)
    finally:
        for r in sessions:
            lifecycle.remove(r)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
