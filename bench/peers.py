"""Peers' benchmark: the figures CubeSandbox, forkd, Sandstorm and Zeroboot publish, measured for vmsandbox on this
machine, each through the `vmsandbox` command line (a new process per command, as a person runs it) or the
project's modules as the other benches do; printed as a table and written to docs/benchmarks.md beside the
peers' published figures (theirs are quoted, never measured here).

1. create: `vmsandbox run PROJECT -- true`, warm, start to exit: serial (p50 of N runs) and 4 at once (p50 of
   each one's time over several rounds); against a bare qemu-system-x86_64 boot and a cold run for the ratios.
2. resume: `vmsandbox start NAME` of a stopped kept session until `vmsandbox exec NAME -- true` answered (p50).
3. fork: of a kept idle source, N children made by N `vmsandbox create --from SRC --name NEW` (the CLI forks
   one child a command, holding the source's lock: a second at once is refused), and N from one checkpoint
   (`checkpoint create`, then N `create --from SRC:LABEL`): the time to N children that answered
   `exec -- true`, and how long the source's guest was paused meanwhile (its libvirt domain's state polled
   every 10 ms from a thread: the time it was not running); and `run --fanout N PROJECT -- true`.
4. memory: at 10, 50 and 100 kept idle sessions, the drop of the host's MemAvailable per session since before
   the first, their QEMUs' mean PSS and RSS, and how many sessions admission would still take (`host ls`'s
   ROOM): the most idle sessions this host admits is those held plus that room.
5. review: a change of 10, 100 and 1,000 files reviewed at the terminal (`pull --dry-run`) and in the browser's
   first page (bench/review.py).

`--quick` runs every part at tiny sizes (a smoke test of a few minutes). Every session the bench makes lives in a
state directory of its own and is removed at the end, also on Ctrl-C or an error.

    sudo .venv/bin/python bench/peers.py [--quick] [--out docs/benchmarks.md] [--only create,resume,fork,review,idle]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from boot import bare_qemu_boot, resumes, vmsandbox_run, wait_for_teardowns, workdir  # bench/ is on the path
from density import free_mib, used
from experiments import CLI, fanout
from review import Reviewed, measure

from vmsandbox import paths
from vmsandbox.errors import VmsandboxError
from vmsandbox.image import store as image
from vmsandbox.session.host import images
from vmsandbox.session.record import DOMAIN_PREFIX, Record
from vmsandbox.session.settings import Settings
from vmsandbox.vm import accel
from vmsandbox.vm.memory import usage
from vmsandbox.vm.virt import Hypervisor

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
COMMAND = "sudo .venv/bin/python bench/peers.py"
SECTIONS = ("create", "resume", "fork", "review", "idle")
POLL = 0.01  # seconds between two looks at the source's domain state
CONCURRENCY = 4
PID = os.getpid()
PREFIX = f"peers{PID}"  # every session this run names (its project directory's name makes `run`'s names so too)


@dataclass(frozen=True)
class Sizes:
    baseline: int  # bare boots and cold runs, for the ratios
    runs: int  # serial warm runs
    rounds: int  # rounds of CONCURRENCY warm runs at once
    resumes: int
    forks: tuple[int, ...]
    idle: tuple[int, ...]
    review: tuple[int, ...]
    review_rounds: int
    settle: float  # seconds a new session is left alone before its memory is read


FULL = Sizes(2, 6, 3, 3, (1, 4, 10), (10, 50, 100), (10, 100, 1000), 2, 10.0)
QUICK = Sizes(1, 2, 1, 2, (1, 2), (2, 4), (10,), 1, 5.0)


class BenchError(Exception):
    pass


def tail(text: str, lines: int = 3) -> str:
    return " / ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def vms(*args: str, timeout: float = 1800) -> str:
    """One `vmsandbox` command, a new process; its output (it failing: BenchError, with the tail of what it said)."""
    done = subprocess.run([*CLI, *args], capture_output=True, text=True, check=False, timeout=timeout)
    if done.returncode != 0:
        raise BenchError(f"`vmsandbox {shlex.join(args)}` exited {done.returncode}: {tail(done.stderr)}")
    return done.stdout


def p50(values: list[float]) -> float:
    return statistics.median(values)


def local_host() -> dict[str, Any]:
    """This machine's line of `vmsandbox host ls --json`."""
    for line in vms("host", "ls", "--json").splitlines():
        host = json.loads(line)
        if host.get("name") == "local":
            return dict(host)
    raise BenchError("`vmsandbox host ls --json` lists no local host")


