"""The whole test suite as `make test` runs it, phase by phase, timed — and the figure kept.

    python bench/suite.py                 lint, unit and integration phases; what each took; the run recorded
    python bench/suite.py --serial        integration tests one at a time, each test's wall and CPU time logged
    python bench/suite.py --count         real-VM test cases and assertions in tests/ (what must never fall)

Each run is appended to `<data dir>/suite-runs.jsonl` (the data directory survives between CI runs, like the
base image), and the last runs are printed beside this one, so a change that slows the suite shows at once.
With --serial, VMSANDBOX_TEST_COST_LOG makes every integration test write its wall time and the CPU time the
whole host spent meanwhile; the costliest are printed at the end (under TCG the guests' CPU is what a run
costs: two workers on two CPUs finish in about the total CPU time divided by two).

Exit code: 0 when every phase passed, else the first failing phase's.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
HISTORY = "suite-runs.jsonl"
GUEST_PROGRAM = "images/base/rootfs/usr/local/lib/vmsandbox/identity"  # a python program without .py: named
GIB = 1024**3
GUEST_MEMORY_PER_WORKER = 6 * GIB  # a worker holds up to ~4 TCG guests at once, ~1.2 GiB of host memory each


def data_dir() -> Path:
    if "VMSANDBOX_DATA_DIR" in os.environ:
        return Path(os.environ["VMSANDBOX_DATA_DIR"])
    return Path("/var/lib/vmsandbox") if os.geteuid() == 0 else Path.home() / ".local/share/vmsandbox"


def workers() -> int:
    """As many pytest workers as the host has CPUs and memory for guests (at least one); VMSANDBOX_TEST_WORKERS
    overrides it (to measure another count, never in CI)."""
    if os.environ.get("VMSANDBOX_TEST_WORKERS", "").isdigit():
        return max(1, int(os.environ["VMSANDBOX_TEST_WORKERS"]))
    return max(1, min(os.cpu_count() or 1, available_bytes() // GUEST_MEMORY_PER_WORKER))


def available_bytes() -> int:
    """The kernel's MemAvailable (free memory and what it can reclaim: the page cache a run's image builds fill), not
    its MemFree: on this machine, after a fresh build, MemFree said one worker where 18 GiB was available."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of the whole host so far (/proc/stat's first line; iowait counts as idle)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def phases(serial: bool, cost_log: Path | None) -> list[tuple[str, list[list[str]], dict[str, str]]]:
    pytest = [str(VENV_BIN / "pytest"), "-q", "-p", "no:cacheprovider"]
    lint = [
        [str(VENV_BIN / "ruff"), "check", "vmsandbox", "tests", "bench", "docs/hooks", GUEST_PROGRAM],
        [str(VENV_BIN / "ruff"), "format", "--check", "vmsandbox", "tests", "bench", "docs/hooks", GUEST_PROGRAM],
        [str(VENV_BIN / "mypy")],
    ]
    unit = [[*pytest, "tests/unit", "-n", str(workers())]]
    if serial:
        integration = [[*pytest, "tests/integration", "--durations=30"]]
        env = {"VMSANDBOX_TEST_COST_LOG": str(cost_log)}
    else:
        # loadfile: a module's tests stay on one worker (its shared VMs are made once); modules run heaviest first
        integration = [
            [
                *pytest,
                "tests/integration",
                "-n",
                str(workers()),
                "--dist",
                "loadfile",
                "--no-loadscope-reorder",
                "--durations=30",
            ]
        ]
        env = {"VMSANDBOX_TEST_COST_LOG": str(cost_log)} if cost_log else {}
    return [("lint", lint, {}), ("unit", unit, {}), ("integration", integration, env)]


def run_phase(commands: list[list[str]], extra_env: dict[str, str]) -> int:
    for argv in commands:
        print(f"\n$ {' '.join(argv)}", flush=True)
        code = subprocess.run(argv, cwd=ROOT, env={**os.environ, **extra_env}, check=False).returncode
        if code != 0:
            return code
    return 0


