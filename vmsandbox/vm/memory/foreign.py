"""Root's looks at the descriptors of processes another account may steer (a template's holder, a QEMU), made where a
hang costs nothing: each is asked of root's look helper (vm.memory.look, a process of its own), with a deadline,
and whatever it took and may not close is held by its keeper, a process made to end last, never by root.

What a look costs when the other account plays foul, and its bounds (this process's, whatever calls it: the memory
guard, a warm start, gc, `doctor`, `host ls`):
- a descriptor that is no memory file by what the kernel says of it is never taken (most swaps end here);
- one swapped between that look and the take (a race the other account may win now and then) is kept open: the
  helper makes a keeper at the first such copy (a process sharing its descriptor table, root's child) and goes on
  answering; every later copy joins the same table. The keeper ends after the helper, and its exit is the close
  that may hang (a FUSE file that never answers its FLUSH): a task and a pid, after its memory is gone, never
  root's process nor its memory. The process that handed it over is an offender: never looked at again by this
  process, so each offender costs a descriptor once, and the processes that did not offend are looked at still;
- a helper that does not answer within LOOK_DEADLINE of being asked is killed (its waits are killable; what it held
  is its keeper's, so it ends at once) and its process is an offender too: this ends a helper's life, and with it,
  at worst, one keeper left hanging; a helper also ends once it holds look.MOST_HELD copies. The deadline counts
  from a helper that said it is ready: one slow to start (a loaded host) is killed past START_DEADLINE, and no
  process is blamed for it (none was asked about yet);
- at most MOST_LEFT keepers (and helpers that ended holding, where the kernel makes no keeper) are left running at
  once, reaped as they end: past that, no look is made, and each caller goes on as for a process it could not look
  at — assuming the worst of it (usage: a QEMU root cannot see maps every held file; a holder's file root cannot
  see is all holes), never that it holds nothing.
Every look that skips something says why (`notes`, `unsaid`): the callers say it where their person reads.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmsandbox import pids, proc
from vmsandbox.errors import VmsandboxError
from vmsandbox.vm.memory.look import MOST, NOT_MEMFD, NOT_TAKEN, READY, SWAPPED, TOO_MANY

LOOK_DEADLINE = 5.0  # a look of one process answers in milliseconds; past this its helper is killed and left
START_DEADLINE = 30.0  # a helper's start (an interpreter's): nothing of another account's is asked yet
# keepers (and helpers that ended holding) left running, each perhaps a task in state D for good, at most, before looks
# stop: one per helper that held a copy and was then killed at a deadline (an offender each), or full (MOST_HELD)
MOST_LEFT = 16
ANSWER_BYTES = 1 << 20
MOST_NOTES = 64

WHY = {
    NOT_MEMFD: "its descriptor {fd} is not a memfd",
    SWAPPED: "its descriptor {fd} was no memfd once taken (held by a keeper of root's: it may hang closing it)",
    NOT_TAKEN: "its descriptor {fd} could not be taken",
    TOO_MANY: f"its descriptor {{fd}} is past the first {MOST} memory files it holds",
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

    @property
    def blind(self) -> bool:
        """Whether the look may have missed a memory file of the process (it skipped something, or was not made):
        a caller then assumes the worst of it."""
        return bool(self.skipped)


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


class _Lines:
    """The lines a helper says, one at a time, each by a deadline (what came after a line waits for the next)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.got = bytearray()

    def next(self, deadline: float) -> bytes | None:
        """The next line by `deadline` (None: none, the stream ended, or it grew past ANSWER_BYTES)."""
        while b"\n" not in self.got:
            ready = pids.readable(self.fd, max(deadline - time.monotonic(), 0.0))
            if not ready:
                return None
            chunk = os.read(self.fd, 65536)
            if not chunk or len(self.got) + len(chunk) > ANSWER_BYTES:
                return None
            self.got += chunk
        line, _, rest = self.got.partition(b"\n")
        self.got = bytearray(rest)
        return bytes(line)


def _start() -> proc.Child:
    return proc.start(proc.own_module("vmsandbox.vm.memory.look"), stdin=proc.PIPE, stderr=proc.DEVNULL, cwd=Path("/"))


def _reaped(pid: int) -> bool:
    """Whether keeper `pid`, a child of this process (look.make_keeper), has ended: reaped if it has."""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:  # (not ours, or reaped already)
        return True