@dataclass(frozen=True)
class Pause:
    """A stretch in which a domain was not running, as far as looks at its state can tell: it began between the
    start of the last look that found it running and the end of the first that did not, and ended between the
    start of the last look that found it not running and the end of the first that found it running again."""

    began: tuple[float, float]  # (earliest, latest), time.monotonic()
    ended: tuple[float, float]

    @property
    def seconds(self) -> float:
        """Its length, from the middle of each bound."""
        return (sum(self.ended) - sum(self.began)) / 2

    @property
    def error(self) -> float:
        """The most its length can be off: half of both bounds' widths."""
        return (self.ended[1] - self.ended[0] + self.began[1] - self.began[0]) / 2


class PauseWatch:
    """The stretches in which a libvirt domain was not running (paused, being saved, or gone): its state looked
    at every POLL seconds from a thread. A look may wait (libvirt answers for a domain once what holds it lets
    go, while a restore launches its QEMU): each pause carries the bounds its looks leave (Pause.error)."""

    def __init__(self, domain: str) -> None:
        self.domain = domain
        self.pauses: list[Pause] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._hv: Hypervisor | None = None

    def _running(self) -> bool:
        assert self._hv is not None
        try:  # looked up each time: a saved domain is gone, and a restored one is another
            info = self._hv.info(self.domain)
        except VmsandboxError:
            return False
        return info is not None and info.state == "running"

    def _watch(self) -> None:
        # ahead of the guests and commands the fork keeps busy (root may; others look at normal priority)
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), -10)
        last_up: float | None = None  # the start of the last look that found it running
        began: tuple[float, float] | None = None  # the bounds of the pause under way's start
        down = 0.0  # the start of the last look that found it not running
        while not self._stop.is_set():
            before = time.monotonic()
            running = self._running()
            after = time.monotonic()
            if not running:
                if began is None:
                    began = (before if last_up is None else last_up, after)
                down = before
            else:
                if began is not None:
                    self.pauses.append(Pause(began, (down, after)))
                    began = None
                last_up = before
            self._stop.wait(POLL)
        if began is not None:  # still not running at the end: up to now
            now = time.monotonic()
            self.pauses.append(Pause(began, (down, now)))

    def __enter__(self) -> PauseWatch:
        self._hv = Hypervisor()
        if not self._running():
            self._hv.close()
            raise BenchError(f"domain {self.domain} is not running before the fork")
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        if self._hv is not None:
            self._hv.close()


def said(pauses: list[Pause]) -> str:
    return " ".join(f"{p.seconds:.2f}s (±{p.error:.2f})" for p in pauses) or "none seen"


# --- what is measured --------------------------------------------------------------------------------------------


@dataclass
class ForkFigures:
    n: int
    live: float | None = None  # seconds to n usable children, n `create --from SRC`
    live_pauses: list[Pause] = field(default_factory=list)
    checkpointed: float | None = None  # seconds to n usable children: a checkpoint, then n `create --from SRC:LABEL`
    checkpoint: float | None = None  # of which the checkpoint
    checkpoint_pauses: list[Pause] = field(default_factory=list)
    fanout: float | None = None  # seconds of `run --fanout n -- true`
    error: str | None = None


@dataclass
class IdleStep:
    sessions: int
    drop_per_session: float  # MiB of MemAvailable gone per session since before the first
    pss: float  # mean MiB
    rss: float
    read: int  # sessions whose QEMU's memory could be read
    room: int  # how many more admission takes now
    available: int  # MiB host ls says
    others: int  # other people's VMs running now
    others_growth: float  # MiB their QEMUs' PSS grew since before the first session (shrank: negative)

    @property
    def drop_of_ours(self) -> float:
        """The drop a session less what other people's VMs took meanwhile (their QEMUs' PSS only)."""
        return self.drop_per_session - self.others_growth / self.sessions


@dataclass
class Figures:
    bare: list[float] = field(default_factory=list)
    cold: list[float] = field(default_factory=list)
    serial: list[float] = field(default_factory=list)
    concurrent: list[float] = field(default_factory=list)
    walls: list[float] = field(default_factory=list)
    resumed: list[tuple[float, float]] = field(default_factory=list)
    forks: list[ForkFigures] = field(default_factory=list)
    idle: list[IdleStep] = field(default_factory=list)
    idle_base: float | None = None
    idle_others: tuple[int, float] = (0, 0.0)  # other VMs before the first idle session, and their QEMUs' PSS
    refused: str | None = None
    reviews: list[Reviewed] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)


