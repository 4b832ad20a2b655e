"""Another-host benchmark: `vmsandbox run --host far -- true` (start to exit), warm (restored from that host's
template) against cold (`--cold`), on the stand-in remote host the tests use (a second libvirtd in its own
mount namespace, reached over qemu+ssh on 127.0.0.1: tests/integration/farhost.py). Also the one-time costs
a host pays: sending the image, building its template.

Target: warm <= 0.5x cold there (a remote warm start also copies the template's save on the host and sends the
workspace disk; a local one reflinks). Runs are interleaved and medians compared (these machines are noisy):
read the ratios, not the seconds.

    sudo .venv/bin/python bench/hosts.py [--runs N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository: the stand-in host's helper

from boot import workdir  # bench/ is on the path: this runs as a script

from tests.integration import farhost

CLI = (sys.executable, "-m", "vmsandbox")


def run_there(project: Path, *, cold: bool) -> tuple[float, str]:
    """Seconds from start to exit of `run --host far -- true`, and what it said."""
    start = time.monotonic()
    done = subprocess.run(
        [*CLI, "run", "--host", "far", "--yes", *(["--cold"] if cold else []), str(project), "--", "true"],
        check=False,
        capture_output=True,
    )
    took = time.monotonic() - start
    if done.returncode != 0:
        sys.exit(f"run --host far failed:\n{done.stderr.decode(errors='replace')}")
    return took, done.stderr.decode(errors="replace")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    work, project = workdir()
    far = farhost.start(work / "far")
    conf = work / "config"
    conf.mkdir()
    (conf / "config.yaml").write_text(json.dumps({"hosts": [{"name": "far", "uri": far.uri}]}))
    os.environ["VMSANDBOX_CONFIG_DIR"] = str(conf)
    try:
        first, said = run_there(project, cold=False)  # sends the image and builds the template: once per host
        if "Building a warm-start template" not in said:
            sys.exit(f"the first run did not build the template there:\n{said}")
        warm, cold = [], []
        for i in range(args.runs):
            cold.append(run_there(project, cold=True)[0])
            took, said = run_there(project, cold=False)
            if "Restoring" not in said:
                sys.exit(f"a run expected to start warm did not:\n{said}")
            warm.append(took)
            print(f"run {i + 1}: cold {cold[-1]:.1f}s, warm {warm[-1]:.1f}s", file=sys.stderr)
        c, w = statistics.median(cold), statistics.median(warm)
        print(f"stand-in host over qemu+ssh on 127.0.0.1, {os.cpu_count()} host CPUs; medians of {args.runs} runs:")
        print(f"  first run there (image sent, template built):  {first:.1f}s")
        print(f"  run --host far -- true, cold (--cold):         {c:.1f}s")
        print(f"  run --host far -- true, warm:                  {w:.1f}s  ratio to cold {w / c:.2f} (target <= 0.5)")
    finally:
        subprocess.run([*CLI, "rm", "--stale"], check=False, capture_output=True)
        far.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
