"""Root's looks at the descriptors of processes another account may steer (a template's holder, a QEMU), made where a
hang costs nothing: each is asked of root's look helper (vm.memory.look, a process of its own), with a deadline,
and a helper that holds what it took, or does not answer in time, is left to itself and never waited for.

What a look costs when the other account plays foul, and its bounds (this process's, whatever calls it: the memory
guard, a warm start, gc, `doctor`, `host ls`):
- a descriptor that is no memory file by what the kernel says of it is never taken (most swaps end here);
- one swapped between that look and the take (a race the other account may win now and then) is held by the
  helper, which ends at once: its exit closes it after its memory is gone, so if the close hangs (a FUSE file that
  never answers its FLUSH) a task and a pid are lost, never root's process nor its memory; the process that did it
  is not looked at again by this process;
- a helper that does not answer within LOOK_DEADLINE is killed (its waits are killable) and left;
- at most MOST_LEFT helpers are left running at once (ended ones are reaped at each look): past that, no look is
  made, and each caller goes on as it does for a process it could not look at.
Every look that skips something says why (`notes`, `unsaid`): the callers say it where their person reads.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmsandbox import pids, proc
from vmsandbox.errors import VmsandboxError
from vmsandbox.vm.memory import look as helper

LOOK_DEADLINE = 5.0  # a look of one process answers in milliseconds; past this its helper is killed and left
MOST_LEFT = 8  # helpers left running (each perhaps a task in state D for good), at most, before looks stop
ANSWER_BYTES = 1 << 20
MOST_NOTES = 64

WHY = {
    helper.NOT_MEMFD: "its descriptor {fd} is not a memfd",
    helper.SWAPPED: "its descriptor {fd} was no memfd once taken (left to root's look helper, which may hang on it)",
    helper.NOT_TAKEN: "its descriptor {fd} could not be taken",
    helper.TOO_MANY: f"its descriptor {{fd}} is past the first {helper.MOST} memory files it holds",
}


@dataclass(frozen=True)
class Memfd:
    """A memory file another process holds, as root's look helper saw it."""

    fd: int
    device: int
    inode: int
    size: int
    blocks: int
    sealed: bool  # every seal of vm.memory.sealed.SEALS

    @property
    def key(self) -> tuple[int, int]:
        return self.device, self.inode


@dataclass(frozen=True)
class Look:
    """What a look at a process found: its memory files, and what was skipped, in words."""

    found: tuple[Memfd, ...] = ()
    skipped: tuple[str, ...] = ()
    gone: bool = False  # the process ended (or its pid is another's): nothing to say


# (pid, start) of the processes that handed a look something no memfd, or held one past its deadline
_SHUNNED: set[tuple[int, str | None]] = set()
_NOTES: dict[str, bool] = {}  # every skip said once, in order: whether a caller said it yet
_LOCK = threading.Lock()


def look(pid: int, who: str, *, start: str | None = None, fds: tuple[int, ...] | None = None) -> Look:
    """The memory files of ours that process `pid` holds (at `fds`, or wherever its links name one), told by root's
    look helper. `who`: what the process is, in words ("holder pid 42"), for what is skipped; `start`: its start
    time, so that a reused pid is not it."""
    start = start if start is not None else pids.process_start(pid)
    with _LOCK:
        shunned = (pid, start) in _SHUNNED
        answer = None if shunned else _asked({"pid": pid, "start": start, "fds": None if fds is None else list(fds)})
    if answer is None:
        return _skipped(who, "it handed root's look something else than a memfd, or held it past its deadline")
    if isinstance(answer, str):
        return _skipped(who, answer)
    try:
        if answer.get("holding"):
            with _LOCK:
                _SHUNNED.add((pid, start))
        if answer.get("gone"):
            return Look(gone=True)
        found = tuple(Memfd(int(f[0]), int(f[1]), int(f[2]), int(f[3]), int(f[4]), bool(f[5])) for f in answer["found"])
        why = [f"skipped {who}: {WHY.get(str(w), str(w)).format(fd=int(fd))}" for fd, w in answer["skipped"]]
    except (KeyError, TypeError, ValueError, IndexError, AttributeError):
        return _skipped(who, "root's look helper answered what it may not")
    for w in why:
        note(w)
    return Look(found, tuple(why))