@dataclass
class Bench:
    sizes: Sizes
    settings: Settings
    choice: accel.Accel
    img: image.Image
    work: Path
    project: Path
    figures: Figures = field(default_factory=Figures)

    def run(self, *, cold: bool = False) -> float:
        shape = (self.project, self.settings.cpus, self.settings.memory_mib, self.choice.value)
        return vmsandbox_run(*shape, cold=cold)[0]

    def say(self, text: str) -> None:
        print(f"  {text}", file=sys.stderr, flush=True)

    def create(self) -> None:
        f, s = self.figures, self.sizes
        for i in range(s.baseline):
            f.bare.append(
                bare_qemu_boot(self.img, self.choice, self.settings.cpus, self.settings.memory_mib, self.work)
            )
            f.cold.append(self.run(cold=True))
            self.say(f"baseline {i + 1}: bare qemu to SSH banner {f.bare[-1]:.1f}s, run --cold {f.cold[-1]:.1f}s")
        self.run()  # a warm-up, as the peers run one: the template's memory and the page cache loaded
        for i in range(s.runs):
            f.serial.append(self.run())
            self.say(f"serial {i + 1}: run -- true {f.serial[-1]:.1f}s")
        for i in range(s.rounds):
            start = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(CONCURRENCY) as pool:
                took = list(pool.map(lambda _: self.run(), range(CONCURRENCY)))
            f.walls.append(time.monotonic() - start)
            f.concurrent += took
            self.say(f"{CONCURRENCY} at once, round {i + 1}: {' '.join(f'{t:.1f}s' for t in took)}")

    def resume(self) -> None:
        self.figures.resumed = resumes(self.project, self.settings, self.sizes.resumes)
        for took, usable in self.figures.resumed:
            self.say(f"start {took:.1f}s, usable (exec -- true answered) {usable:.1f}s")

    def fork(self) -> None:
        source = f"{PREFIX}-src"
        vms("create", "--name", source, str(self.project))
        domain = Record.load(source).domain
        time.sleep(self.sizes.settle)  # idle
        try:
            for n in self.sizes.forks:
                figures = ForkFigures(n)
                self.figures.forks.append(figures)
                try:
                    self._forks(source, domain, figures)
                except BenchError as exc:
                    figures.error = str(exc)
                    self.say(f"fork {n}: {exc}")
        finally:
            vms("rm", source, "--discard")

    def _forks(self, source: str, domain: str, f: ForkFigures) -> None:
        n = f.n
        live = [f"{PREFIX}-l{n}-{i}" for i in range(1, n + 1)]
        with self._removed(live), PauseWatch(domain) as watch:
            f.live = children(live, source)
        f.live_pauses = watch.pauses
        self.say(f"fork {n}, live: {f.live:.1f}s, source paused {said(f.live_pauses)}")
        label = f"base{n}"
        made = [f"{PREFIX}-c{n}-{i}" for i in range(1, n + 1)]
        with self._removed(made), PauseWatch(domain) as watch:
            start = time.monotonic()
            vms("checkpoint", "create", source, label)
            f.checkpoint = time.monotonic() - start
            f.checkpointed = f.checkpoint + children(made, f"{source}:{label}")
        f.checkpoint_pauses = watch.pauses
        vms("checkpoint", "rm", source, label)
        self.say(
            f"fork {n} from one checkpoint: {f.checkpointed:.1f}s (checkpoint {f.checkpoint:.1f}s), source paused "
            f"{said(f.checkpoint_pauses)}"
        )
        wait_for_teardowns()
        f.fanout = fanout(self.project, n, n)
        self.say(f"run --fanout {n} -- true: {f.fanout:.1f}s")
        wait_for_teardowns()

    @contextlib.contextmanager
    def _removed(self, names: list[str]) -> Iterator[None]:
        try:
            yield
        finally:
            made = [n for n in names if (paths.sessions_dir() / n).exists()]
            if made:
                vms("rm", *made, "--discard")

    def review(self) -> None:
        for files in self.sizes.review:
            self.figures.reviews.append(measure(files, self.sizes.review_rounds))
            r = self.figures.reviews[-1]
            self.say(f"review of {files} files: terminal {p50(r.terminal):.1f}s, web {p50(r.web):.1f}s")

    def idle(self) -> None:
        f, made = self.figures, list[str]()
        wait_for_teardowns()
        time.sleep(self.sizes.settle)
        f.idle_base, f.idle_others = free_mib(), others()
        try:
            for target in self.sizes.idle:
                while len(made) < target and f.refused is None:
                    name = f"{PREFIX}-i{len(made) + 1}"
                    project = self.work / name
                    project.mkdir()
                    (project / "README").write_text("idle\n")
                    try:
                        vms("create", "--name", name, str(project))
                    except BenchError as exc:  # admission's refusal, or another failure: said in the table
                        f.refused = f"session {len(made) + 1} not made: {exc}"
                        break
                    made.append(name)
                if not made:
                    break
                time.sleep(self.sizes.settle)
                found = [u for u in (used(Record.load(n)) for n in made) if u is not None]
                host, (count, pss) = local_host(), others()
                f.idle.append(
                    IdleStep(
                        len(made),
                        (f.idle_base - free_mib()) / len(made),
                        statistics.mean(u.pss_mib for u in found) if found else float("nan"),
                        statistics.mean(u.rss_mib for u in found) if found else float("nan"),
                        len(found),
                        int(host.get("room") or 0),
                        int(host.get("available_mib") or 0),
                        count,
                        pss - f.idle_others[1],
                    )
                )
                s = f.idle[-1]
                self.say(
                    f"{s.sessions} idle: MemAvailable -{s.drop_per_session:.0f} MiB a session ({s.drop_of_ours:.0f} "
                    f"less {s.others} other VMs' growth), mean PSS {s.pss:.0f} MiB, RSS {s.rss:.0f} MiB; room for "
                    f"{s.room} more"
                )
                if f.refused is not None:
                    break
        finally:
            if made:
                vms("rm", *made, "--discard", timeout=3600)


