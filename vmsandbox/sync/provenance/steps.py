"""A session's steps, as the host keeps them: each command the session was asked to run (`exec`, `run`'s command,
`shell`, an agent, an API or MCP command) with its command as typed, its start, end and exit code.

The host names a step (a random id) and starts the command in the guest under the journal's `step` wrapper,
which registers the command's process as the step's root (journal.c): whatever that process and its
descendants write is the step's, even after the step ended. What the host writes here is its own word; only
which process wrote what comes from the guest. One small file per step (written whole, atomically), so two
commands of one session never write the same file; at most MAX_STEPS are read back.
"""

from __future__ import annotations

import heapq
import json
import logging
import os
import secrets
import shlex
import time
from collections.abc import Callable
from pathlib import Path

from vmsandbox import filewrite
from vmsandbox.paths import SessionPaths
from vmsandbox.sync.provenance.model import Step

__all__ = ["Step", "begin", "finish", "read", "run"]

log = logging.getLogger(__name__)

MAX_STEP_BYTES = 64 * 1024  # one step's file read at most (the host writes it: a command of at most 4096 characters)
MAX_STEPS = 2_000  # steps read back (the newest); a session with more shows these


def new_id() -> str:
    return secrets.token_hex(6)


def begin(files: SessionPaths, command: str, how: str) -> Step:
    """A step recorded as started now (its id is what the guest's wrapper registers). Best effort: a step that
    could not be written is still returned (the command runs under it), only not kept."""
    step = Step(new_id(), command[:4096], time.time(), how=how)
    try:
        _write(files, step)
    except OSError as exc:
        log.warning("the step of %r was not kept: %s", command[:200], exc)
    return step


def finish(files: SessionPaths, step: Step, code: int | None) -> None:
    """The step recorded as ended now with its exit code; best effort (never stops a command for its record)."""
    try:
        _write(files, Step(step.id, step.command, step.started, time.time(), code, step.how))
    except OSError as exc:
        log.warning("the end of step %s was not kept: %s", step.id, exc)


def run(files: SessionPaths, argv: list[str] | None, how: str, go: Callable[[str], int]) -> int:
    """`go(step_id)` (which starts ARGV in the guest under that step; None: a login shell) recorded as a step:
    begun now, finished with its exit code (None when it raised)."""
    step = begin(files, shlex.join(argv) if argv else "shell", how)
    code: int | None = None
    try:
        code = go(step.id)
        return code
    finally:
        finish(files, step, code)


def _write(files: SessionPaths, step: Step) -> None:
    files.steps.mkdir(mode=0o700, exist_ok=True)
    data = {k: v for k, v in step.as_json().items() if k != "egress"}
    filewrite.write_atomically(files.steps / f"{step.id}.json", json.dumps(data))


def read(files: SessionPaths) -> tuple[Step, ...]:
    """The session's steps in the order they started (the egress logged while each ran: core.views.steps)."""
    try:
        with os.scandir(files.steps) as listed:
            named = [(_written(e), e.name) for e in listed if e.name.endswith(".json")]
    except OSError:  # (none kept, or not readable: no steps to show)
        return ()
    newest = heapq.nlargest(MAX_STEPS, named)  # (only the newest are read: a session may have many)
    found = [step for _, name in newest if (step := _load(files.steps / name)) is not None]
    found.sort(key=lambda s: s.started)
    return tuple(found)


def _written(entry: os.DirEntry[str]) -> int:
    try:
        return entry.stat(follow_symlinks=False).st_mtime_ns
    except OSError:
        return 0


def _load(path: Path) -> Step | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            d = json.loads(f.read(MAX_STEP_BYTES))
        ended, code = d.get("ended"), d.get("exit")
        return Step(
            str(d["step"]), str(d["command"]), float(d["started"]), None if ended is None else float(ended),
            None if code is None else int(code), str(d.get("how", "exec")),
        )  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