def notes() -> list[str]:
    """Every skip this process's looks made, in words, each once (the latest MOST_NOTES)."""
    with _LOCK:
        return list(_NOTES)


def unsaid() -> list[str]:
    """The skips no caller said yet (each is handed out once)."""
    with _LOCK:
        fresh = [n for n, said in _NOTES.items() if not said]
        _NOTES.update(dict.fromkeys(fresh, True))
    return fresh


def _skipped(who: str, why: str) -> Look:
    said = f"skipped {who}: {why}"
    note(said)
    return Look(skipped=(said,))


def note(said: str) -> None:
    """Keep a skip, in words, for the callers to say (once: `unsaid`)."""
    with _LOCK:
        if said not in _NOTES:
            _NOTES[said] = False
            while len(_NOTES) > MOST_NOTES:
                del _NOTES[next(iter(_NOTES))]


class _Helper:
    """Root's look helper: started when first asked, one request at a time (under _LOCK), left when it holds what it
    took or does not answer in time."""

    def __init__(self) -> None:
        self.child: proc.Child | None = None
        self.left: list[proc.Child] = []

    def ask(self, request: dict[str, Any]) -> dict[str, Any] | str:
        self.left = [c for c in self.left if c.poll() is None]  # (reaped: ended ones cost nothing)
        if len(self.left) >= MOST_LEFT:
            return f"root has left {len(self.left)} looks hanging on what they took: no more looks from this process"
        for _ in range(2):  # (a helper that ended since the last look: a fresh one)
            child = self._running()
            if isinstance(child, str):
                return child
            try:
                os.write(_fd(child.stdin), (json.dumps(request) + "\n").encode())
            except OSError:
                self._leave(kill=True)
                continue
            line = _line(_fd(child.stdout), time.monotonic() + LOOK_DEADLINE)
            if line is None:
                self._leave(kill=True)
                _SHUNNED.add((int(request["pid"]), request["start"]))
                return f"root's look got no answer within {LOOK_DEADLINE:.0f} s (its helper is left, killed)"
            try:
                answer: dict[str, Any] = json.loads(line)
            except ValueError:
                self._leave(kill=True)
                return "root's look helper answered what it may not"
            if answer.get("holding"):
                self._leave(kill=False)  # (it ends by itself; its end may hang: never waited for)
            return answer
        return "root's look helper ended at once, twice"

    def _running(self) -> proc.Child | str:
        if self.child is not None and self.child.poll() is None:
            return self.child
        if self.child is not None:
            self._leave(kill=False)
        try:
            self.child = proc.start(
                proc.own_module("vmsandbox.vm.memory.look"), stdin=proc.PIPE, stderr=proc.DEVNULL, cwd=Path("/")
            )
        except (OSError, VmsandboxError) as exc:
            return f"root's look helper did not start: {exc}"
        return self.child

    def _leave(self, *, kill: bool) -> None:
        """Let the helper go, never waited for: it is reaped at a later look if it ends."""
        child, self.child = self.child, None
        if child is None:
            return
        if kill:
            with contextlib.suppress(OSError):
                child.kill()  # (our child, not yet reaped: its pid is not another's)
        for stream in (child.stdin, child.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self.left.append(child)


def _fd(stream: Any) -> int:
    return int(stream.fileno())


def _line(fd: int, deadline: float) -> bytes | None:
    """One line from `fd` by `deadline` (None: none, the stream ended, or it grew past ANSWER_BYTES)."""
    got = bytearray()
    while b"\n" not in got:
        wait = deadline - time.monotonic()
        if wait <= 0 or not select.select([fd], [], [], wait)[0]:
            return None
        chunk = os.read(fd, 65536)
        if not chunk or len(got) + len(chunk) > ANSWER_BYTES:
            return None
        got += chunk
    return bytes(got.split(b"\n", 1)[0])


_HELPER = _Helper()
_asked: Callable[[dict[str, Any]], dict[str, Any] | str] = _HELPER.ask  # (unit tests answer in their own process)


def left() -> int:
    """How many look helpers this process left that still run (each perhaps hanging on what it took)."""
    with _LOCK:
        _HELPER.left = [c for c in _HELPER.left if c.poll() is None]
        return len(_HELPER.left)