def children(names: list[str], source: str) -> float:
    """Seconds until every child of `names` was made from `source` (`create --from`, one after the other: the
    source's lock takes one fork at a time) and answered `exec -- true`."""
    start = time.monotonic()
    for name in names:
        vms("create", "--from", source, "--name", name)
        vms("exec", name, "--", "true")
    return time.monotonic() - start


# --- the machine -------------------------------------------------------------------------------------------------


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return "unknown"


def mem_total_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / 1024**2
    return float("nan")


def commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout

    try:
        head = git("rev-parse", "--short=12", "HEAD").strip()
        dirty = git("status", "--porcelain", "--untracked-files=no").strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no git)"
    return f"{head}{' plus uncommitted changes' if dirty else ''}"


def others() -> tuple[int, float]:
    """The running libvirt domains that are not this run's (another person's sessions share the machine), and
    their QEMUs' PSS (MiB: those that can be read)."""
    with Hypervisor() as hv:
        names = [d.name for d in hv.domains("") if not d.stopped and not ours(d.name)]
    return len(names), float(sum(u.pss_mib for u in map(usage.of_domain, names) if u is not None))


def ours(domain: str) -> bool:
    return any(domain.startswith(f"{DOMAIN_PREFIX}{p}") for p in (f"{PREFIX}-", f"fan-{PID}-", f"bench-review-{PID}"))


def leftovers() -> list[str]:
    with Hypervisor() as hv:
        return sorted(d.name for d in hv.domains("") if ours(d.name))


def machine(bench: Bench, other_vms: int) -> list[tuple[str, str]]:
    host = local_host()
    why = f": {host['kvm_problem']}" if host.get("kvm_problem") and host.get("accel") != "kvm" else ""
    return [
        ("CPU", f"{cpu_model()}, {os.cpu_count()} cores"),
        ("Memory", f"{mem_total_gib():.1f} GiB"),
        ("Kernel", platform.release()),
        ("Accelerator", f"{host.get('accel', bench.choice.value)}, as vmsandbox chooses{why}"),
        ("QEMU", str(host.get("qemu", "unknown"))),
        ("libvirt", str(host.get("libvirt", "unknown"))),
        ("vmsandbox", f"commit {commit()}"),
        ("Each session", f"{bench.settings.cpus} vCPU, {bench.settings.memory_mib} MiB, image {bench.img.version}"),
        ("Other VMs", f"{other_vms} libvirt domains of others were running when the run began"),
    ]


# --- the table ---------------------------------------------------------------------------------------------------