def count() -> dict[str, int]:
    """Integration test cases (a parametrised test counts once per case), those that boot real VMs (not marked
    no_vm), and `assert` statements per kind."""
    found: dict[str, int] = {}
    for kind in ("unit", "integration"):
        asserts = 0
        for source in sorted((ROOT / "tests" / kind).glob("*.py")):
            asserts += sum(isinstance(node, ast.Assert) for node in ast.walk(ast.parse(source.read_text())))
        found[f"{kind}_asserts"] = asserts
    collect = [str(VENV_BIN / "pytest"), "--collect-only", "-q", "-p", "no:cacheprovider"]
    for key, select in (("integration_cases", []), ("real_vm_cases", ["-m", "not no_vm"])):
        listed = subprocess.run(
            [*collect, *select, "tests/integration"], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout
        found[key] = sum(1 for line in listed.splitlines() if "::" in line)
    return found


def print_costs(cost_log: Path, top: int = 30) -> None:
    rows = [json.loads(line) for line in cost_log.read_text().splitlines() if line.strip()]
    total_cpu = sum(r["cpu"] for r in rows)
    total_wall = sum(r["wall"] for r in rows)
    print(f"\n{len(rows)} integration tests: {total_wall:.0f} s wall, {total_cpu:.0f} s of host CPU")
    print(f"{'CPU s':>7} {'wall s':>7}  test (the {top} costliest by CPU)")
    for r in sorted(rows, key=lambda r: -r["cpu"])[:top]:
        print(f"{r['cpu']:7.1f} {r['wall']:7.1f}  {r['test']}")


def timeline(cost_log: Path) -> dict[str, object]:
    """Where a parallel run's integration time went: per worker, the seconds it ran tests and the seconds it sat
    idle before the last worker finished (waiting on the host lock counts as running); per module, its tests'
    wall time; the tests that ended last."""
    rows = [json.loads(line) for line in cost_log.read_text().splitlines() if line.strip()]
    begin = min(r["start"] for r in rows)
    end = max(r["start"] + r["wall"] for r in rows)
    workers: dict[str, dict[str, float]] = {}
    for r in rows:
        w = workers.setdefault(r["worker"], {"tests": 0.0})
        w["tests"] += r["wall"]
    for w in workers.values():
        w["idle"] = round(end - begin - w["tests"], 1)
        w["tests"] = round(w["tests"], 1)
    modules: dict[str, float] = {}
    for r in rows:
        module = r["test"].split("::", 1)[0].rsplit("/", 1)[-1]
        modules[module] = round(modules.get(module, 0.0) + r["wall"], 1)
    last = sorted(rows, key=lambda r: r["start"] + r["wall"])[-6:]
    return {
        "span": round(end - begin, 1),
        "cli_calls": sum(r.get("cli_calls", 0) for r in rows),
        "children_cpu": round(sum(r.get("children_cpu", 0.0) for r in rows), 1),
        "workers": workers,
        "modules": dict(sorted(modules.items(), key=lambda kv: -kv[1])),
        "last": [
            {"test": r["test"], "worker": r["worker"], "ends": round(r["start"] + r["wall"] - begin)} for r in last
        ],
    }


def print_timeline(line: dict[str, Any]) -> None:
    print(f"\nintegration tests over {line['span']:.0f} s:")
    calls, cpu = line["cli_calls"], line["children_cpu"]
    print(f"  {calls} vmsandbox commands; the tests' waited-for processes used {cpu:.0f} CPU s")
    for name, w in sorted(line["workers"].items()):
        print(f"  worker {name}: {w['tests']:.0f} s in tests, {w['idle']:.0f} s idle")
    print("  per module: " + ", ".join(f"{m} {s:.0f} s" for m, s in line["modules"].items()))
    print("  ended last: " + "; ".join(f"{r['test']} ({r['worker']}, at {r['ends']} s)" for r in line["last"]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--serial", action="store_true", help="integration tests one at a time, with their CPU cost")
    ap.add_argument("--count", action="store_true", help="print the counts of test cases and assertions and stop")
    ap.add_argument("--only", help="comma-separated phases to run (lint, unit, integration)")
    args = ap.parse_args()
    if args.count:
        print(json.dumps(count(), indent=1))
        return 0

    cost_log = Path(tempfile.mkstemp(prefix="vmsandbox-costs-", suffix=".jsonl")[1])
    wanted = set(args.only.split(",")) if args.only else None
    record: dict[str, object] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "workers": workers()}
    times: dict[str, float] = {}
    busy: dict[str, int] = {}  # per phase: how busy the host's CPUs were, in percent
    first_failure = 0
    started = time.monotonic()
    for name, commands, env in phases(args.serial, cost_log):
        if wanted is not None and name not in wanted:
            continue
        t, (b0, t0) = time.monotonic(), cpu_ticks()
        code = run_phase(commands, env)
        times[name] = round(time.monotonic() - t, 1)
        b1, t1 = cpu_ticks()
        busy[name] = round(100 * (b1 - b0) / max(1, t1 - t0))
        if code and not first_failure:
            first_failure = code
            record["failed"] = name
    times["total"] = round(time.monotonic() - started, 1)
    record |= {"seconds": times, "cpu_busy_percent": busy, "serial": args.serial, "commit": _commit()}

    print("\n" + "=" * 30 + " time of each phase " + "=" * 30)
    for name, seconds in times.items():
        load = f", host CPUs {busy[name]}% busy" if name in busy else ""
        print(f"  {name:<12} {seconds / 60:5.1f} min ({seconds:.0f} s{load})")
    if "failed" in record:
        print(f"  FAILED: {record['failed']}")
    if args.serial:
        print_costs(cost_log)
    elif cost_log.stat().st_size:
        spent = timeline(cost_log)
        record["timeline"] = spent
        print_timeline(spent)
    cost_log.unlink()
    calls = cost_log.with_name(cost_log.name + ".calls")
    if calls.exists():  # every `vmsandbox` command the tests ran, with its wall time: kept for a closer look
        try:
            data_dir().mkdir(parents=True, exist_ok=True)
            shutil.move(calls, data_dir() / "suite-last-calls.jsonl")
        except OSError as exc:
            print(f"(could not keep the commands' times in {data_dir()}: {exc.strerror})")
    history = data_dir() / HISTORY
    _remember(history, record)
    return first_failure


def _commit() -> str:
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False)
    return r.stdout.strip() or "unknown"


def _remember(history: Path, record: dict[str, object]) -> None:
    """Append this run to the history and print the last runs (the whole run's minutes, and where)."""
    try:
        earlier = [json.loads(line) for line in history.read_text().splitlines() if line.strip()][-5:]
    except (OSError, ValueError):
        earlier = []
    try:
        history.parent.mkdir(parents=True, exist_ok=True)
        with history.open("a") as f:
            f.write(json.dumps(record) + "\n")
    except OSError as exc:
        print(f"(could not record this run in {history}: {exc.strerror})")
        return
    if earlier:
        print(f"  earlier runs ({history}):")
        for run in earlier:
            seconds = run.get("seconds", {})
            parts = ", ".join(f"{k} {v / 60:.1f}" for k, v in seconds.items())
            mark = " FAILED" if run.get("failed") else ""
            print(f"    {run.get('started', '?')} {run.get('commit', '?')}: {parts} (min){mark}")


if __name__ == "__main__":
    sys.exit(main())
