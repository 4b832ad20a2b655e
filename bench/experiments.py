"""Experiments benchmark: `checkpoint`, `rollback` and `fork` (to a usable shell) of an idle session against a
cold start (`run --cold -- true`), and `fanout 4 -- true` against one warm `run -- true`, each as a person runs
it (a new `vmsandbox` process) and timed to its end.

Targets: fork <= 0.2x cold; checkpoint <= 0.3x cold; rollback <= 0.2x cold; fanout 4 <= 2x one warm run.
Runs are interleaved and medians compared (these machines are noisy): read the ratios, not the seconds.

    sudo .venv/bin/python bench/experiments.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from boot import vmsandbox_run, wait_for_teardowns, workdir  # bench/ is on the path: this runs as a script

from vmsandbox.image import store as image
from vmsandbox.session.host import images
from vmsandbox.session.settings import Settings
from vmsandbox.vm import accel

CLI = (sys.executable, "-m", "vmsandbox")


def timed(*args: str) -> float:
    start = time.monotonic()
    subprocess.run([*CLI, *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.monotonic() - start


def experiments(project: Path, run: int) -> tuple[float, float, float]:
    """(checkpoint, rollback, fork to a usable shell) of one idle kept session."""
    name, fork = f"bench-{os.getpid()}-{run}", f"bench-{os.getpid()}-{run}-f"
    subprocess.run([*CLI, "run", "--keep", "--name", name, str(project), "--", "true"], check=True, capture_output=True)
    try:
        checkpoint = timed("checkpoint", "create", name, "c1")
        subprocess.run([*CLI, "exec", name, "--", "sh", "-c", "echo x > later.txt"], check=True, capture_output=True)
        rollback = timed("checkpoint", "restore", name, "c1")
        start = time.monotonic()
        subprocess.run([*CLI, "create", "--from", name, "--name", fork], check=True, capture_output=True)
        subprocess.run([*CLI, "exec", fork, "--", "true"], check=True, capture_output=True)  # a usable shell
        forked = time.monotonic() - start
        return checkpoint, rollback, forked
    finally:
        for n in (fork, name):
            subprocess.run([*CLI, "rm", n, "--discard"], check=False, capture_output=True)


def fanout(project: Path, run: int, n: int) -> float:
    group = f"fan-{os.getpid()}-{run}"
    try:
        return timed("run", "--fanout", str(n), str(project), "--name", group, "--", "true")
    finally:
        subprocess.run([*CLI, "rm", "--group", group, "--discard"], check=False, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--fanout", type=int, default=4)
    args = parser.parse_args()
    settings = Settings()
    choice = accel.choose(settings.accel).accel
    img = image.current_image()
    work, project = workdir()
    try:
        images.default_template(img)  # built once, before anything is timed
        cold, warm, cps, rbs, forks, fans = [], [], [], [], [], []
        shape = (project, settings.cpus, settings.memory_mib, choice.value)
        for i in range(args.runs):
            cold.append(vmsandbox_run(*shape, cold=True)[0])
            warm.append(vmsandbox_run(*shape, cold=False)[0])
            cp, rb, fk = experiments(project, i)
            cps.append(cp)
            rbs.append(rb)
            forks.append(fk)
            fans.append(fanout(project, i, args.fanout))
            wait_for_teardowns()
            print(
                f"run {i + 1}: cold {cold[-1]:.1f}s, warm {warm[-1]:.1f}s; checkpoint {cp:.1f}s, rollback {rb:.1f}s, "
                f"fork to a shell {fk:.1f}s; fanout {args.fanout} {fans[-1]:.1f}s",
                file=sys.stderr,
            )
        c, w = statistics.median(cold), statistics.median(warm)
        cp, rb, fk, fo = (statistics.median(x) for x in (cps, rbs, forks, fans))
        print(
            f"accelerator: {choice.value}, {settings.cpus} vCPU, {settings.memory_mib} MiB, {os.cpu_count()} host CPUs"
        )
        print(f"medians of {args.runs} runs:")
        print(f"  run -- true, cold (--cold):     {c:.1f}s")
        print(f"  run -- true, warm:              {w:.1f}s")
        print(f"  checkpoint of an idle session:  {cp:.1f}s  ratio to cold {cp / c:.2f} (target <= 0.30)")
        print(f"  rollback:                       {rb:.1f}s  ratio to cold {rb / c:.2f} (target <= 0.20)")
        print(f"  fork to a usable shell:         {fk:.1f}s  ratio to cold {fk / c:.2f} (target <= 0.20)")
        print(
            f"  fanout {args.fanout} -- true:             {fo:.1f}s  ratio to one warm run {fo / w:.2f} (target <= 2.0)"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