CUBE = "CubeSandbox"
FORKD = "forkd"
CUBE_HW = (
    "Tencent Cloud BMI5 bare metal: 2 x Intel Xeon Platinum 8255C (96 logical cores), 375 GiB, NVMe SSD; "
    "sandboxes of 2 vCPU and 2 GiB; KVM"
)
FORKD_HW = "bare metal: Intel Core i7-12700 (20 vCPU), 30 GiB, Ubuntu 24.04, Linux 6.14; KVM"
CUBE_SHORT = "bare metal, 96 logical cores (Xeon Platinum 8255C), 375 GiB, KVM"
FORKD_SHORT = "bare metal, 20 vCPU (Core i7-12700), 30 GiB, KVM"
SOURCES = [
    (
        CUBE,
        "https://github.com/TencentCloud/CubeSandbox/blob/master/docs/guide/performance-benchmark.md",
        "its core operations report (bare metal): create from a template, `POST /sandboxes` until running, "
        "serial 47.8 ms average over 20 requests (p95 57.4 ms); 1,000 sandboxes of 2 GiB held at once, "
        "~25.7 MB of host memory each (the drop of `free`'s available, divided by their number). "
        f"Hardware: {CUBE_HW}.",
    ),
    (
        FORKD,
        "https://github.com/deeplethe/forkd",
        "its README's benchmark: 100 children spawned from a warmed parent snapshot in 101 ms, 0.12 MiB of host "
        f"memory each (copy-on-write of the parent's memory). Hardware: {FORKD_HW}. The 56 ms source pause (p50) "
        "is its v0.4 live BRANCH, as a summary of the project quotes it (https://heatdrop.ai/repo/deeplethe/forkd); "
        "its hardware: as published by them.",
    ),
]


@dataclass(frozen=True)
class Row:
    figure: str
    here: str
    ratio: str = ""
    peer: str = ""
    hardware: str = ""


def secs(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f} s"


def rows(f: Figures) -> list[Row]:
    bare = p50(f.bare) if f.bare else None
    cold = p50(f.cold) if f.cold else None
    warm = p50(f.serial) if f.serial else None
    return [
        *create_rows(f, bare, cold, warm),
        *fork_rows(f, cold, warm),
        *idle_rows(f),
        *review_rows(f),
        *(Row(f"{section}: did not finish", "(why: below)") for section in f.errors),
    ]


def create_rows(f: Figures, bare: float | None, cold: float | None, warm: float | None) -> list[Row]:
    out: list[Row] = []
    if bare is not None and cold is not None:
        out.append(Row("bare qemu-system-x86_64 boot to its SSH banner, p50", secs(bare)))
        out.append(Row("`run -- true` cold (`--cold`), p50", secs(cold), f"{cold / bare:.2f}x bare (target <= 1.10)"))
    if warm is not None:
        ratio = f"{warm / bare:.2f}x bare (target <= 0.15)" if bare else ""
        figure = f"create: `run -- true` warm, serial, p50 of {len(f.serial)}"
        out.append(Row(figure, secs(warm), ratio, f"{CUBE}: 48 ms", CUBE_SHORT))
    if f.concurrent and warm is not None:
        figure = (
            f"create: {CONCURRENCY} `run -- true` at once, p50 of each one's time ({many(len(f.walls), 'round')}; "
            f"a round's wall {p50(f.walls):.2f} s)"
        )
        out.append(Row(figure, secs(p50(f.concurrent)), f"{p50(f.concurrent) / warm:.2f}x serial"))
    if f.resumed:
        start, usable = p50([r[0] for r in f.resumed]), p50([r[1] for r in f.resumed])
        ratio = f"start alone {start / cold:.2f}x cold (target <= 0.15)" if cold else ""
        figure = (
            f"resume: `start NAME` of a stopped session to a usable `exec -- true`, p50 of {len(f.resumed)} "
            f"(`start` alone {start:.2f} s)"
        )
        out.append(Row(figure, secs(usable), ratio))
    return out


def fork_rows(f: Figures, cold: float | None, warm: float | None) -> list[Row]:
    out: list[Row] = []
    biggest = max((k.n for k in f.forks), default=0)
    for k in f.forks:
        last = k.n == biggest
        if k.error is not None:
            out.append(Row(f"fork {k.n}: did not finish", "(why: below)"))
            continue
        if k.live is not None:
            ratio = f"{k.live / k.n / cold:.2f}x cold a child (target <= 0.20)" if cold else ""
            peer = (f"{FORKD}: 100 children in 101 ms", FORKD_SHORT) if last else ("", "")
            out.append(Row(f"fork: {children_of(k.n)} of a live source, to all usable", secs(k.live), ratio, *peer))
            pauses = [p.seconds for p in k.live_pauses]
            off = max((p.error for p in k.live_pauses), default=0.0)
            pause = f"p50 {p50(pauses):.2f} s, max {max(pauses):.2f} s (each ±{off:.2f} s at most)" if pauses else ""
            peer = (f"{FORKD}: 56 ms (p50)", "as published by them") if last else ("", "")
            figure = f"fork: the source's pause during {many(k.n, 'fork')} ({many(len(pauses), 'pause')} seen)"
            out.append(Row(figure, pause or "none seen", "", *peer))
        if k.checkpointed is not None:
            pause = " + ".join(f"{p.seconds:.2f} s (±{p.error:.2f})" for p in k.checkpoint_pauses) or "none seen"
            figure = (
                f"fork: {children_of(k.n)} from one checkpoint, to all usable (checkpoint {secs(k.checkpoint)}; "
                f"source paused {pause})"
            )
            out.append(Row(figure, secs(k.checkpointed)))
        if k.fanout is not None:
            target = " (target <= 2.0)" if k.n == 4 else ""
            ratio = f"{k.fanout / warm:.2f}x one warm run{target}" if warm else ""
            out.append(Row(f"fan-out: `run --fanout {k.n} -- true`", secs(k.fanout), ratio))
    return out


