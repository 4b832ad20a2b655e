"""The sync budget held while rsync receives, not only before anything is applied.

The per-file limit (RLIMIT_FSIZE, confine.accounts.guest_data_limits) bounds one file and the apply step counts what
the user accepted, but a guest that sends ten thousand files each under the per-file limit, or a million
empty ones, would fill the host's disk (or its memory, when the tree is read) before either is reached. So
the receiver is watched while it works, and the transfer is killed as soon as it passes a bound:

- **bytes**: what the kernel counted, the `wchar` of every rsync process of the transfer (/proc/PID/io: each
  byte handed to write(), whatever rsync's delta blocks, holes or hard links made of the stream; the relay's
  `cat`s only pass the wire on and are not counted; rsync's own messages are, within `SLACK`). Read every
  `POLL` seconds, so a transfer stops at most that long after passing the budget.
- **the file system's word**: where the mirror has a file system of its own (sync.fetch.volume), the kernel
  stops the receiver at the session's bound (ENOSPC); its first line saying so ends the transfer.
- **entries**: rsync prints one itemized line (`--out-format=%i %l`, never a name: what it did and the length)
  per file, directory or link it makes or updates; deletions are not counted. A file's length counts as written
  too, when the kernel's count (read between samples) says less.

What a transfer *spends* of the host's disk is counted as the file system spends it, not as bytes written: each
entry takes an inode and (a directory, a long link target, a file's tail) up to a block of its own, so each is
charged BLOCK besides the bytes written. 8,000 empty directories write almost nothing and take 32 MB.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vmsandbox.errors import VmsandboxError

POLL = 0.2
SLACK = 1024**2  # what rsync writes besides files (block checksums, indexes, messages) is counted too
OPTIONS = ("--out-format=%i %l",)  # what the receiver must be given for entries (and their lengths) to be counted
_ITEM = re.compile(r"^[<>ch.][fdLDS]")  # an itemized line of something received (not "*deleting")
# the receiver's own word that the file system it writes refused: no space, no inode, over a quota (ENOSPC, EDQUOT)
_FULL = re.compile(r"rsync: \[(?:receiver|generator)\] .*\((?:28|122)\)")  # the whole line (fullmatch)


BLOCK = 4096  # what an entry costs the file system at least, besides its bytes (an ext4 block)


@dataclass(frozen=True)
class Budget:
    """At most this much spent (bytes written, and a block per entry) and this many entries made by one
    transfer; `why` says whose bound it is ("in one pull", the session's, the host's free space); `full` what
    was passed when the file system itself refused (the mirror's own, or the host's)."""

    bytes: int
    entries: int
    why: str = "in one pull"
    full: str = "more than this machine's disk has free"


@dataclass
class Tally:
    """What a transfer spent, once it is over (bytes written and a block per entry; entries made)."""

    spent: int = 0
    entries: int = 0


class PassedError(VmsandboxError):
    """A transfer was stopped: it passed its budget (`what` says which bound)."""

    def __init__(self, what: str) -> None:
        super().__init__(f"the guest sent {what}; it was stopped while receiving")
        self.what = what


class Meter:
    """Watches one transfer (the process `pid` and everything under it) against a budget; kills its process
    group when the budget is passed. `line` is handed rsync's output lines."""

    def __init__(
        self,
        pid: int,
        budget: Budget,
        *,
        proc: Path = Path("/proc"),
        kill: Callable[[int], None] | None = None,
        tally: Tally | None = None,
    ) -> None:
        self.pid, self.budget, self.proc, self._kill = pid, budget, proc, kill or _kill_group
        self.tally = tally
        self.written = self.entries = self.listed = 0
        self.passed: str | None = None  # what was passed, once it was
        self._seen: dict[int, int] = {}  # the highest wchar read of each process (it never goes down)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> Meter:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()
        self.sample()
        if self.tally is not None:
            self.tally.spent, self.tally.entries = self.spent, self.entries

    @property
    def spent(self) -> int:
        """What the file system spends on what was received: the bytes written and a block per entry."""
        return max(self.written, self.listed) + BLOCK * self.entries

    def line(self, text: str) -> None:
        if _FULL.fullmatch(text):  # the kernel stopped it: the rest of the transfer would only be refused too
            self._stop(self.budget.full)
        elif _ITEM.match(text):
            self.entries += 1
            kind, _, length = text[1:].partition(" ")
            length = length if kind.startswith("f") else ""
            self.listed += int(length) if length.isascii() and length.isdigit() else 0
            if self.entries > self.budget.entries:
                self._stop(f"more than {self.budget.entries:,} files and directories {self.budget.why}")
            elif self.spent > self.budget.bytes + SLACK:
                self._stop(self._too_much())

    def _too_much(self) -> str:
        size = self.budget.bytes
        shown = f"{size // 1024**2:,} MiB" if size >= 1024**2 else f"{max(size, 0) // 1024:,} KiB"
        return f"more than {shown} {self.budget.why}"

    def sample(self) -> None:
        """Read the bytes written so far (and stop the transfer past the budget)."""
        for pid in self._rsyncs():
            # the task's own count: the process's would add its children once it reaped them, counted twice
            got = _wchar(self.proc / str(pid) / "task" / str(pid) / "io")
            if got is not None and got > self._seen.get(pid, 0):
                self._seen[pid] = got
        self.written = sum(self._seen.values())
        if self.spent > self.budget.bytes + SLACK:
            self._stop(self._too_much())

    def _watch(self) -> None:
        while not self._done.wait(POLL):
            self.sample()

    def _stop(self, what: str) -> None:
        if self.passed is None:
            self.passed = what
        self._kill(self.pid)

    def _rsyncs(self) -> list[int]:
        """The rsync processes under pid (the jail's and rsync's own forks), found through each task's list of
        children: a few reads, not a scan of every process."""
        found, todo = [], [self.pid]
        while todo:
            pid = todo.pop()
            here = self.proc / str(pid)
            if _read(here / "comm").strip() == "rsync":
                found.append(pid)
            with contextlib.suppress(OSError):
                for task in (here / "task").iterdir():
                    todo += [int(child) for child in _read(task / "children").split()]
        return found


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)  # the jail's first process and its group: the kernel ends the rest with it


def _wchar(path: Path) -> int | None:
    for line in _read(path).splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    return None