class _Helper:
    """Root's look helper: started when first asked, one request at a time (under _LOCK), killed and left when it does
    not answer in time; the keepers it made, reaped as they end."""

    def __init__(self, start: Callable[[], proc.Child] = _start, reaped: Callable[[int], bool] = _reaped) -> None:
        self.start, self.reaped = start, reaped
        self.child: proc.Child | None = None
        self.lines: _Lines | None = None
        self.left: list[proc.Child] = []  # helpers let go that have not ended yet (one that ended holding may hang)
        self.kept: list[int] = []  # its keepers: each ends once its helper has, perhaps hanging for good

    def running(self) -> int:
        """How many keepers, and helpers let go, have not ended yet (ended ones reaped: they cost nothing)."""
        self.left = [c for c in self.left if c.poll() is None]
        self.kept = [k for k in self.kept if not self.reaped(k)]
        return len(self.left) + len(self.kept)

    def ask(self, request: dict[str, Any]) -> dict[str, Any] | str:
        hanging = self.running()
        if hanging >= MOST_LEFT:
            return (
                f"root's looks left {hanging} processes holding what they took (each may hang for good closing it): "
                "no more looks from this process"
            )
        for _ in range(2):  # (a helper that ended since the last look: a fresh one)
            child = self._running()
            if isinstance(child, str):
                return child
            try:
                os.write(_fd(child.stdin), (json.dumps(request) + "\n").encode())
            except OSError:
                self._leave(kill=True)
                continue
            answer = self._answer(time.monotonic() + LOOK_DEADLINE)
            if answer is None:
                self._leave(kill=True)
                _SHUNNED.add((int(request["pid"]), request["start"]))
                return f"root's look got no answer within {LOOK_DEADLINE:.0f} s (its helper is left, killed)"
            if isinstance(answer, str):
                self._leave(kill=True)
                return answer
            if answer.get("ends"):
                self._leave(kill=False)  # (it ends by itself; without a keeper its end may hang: never waited for)
            return answer
        return "root's look helper ended at once, twice"

    def _answer(self, deadline: float) -> dict[str, Any] | str | None:
        """The helper's answer by `deadline` (None: none), each keeper it says it made on the way kept."""
        while self.lines is not None and (line := self.lines.next(deadline)) is not None:
            said = _json(line)
            if not isinstance(said, dict):
                return "root's look helper answered what it may not"
            if set(said) != {"keeper"}:
                return said
            if not isinstance(said["keeper"], int) or said["keeper"] <= 0:
                return "root's look helper answered what it may not"
            self.kept.append(said["keeper"])
        return None

    def _running(self) -> proc.Child | str:
        if self.child is not None and self.child.poll() is None:
            return self.child
        if self.child is not None:
            self._leave(kill=False)
        try:
            self.child = self.start()
        except (OSError, VmsandboxError) as exc:
            return f"root's look helper did not start: {exc}"
        self.lines = _Lines(_fd(self.child.stdout))
        ready = self.lines.next(time.monotonic() + START_DEADLINE)
        if ready is None or _json(ready) != READY:
            self._leave(kill=True)
            return f"root's look helper did not say it was ready within {START_DEADLINE:.0f} s (it is left, killed)"
        return self.child

    def _leave(self, *, kill: bool) -> None:
        """Let the helper go, never waited for: it is reaped at a later look once it ends (its keeper too)."""
        child, self.child = self.child, None
        if child is None:
            return
        if kill:
            with contextlib.suppress(OSError):
                child.kill()  # (our child, not yet reaped: its pid is not another's)
        if self.lines is not None:  # a keeper it made before it was killed: said already, or never
            with contextlib.suppress(OSError):
                self._answer(time.monotonic())
        self.lines = None
        for stream in (child.stdin, child.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self.left.append(child)


def _json(line: bytes) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        return None


def _fd(stream: Any) -> int:
    return int(stream.fileno())


_HELPER = _Helper()
_asked: Callable[[dict[str, Any]], dict[str, Any] | str] = _HELPER.ask  # (unit tests answer in their own process)


def left() -> int:
    """How many processes this process's looks left running that still run: keepers (each perhaps hanging on what its
    helper took) and helpers let go."""
    with _LOCK:
        return _HELPER.running()