def idle_rows(f: Figures) -> list[Row]:
    out: list[Row] = []
    for s in f.idle:
        peer = (
            (
                f"{FORKD}: 0.12 MiB a forked child; {CUBE}: ~25.7 MB a sandbox at 1,000",
                f"{FORKD}: {FORKD_SHORT}; {CUBE}: {CUBE_SHORT}",
            )
            if s is f.idle[-1]
            else ("", "")
        )
        figure = (
            f"memory: {s.sessions} idle sessions, MemAvailable's drop a session (less other VMs' growth: "
            f"{s.others} of them at the end)"
        )
        out.append(Row(figure, f"{s.drop_per_session:.0f} MiB ({s.drop_of_ours:.0f} MiB)", "", *peer))
        figure = f"memory: {s.sessions} idle sessions, their QEMUs' mean PSS (RSS), {s.read} read"
        out.append(Row(figure, f"{s.pss:.0f} MiB ({s.rss:.0f} MiB)"))
    if f.idle:
        last = f.idle[-1]
        if f.refused is not None:
            held = f"{last.sessions} held; {f.refused}"
        else:
            held = f"{last.sessions + last.room} ({last.sessions} held + room for {last.room} more)"
        out.append(Row("most idle sessions admitted on this host", held, "", f"{CUBE}: 1,000 on one host", CUBE_SHORT))
    return out


def review_rows(f: Figures) -> list[Row]:
    return [
        Row(
            f"review: a change of {r.files:,} files, `pull --dry-run` / the browser's first page, p50 of "
            f"{len(r.terminal)}",
            f"{p50(r.terminal):.2f} s / {p50(r.web):.2f} s",
            f"web {p50(r.web) / p50(r.terminal):.2f}x terminal",
        )
        for r in f.reviews
    ]


def plain(text: str) -> str:
    return text.replace("`", "")


def children_of(n: int) -> str:
    return "1 child" if n == 1 else f"{n} children"


