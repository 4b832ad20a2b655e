"""A fan-out: N sessions from one capture of the project (and one warm-start template), each running the same
command with VMSANDBOX_INDEX=1..N set, as many at a time as the host's memory allows; then what each one did.

The project is captured once (into a staging directory beside the sessions); every session copies that
capture (reflinks where the file system has them) and is made, and runs the command, in a worker thread.
Every session is kept (`--keep`): the person compares them, pulls the one they want and destroys the group
(`vmsandbox rm --group NAME`). A command's output goes to fanout.log in its session directory.
"""

from __future__ import annotations

import contextlib
import shlex
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from vmsandbox import paths, ui
from vmsandbox.confine import accounts
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest import commands
from vmsandbox.session import lock
from vmsandbox.session.end import lifecycle
from vmsandbox.session.host import hosts
from vmsandbox.session.options import Run
from vmsandbox.session.place import choose
from vmsandbox.session.record import Record, default_name, validate_name
from vmsandbox.session.record import names as record_names
from vmsandbox.session.start import create, project
from vmsandbox.sync.inward import capture
from vmsandbox.sync.provenance import steps
from vmsandbox.sync.review import gather
from vmsandbox.sync.review.diff import diff_text

LOG = "fanout.log"
INDEX_VARIABLE = "VMSANDBOX_INDEX"
MAX_SESSIONS = 64


@dataclass(frozen=True)
class Outcome:
    name: str
    index: int
    code: int | None  # the command's exit code; None when the session could not be made
    seconds: float  # from the start of making the session to the command's end
    check: bool | None = None  # whether the --check command passed (None: none given, or not reached)
    files: int = 0  # changed paths, pending review
    added: int = 0
    removed: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.code == 0 and self.check is not False


def names(run: Run, n: int) -> tuple[str, list[str]]:
    """The group's name (--name, else from the project) and its sessions' (`GROUP-1` … `GROUP-N`). A name from the
    project ends in a random suffix, new at each call: a caller that prints it passes it on as the run's name."""
    if not 1 <= n <= MAX_SESSIONS:
        raise VmsandboxError(f"a fan-out starts 1 to {MAX_SESSIONS} sessions, not {n}")
    group = run.options.name or default_name(run.options.project.resolve())
    return group, [validate_name(f"{group}-{i}") for i in range(1, n + 1)]


def workers(run: Run, n: int) -> int:
    """How many sessions start at once: as many as fit in the memory the host has available, and under TCG (where
    a starting guest keeps a host CPU busy) no more than two per CPU. Their restores map one copy of their
    template's memory and load none of it, so what a start waits on is mostly the host's own steps and each guest's
    identity, which overlap: measured on 2 cores, 4 sessions took 17.0 s all at once and 23.7 s two at a time
    (before memory was shared, all at once was the slower: 38 s against 31)."""
    memory_mib = max(run.options.settings.memory_mib, 1)
    spec = choose.spec_for(run.options.host, run.options.settings.libvirt_uri)
    there = hosts.probe(spec)
    if there.node is None:
        raise VmsandboxError(
            f"host {spec.name} does not answer: {there.problem}",
            hint="`vmsandbox host ls` shows every host and why one does not answer",
        )
    fit = there.node.available_mib // memory_mib
    return max(1, min(n, fit, 2 * there.node.cpus if there.accel == "tcg" else fit))


def fan_out(run: Run, n: int, check: str | None, *, limit: int) -> list[Outcome]:
    """Capture the project once, then make the sessions and run the command in each, as many at a time as
    `workers` allows. A session that could not be made is an Outcome with its error; the others go on."""
    if not run.command:
        raise VmsandboxError("a fan-out needs a command", hint="e.g. `vmsandbox run --fanout 3 . -- make test`")
    group, all_names = names(run, n)
    taken = [name for name in all_names if paths.session_paths(name).root.exists()]
    if taken:
        raise VmsandboxError(
            f"session(s) {', '.join(taken)} exist already",
            hint=f"pick another --name, or remove them with `vmsandbox rm --group {group}`",
        )
    staging = paths.fanout_capture(group)
    shutil.rmtree(staging.root, ignore_errors=True)
    accounts.state_dirs()
    accounts.make_private_dir(staging.root)
    outcomes: list[Outcome | None] = [None] * n
    try:
        step = ui.step(f"Capturing {run.options.project} once for {n} sessions")
        with step, project.opened(run.options.project) as tree:  # (checked and copied from one descriptor)
            capture.capture(tree, staging, pristine=True, leave_out=run.options.leave_out)
        opts = replace(run.options, keep=True, group=group, baseline_from=staging.root)

        def work(i: int) -> None:
            name, started = all_names[i], time.monotonic()
            with ui.quiet(name):
                try:
                    record = create.create(replace(opts, name=name))
                    progress(f"{name} started")
                    outcomes[i] = _run_one(record, i + 1, run.command or [], check, started, limit)
                except (VmsandboxError, OSError) as exc:  # one session's trouble: the others go on
                    why = exc.message if isinstance(exc, VmsandboxError) else str(exc)
                    ui.warn(why)
                    outcomes[i] = Outcome(name, i + 1, None, time.monotonic() - started, error=why)
            progress(f"{sum(o is not None for o in outcomes)}/{n} done")

        pool = ThreadPoolExecutor(max_workers=workers(run, n))
        try:
            with ui.step(f"Running {n} sessions") as progress:
                list(pool.map(work, range(n)))
        except KeyboardInterrupt:
            ui.warn(f"interrupted: the sessions started so far are kept; `vmsandbox rm --group {group}` ends them")
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)  # what runs finishes; what waits does not start
    finally:
        shutil.rmtree(staging.root, ignore_errors=True)
    return [o for o in outcomes if o is not None]


def _run_one(record: Record, index: int, command: list[str], check: str | None, started: float, limit: int) -> Outcome:
    log = record.files.root / LOG
    argv = ["env", f"{INDEX_VARIABLE}={index}", *command]
    code = _logged(record, argv, log, "w")
    seconds = time.monotonic() - started
    checked = None
    if check is not None:
        checked = _logged(record, ["env", f"{INDEX_VARIABLE}={index}", "sh", "-c", check], log, "a") == 0
    with lock.held(record.files, record.name, "reviewing the changes of"):
        plan = lifecycle.review(Record.load(record.name), limit=limit)
    pending = gather.pending(plan.gathered)
    added = removed = 0
    for c in pending:
        for line in diff_text(plan.gathered, c).splitlines():
            if line.startswith("+") and not line.startswith("+++ "):
                added += 1
            elif line.startswith("-") and not line.startswith("--- "):
                removed += 1
    return Outcome(record.name, index, code, seconds, checked, len(pending), added, removed)


def _logged(record: Record, argv: list[str], log: Path, mode: str) -> int:
    """Run argv in the session's project directory; its output (guest bytes) into `log`, never the terminal."""
    endpoint, step = record.endpoint(), steps.begin(record.files, shlex.join(argv), "fan-out")
    code: int | None = None
    try:
        result = commands.captured(endpoint, record.project, argv, step=step.id)
        code = result.returncode
    finally:
        steps.finish(record.files, step, code)
    with log.open(mode, errors="replace") as f:
        f.write(f"$ {' '.join(argv)}\n{result.stdout}{result.stderr}[exit {result.returncode}]\n")
    return result.returncode


def group_members(group: str) -> list[Record]:
    """The sessions of a fan-out."""
    found = []
    for name in record_names():
        with contextlib.suppress(VmsandboxError):
            record = Record.load(name)
            if record.group == group:
                found.append(record)
    return found
