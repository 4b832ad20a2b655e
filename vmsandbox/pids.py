"""Processes we started earlier (the egress daemon, the `vmsandbox run` that owns a session), told apart from an
unrelated process that got the same pid: a pid and its start time, read from /proc. And waiting on a process's
descriptors (its pidfd, its pipes) with poll(2), never select(2): select takes no descriptor numbered past 1,023
(it raises ValueError), and a process that serves a front end raises its limit of descriptors
(core/door/gate.room) so that another account's crowd can be accepted and refused."""

from __future__ import annotations

import select
from pathlib import Path
from typing import IO, Any


def readable(fd: int | IO[Any], wait: float | None) -> bool:
    """Whether `fd` is readable (or ended, or failed) within `wait` seconds (None: as long as it takes)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(None if wait is None else max(0, round(wait * 1000))))


def process_start(pid: int) -> str | None:
    """The start time of pid (from /proc), to tell a live process from a reused pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def alive(pid: int | None, start: str | None) -> bool:
    """Whether the process that had `start` as its start time still runs (not a zombie, not a reused pid)."""
    if pid is None or start is None or process_start(pid) != start:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def runs(pid_file: Path, module: str) -> bool:
    """Whether the process a pid file names ("PID START", as a daemon of ours writes it) still runs, and runs our
    `module` (python -m), not another program."""
    try:
        pid, start = pid_file.read_text().split()
        return alive(int(pid), start) and module.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return False