def many(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def failures(f: Figures) -> list[str]:
    """Why each part that did not finish did not."""
    return [*(f"{k}: {v}" for k, v in f.errors.items()), *(f"fork {k.n}: {k.error}" for k in f.forks if k.error)]


def print_table(table: list[Row]) -> None:
    if not table:
        print("no figures")
        return
    width = max(len(plain(r.figure)) for r in table)
    here = max(len(r.here) for r in table)
    ratio = max(len(r.ratio) for r in table)
    print(f"{'figure':<{width}}  {'here':<{here}}  {'ratio':<{ratio}}  peers (published by them, not measured here)")
    for r in table:
        print(f"{plain(r.figure):<{width}}  {r.here:<{here}}  {r.ratio:<{ratio}}  {r.peer}")


def cell(text: str) -> str:
    return text.replace("|", "\\|") or "—"


def document(table: list[Row], failed: list[str], about: list[tuple[str, str]], sizes: Sizes, quick: bool) -> str:
    lines = [
        "# Benchmarks",
        "",
        f"Generated by `{COMMAND}{' --quick' if quick else ''}` (`make bench` runs it without `--quick`): every "
        "figure below is rewritten by the next run; do not edit this page by hand.",
        "",
    ]
    if quick:
        lines += [
            "!!! warning",
            "    These figures come from a `--quick` run: every part at tiny sizes, a smoke test of the bench, not "
            "results. `make bench` gives the real ones.",
            "",
        ]
    lines += ["## This machine", "", "| | |", "|---|---|", *(f"| {k} | {cell(v)} |" for k, v in about), ""]
    lines += [
        "## The figures",
        "",
        "Ours are this machine's, each the median (p50) of the runs said; ratios are to this machine's own baselines "
        "(the targets of bench/boot.py and bench/experiments.py). The peers' are **published by them, not measured "
        "here**, on their hardware (KVM on bare metal; here QEMU may emulate the CPU: see the accelerator above): "
        "read them beside ours, not as a comparison of equals.",
        "",
        "| Figure | vmsandbox, this machine | Ratio | Peers: published by them, not measured here | Their hardware |",
        "|---|---|---|---|---|",
    ]
    for r in table:
        lines.append(f"| {cell(r.figure)} | {cell(r.here)} | {cell(r.ratio)} | {cell(r.peer)} | {cell(r.hardware)} |")
    if failed:
        lines += ["", "## What did not finish", ""]
        lines += [f"- {why.replace('`', chr(39))}" for why in failed]  # (what a command said, quoted plainly)
    lines += ["", "## How each figure is measured", ""]
    lines += [f"- {m}" for m in methods(sizes)]
    lines += ["", "## The peers' sources", ""]
    lines += [f"- {name}: <{url}>: {what}" for name, url, what in SOURCES]
    lines += [
        "",
        "They measure other things than a `vmsandbox run`: CubeSandbox's create ends when the sandbox is running "
        "(ours when the command has run in it and `run` has exited), and forkd's children come from a snapshot "
        "taken once, where each of our forks copies the source's state then. Sandstorm and Zeroboot publish "
        "figures of the same shape; none is quoted here.",
        "",
    ]
    return "\n".join(lines)


def methods(s: Sizes) -> list[str]:
    forks, idle = ", ".join(map(str, s.forks)), ", ".join(map(str, s.idle))
    review = ", ".join(f"{n:,}" for n in s.review)
    return [
        "Every command is the real command line, `.venv/bin/python -m vmsandbox` (what `.venv/bin/vmsandbox` "
        "runs), a new process for each as a person runs it; sessions get the default shape, in a state directory "
        "of the run's own, all removed at the end.",
        "Create: `vmsandbox run PROJECT -- true` (a one-file project, warm: restored from the image's template), "
        "timed from the command's start to its exit; one warm-up run first, not counted. "
        f"Serial: {s.runs} runs one after another, each after the last one's VM is gone. "
        f"At once: {CONCURRENCY} started together, {many(s.rounds, 'round')}; the p50 of each one's own time. "
        f"Baselines for the ratios ({s.baseline} each): a bare qemu-system-x86_64 direct-kernel boot of the same "
        "image (same accelerator, CPU flags, vCPUs, memory, network) to its SSH banner, and "
        "`vmsandbox run --cold PROJECT -- true` (bench/boot.py).",
        f"Resume: one kept session, {s.resumes} times `vmsandbox stop NAME`, then `vmsandbox start NAME` timed "
        "until `vmsandbox exec NAME -- true` (run right after it) has answered; `start` alone is given too.",
        f"Fork, for N in {forks}: a kept idle source (`vmsandbox create`, left alone {s.settle:.0f} s). "
        "Live: N `vmsandbox create --from SRC --name NEW`, each followed by `vmsandbox exec NEW -- true`, one "
        "after the other (the CLI forks one child a command, and a fork holds the source's lock), timed from the "
        "first to the last answer. "
        "From one checkpoint: `vmsandbox checkpoint create SRC LABEL`, then N "
        "`vmsandbox create --from SRC:LABEL --name NEW` and `exec`, timed from the checkpoint's start to the last "
        "answer. "
        "The source's pause is read from outside the guest: a thread asks libvirt for the source's domain state "
        f"every {POLL * 1000:.0f} ms (a clock in the guest is no witness: its clocks come back with its saved "
        "memory and its wall clock is set again after a restore). A pause began between the start of the last "
        "look that found the domain running and the end of the first that found it not running (paused, being "
        "saved, or gone), and ended between the start of the last look that found it not running and the end of "
        "the first that found it running again; its length is taken from the middle of each bound, and the "
        "bounds' half-widths are given as its ± (a look can wait while libvirt launches the restored QEMU). It is "
        "the time the guest's CPUs did not run, not the time until its services answer again. "
        "Fan-out: `vmsandbox run --fanout N PROJECT -- true`, start to exit (N sessions from one capture, each "
        "running `true`; as many at once as the host has room and, under TCG, CPUs for).",
        f"Memory, at {idle} idle sessions: kept sessions made one after another with `vmsandbox create` (each "
        "on a one-file project). Before the first, the host's MemAvailable (from /proc/meminfo, once no VM of "
        "the run was left) is the baseline: the template's memory that sessions share, loaded by the earlier "
        f"parts, is in it and not in the figure. At each count, after {s.settle:.0f} s: the baseline less "
        "MemAvailable now, divided by the sessions; their QEMUs' mean PSS (a page N sessions share counts 1/N "
        "to each) and RSS from smaps_rollup (bench/density.py); and ROOM from `vmsandbox host ls --json`, how "
        "many more sessions of the configured memory admission would take now. The most idle sessions admitted "
        "is those held plus that room (or those held, when admission refused one). "
        "Other people's VMs on the machine move MemAvailable too: the figure in brackets leaves out how much "
        "their QEMUs' PSS grew (or shrank) meanwhile, which covers their VMs, not the rest of what they run. "
        "What a session takes beyond its QEMU (its egress proxy and its other processes) is in the drop, not in "
        "the PSS.",
        f"Review, for {review} changed files: a kept session on a project of that many Python files; each round "
        "changes one line of every file in the guest, then times `vmsandbox pull NAME --dry-run` (fetch, "
        "compare, scan, the summary) and, after another change, the first page of the session's review from "
        f"`vmsandbox ui` (bench/review.py); {many(s.review_rounds, 'round')}.",
    ]


# --- the run -----------------------------------------------------------------------------------------------------


def run_parts(bench: Bench, only: list[str]) -> None:
    """Each part asked for, in order; one that fails is said in the table, and the others run."""
    parts: dict[str, Callable[[], None]] = {
        "create": bench.create,
        "resume": bench.resume,
        "fork": bench.fork,
        "review": bench.review,
        "idle": bench.idle,
    }
    for name in SECTIONS:
        if name not in only:
            continue
        print(f"{name}:", file=sys.stderr, flush=True)
        try:
            parts[name]()
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - said in the table (SystemExit: bench/boot.py's)
            said = exc.stderr if isinstance(exc, subprocess.CalledProcessError) else None
            text = tail(said.decode(errors="replace") if isinstance(said, bytes) else said or "")
            text = text or (str(exc.code) if isinstance(exc, SystemExit) else f"{type(exc).__name__}: {exc}")
            bench.figures.errors[name] = text
            print(f"  {name} did not finish: {text}", file=sys.stderr, flush=True)


def clean_up(work: Path) -> None:
    """Every session of the run removed (Ctrl-C does not stop this), then its directory, unless a VM of the run
    is still there: then how to remove it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    print("removing the run's sessions", file=sys.stderr, flush=True)
    wait_for_teardowns()
    with contextlib.suppress(BenchError, subprocess.TimeoutExpired):
        vms("rm", "--all", "--yes", "--discard", timeout=3600)
    if left := leftovers():
        print(
            f"left behind: {' '.join(left)}; remove them with "
            f"`VMSANDBOX_STATE_DIR={work / 'state'} vmsandbox rm --all --yes --discard`",
            file=sys.stderr,
        )
    else:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="every part at tiny sizes: a smoke test")
    parser.add_argument("--out", type=Path, default=DOC, help=f"the page to write [default: {DOC.relative_to(ROOT)}]")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"some of {','.join(SECTIONS)}")
    args = parser.parse_args()
    only = [s for s in args.only.split(",") if s]
    if unknown := sorted(set(only) - set(SECTIONS)):
        parser.error(f"no such part: {', '.join(unknown)}")
    sizes = QUICK if args.quick else FULL
    os.environ.pop("VMSANDBOX_STATE_DIR", None)  # the run's own (workdir): its cleanup removes all there
    work, _ = workdir()
    project = work / PREFIX  # `run` names its sessions after it
    project.mkdir()
    (project / "README").write_text("bench\n")
    settings = Settings()
    bench = Bench(sizes, settings, accel.choose(settings.accel).accel, image.current_image(), work, project)
    count = others()[0]
    try:
        images.default_template(bench.img)  # built once, before anything is timed
        run_parts(bench, only)
        about = machine(bench, count)
        table = rows(bench.figures)
        print_table(table)
        failed = failures(bench.figures)
        for why in failed:
            print(f"did not finish: {why}")
        args.out.write_text(document(table, failed, about, sizes, args.quick))
        print(f"written: {args.out}", file=sys.stderr)
    except KeyboardInterrupt:
        return 130
    except VmsandboxError as exc:  # (before anything was measured: the template)
        print(f"error: {exc.message}" + (f"\nhint: {exc.hint}" if exc.hint else ""), file=sys.stderr)
        return 1
    finally:
        clean_up(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
