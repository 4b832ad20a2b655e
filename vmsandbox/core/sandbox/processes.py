"""A sandbox's processes, from the host (interface.Processes): started, followed, fed and signalled through the
guest's side (supervisor.py), each call one ssh command as root over the session's pinned connection.

A process's output is followed by one reader per process, read into memory here as it comes (at most KEPT bytes
of it); a caller asks from a cursor (a byte offset of the guest's log, which holds all of it) and waits for more.
When the reader ends without the exit (the VM was stopped, the connection dropped), the next call starts another
from where the last one stopped: nothing is lost, since the guest keeps the log; a caller behind what is held
gets its output read once from the log, never another reader. What the guest sends is held to the framing its
runner writes (records of at most 64 KiB, a short exit, nothing after it): a guest that breaks it ends the
process's output here, with why."""

from __future__ import annotations

import io
import json
import logging
import shlex
import struct
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Any

from vmsandbox import proc
from vmsandbox.core import sessions
from vmsandbox.core.sandbox.guestside import CALL_TIMEOUT, SSH, guest_call, guest_program, said
from vmsandbox.core.sandbox.interface import NotFoundError, RefusedError
from vmsandbox.core.sandbox.model import Chunk, Exit, Output, ProcessInfo, ProcessSpec, Signal, Stream
from vmsandbox.core.sandbox.names import GuestPath, GuestUser, InvalidError
from vmsandbox.core.sessions import Endpoint, Record, Step
from vmsandbox.errors import VmsandboxError

HEAD = struct.Struct(">BI")
STREAMS = {1: Stream.STDOUT, 2: Stream.STDERR}
EXIT = 0
RECORD = 64 * 1024  # the most the guest's runner writes in one record (supervisor.CHUNK): more is malformed
EXIT_RECORD = 512  # an exit record's JSON, at most
BATCH = 4 * 1024**2  # bytes of output in one answer
KEPT = 8 * 1024**2  # bytes of a process's output held here; older output is read again from the guest's log
FOLLOWED = 32  # processes followed at once in one sandbox
MISSING = 4  # the guest's `follow`: no such process
BACKOFF = 30.0  # seconds, at most, between two follows that ended without the exit
log = logging.getLogger(__name__)
MALFORMED = "the guest's output stream for this process was malformed; it is not read further"


class Malformed(Exception):  # noqa: N818 - the guest broke the records' framing
    """What the guest sent is not records as its runner writes them."""


def _exactly(stream: IO[bytes], size: int) -> bytes | None:
    """`size` bytes, or None where the stream ended first (a connection cut: not the guest's lie)."""
    data = stream.read(size)
    return data if len(data) == size else None


def records(stream: IO[bytes], most: int | None = None) -> Iterator[tuple[int, bytes]]:
    """The guest's records as (kind, data), checked as its runner writes them: output of 1 to RECORD bytes, an
    exit of at most EXIT_RECORD, nothing else, nothing after the exit and (`most`) no more bytes than asked for
    (Malformed). Lengths are bounded here, never taken from the guest as they come. Ends quietly where the stream
    was cut between or within records."""
    taken = 0
    while (head := _exactly(stream, HEAD.size)) is not None:
        kind, length = HEAD.unpack(head)
        if kind not in (*STREAMS, EXIT) or not 1 <= length <= (RECORD if kind in STREAMS else EXIT_RECORD):
            raise Malformed(f"a record of kind {kind} and {length} bytes")
        taken += HEAD.size + length
        if most is not None and taken > most + HEAD.size + RECORD:
            raise Malformed("more than it was asked for")
        data = _exactly(stream, length)
        if data is None:
            return
        yield kind, data
        if kind == EXIT:
            return


def exit_of(data: bytes) -> Exit:
    """An exit record: its code (an int, -1 for a signal) and a short status."""
    try:
        found = json.loads(data)
    except ValueError:
        raise Malformed("an exit that is not JSON") from None
    code, status = (found.get("code"), found.get("status")) if isinstance(found, dict) else (None, None)
    if type(code) is not int or not -1 <= code <= 255 or not isinstance(status, str):
        raise Malformed("an exit without its code and status")
    return Exit(code, said(status, 100))


class _Follow:
    """The output of one process, as read from the guest: records from `base` on (at most KEPT bytes of them),
    the exit once seen. One reader at a time; a reader that ends without the exit is started again, less and
    less often while it makes no progress; a stream that breaks the framing is not read again."""

    def __init__(self, endpoint: Endpoint, pid: int, since: int) -> None:
        self.endpoint, self.pid = endpoint, pid
        self.base = self.end = since  # cursor range held: [base, end)
        self.records: deque[tuple[int, Chunk]] = deque()  # (offset just after it, chunk)
        self.held = 0
        self.exit: Exit | None = None
        self.missing = False  # the guest has no such process
        self.changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._failures = 0
        self._next = 0.0

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def ensure(self) -> None:
        """A reader running from where the last one stopped, unless the exit was read or the process is not there,
        and not sooner than the back-off allows."""
        if self.exit is None and not self.missing and not self.alive() and time.monotonic() >= self._next:
            self._thread = threading.Thread(target=self._read, name=f"follow-{self.pid}", daemon=True)
            self._thread.start()

    def _read(self) -> None:
        run = f"{guest_program()} follow {self.pid} {self.end}"
        child = proc.start([*self.endpoint.ssh_argv(*SSH, user="root"), "--", run], stderr=proc.DEVNULL)
        before = self.end
        try:
            if child.stdout is not None:
                self._take(child.stdout)
        finally:
            child.kill()
            code = child.wait()
            with self.changed:
                if code == MISSING and self.end == before:
                    self.missing = True
                if self.end > before:
                    self._failures = 0
                self._failures += 1
                self._next = time.monotonic() + min(BACKOFF, 2.0 ** (self._failures - 1) - 1)
                self.changed.notify_all()

    def _take(self, stream: IO[bytes]) -> None:
        try:
            for kind, data in records(stream):
                got = exit_of(data) if kind == EXIT else Chunk(STREAMS[kind], data)
                with self.changed:
                    self.end += HEAD.size + len(data)
                    if isinstance(got, Exit):
                        self.exit = got
                    else:
                        self.records.append((self.end, got))
                        self.held += len(data)
                        while self.held > KEPT:
                            self.base, dropped = self.records.popleft()
                            self.held -= len(dropped.data)
                    self.changed.notify_all()
        except Malformed as exc:
            log.warning("process %s: %s", self.pid, exc)
            with self.changed:
                self.exit = Exit(-1, "malformed output", error=MALFORMED)
                self.changed.notify_all()

    def after(self, cursor: int) -> tuple[tuple[Chunk, ...], int, bool]:
        """The chunks after `cursor`, at most BATCH bytes, the cursor after them, and whether they are the last."""
        out: list[Chunk] = []
        size = 0
        last = cursor
        for offset, chunk in self.records:
            if offset <= cursor:
                continue
            if out and size + len(chunk.data) > BATCH:
                return tuple(out), last, False
            out.append(chunk)
            size += len(chunk.data)
            last = offset
        return tuple(out), max(last, cursor), True


def _info(item: dict[str, Any]) -> ProcessInfo:
    """A process as the guest's list describes it (its words checked as a client's would be)."""
    s = item["spec"]
    timeout = s.get("timeout")
    spec = ProcessSpec(
        cmd=str(s["cmd"]), args=tuple(str(a) for a in s.get("args") or ()),
        envs={str(k): str(v) for k, v in (s.get("envs") or {}).items()},
        cwd=GuestPath(str(s["cwd"])) if s.get("cwd") else None, user=GuestUser(str(s["user"])),
        stdin=bool(s.get("stdin")), timeout=None if timeout is None else float(timeout),
    )  # fmt: skip
    return ProcessInfo(int(item["pid"]), spec)


def _typed(spec: ProcessSpec) -> str:
    """A process's command as its caller typed it (E2B's SDK sends `/bin/bash -l -c COMMAND`: COMMAND)."""
    args = list(spec.args)
    shell = spec.cmd.rsplit("/", 1)[-1] in ("bash", "sh")
    if shell and len(args) >= 2 and args[-2] == "-c" and set(args[:-2]) <= {"-l"}:
        return args[-1]
    return shlex.join([spec.cmd, *args])


class GuestProcesses:
    """interface.Processes for one running session; `envs`: the sandbox's own, under every process's; `workdir`:
    where a process that names none starts (None: its account's home)."""

    def __init__(
        self,
        endpoint: Endpoint,
        user: str,
        envs: Mapping[str, str],
        workdir: str | None = None,
        record: Record | None = None,
    ) -> None:
        self.endpoint, self.user, self.envs, self.workdir = endpoint, user, dict(envs), workdir
        self.record = record  # the session whose steps its processes are (None: they are no steps)
        self._follows: dict[int, _Follow] = {}
        self._steps: dict[int, Step] = {}  # a started process's step, until its exit is seen
        self._lock = threading.Lock()

    def start(self, spec: ProcessSpec) -> int:
        step = None if self.record is None else sessions.step_begun(self.record, _typed(spec), "api")
        wanted = {
            "cmd": spec.cmd, "args": list(spec.args), "envs": {**self.envs, **spec.envs},
            "cwd": self.workdir if spec.cwd is None else str(spec.cwd), "user": str(spec.user or self.user),
            "stdin": spec.stdin, "timeout": spec.timeout, "step": None if step is None else step.id,
        }  # fmt: skip
        done = guest_call(self.endpoint, ["start"], input=json.dumps(wanted).encode())
        pid = done.stdout.strip()
        if done.returncode != 0 or not pid.isdigit():
            if step is not None and self.record is not None:
                sessions.step_ended(self.record, step, None)
            raise VmsandboxError(f"the process could not be started in the guest: {said(done.stderr)}")
        if step is not None:
            with self._lock:
                self._steps[int(pid)] = step
        return int(pid)

    def _ended(self, pid: int, out: Output) -> Output:
        """`out`, its process's step finished when it carries the exit."""
        if out.exit is not None and self.record is not None:
            with self._lock:
                step = self._steps.pop(pid, None)
            if step is not None:
                sessions.step_ended(self.record, step, out.exit.code)
        return out

    def _follow(self, pid: int, since: int) -> _Follow:
        """The one reader of `pid`'s output (made from `since` if there is none), started if it must be."""
        with self._lock:
            found = self._follows.get(pid)
            if found is None:
                ended = [p for p, f in self._follows.items() if f.exit is not None or f.missing]
                for old in ended[: max(len(self._follows) - FOLLOWED + 1, 0)]:
                    del self._follows[old]
                if len(self._follows) >= FOLLOWED:
                    raise RefusedError(
                        f"{FOLLOWED} processes of this sandbox are followed already",
                        hint="wait for one of them to end, or kill one (commands.kill)",
                    )
                found = self._follows[pid] = _Follow(self.endpoint, pid, since)
            found.ensure()
            return found

    def output(self, pid: int, cursor: int | None, wait: float) -> Output:
        f = self._follow(pid, cursor or 0)
        start = f.end if cursor is None else cursor
        if start < f.base:  # older than what is held: read once from the guest's log, never another reader
            return self._again(pid, start)
        deadline = time.monotonic() + max(wait, 0.0)
        with f.changed:
            while True:
                if f.missing:
                    raise NotFoundError(f"no process {pid} in the sandbox", hint="list them with commands.list()")
                chunks, after, last = f.after(start)
                if chunks or (f.exit is not None and last) or time.monotonic() >= deadline:
                    return self._ended(pid, Output(chunks, after, f.exit if last else None))
                f.ensure()
                f.changed.wait(timeout=min(1.0, max(deadline - time.monotonic(), 0.01)))

    def _again(self, pid: int, cursor: int) -> Output:
        """At most BATCH bytes of `pid`'s output from `cursor`, read once from the guest's log (its records whole)."""
        run = f"{guest_program()} follow {pid} {cursor} {BATCH}"
        child = proc.start([*self.endpoint.ssh_argv(*SSH, user="root"), "--", run], stderr=proc.DEVNULL)
        timer = threading.Timer(CALL_TIMEOUT, child.kill)  # (a guest that never answers is not waited for)
        timer.start()
        chunks: list[Chunk] = []
        after, ended = cursor, None
        try:
            for kind, data in records(child.stdout or io.BytesIO(), BATCH):
                after += HEAD.size + len(data)
                if kind == EXIT:
                    ended = exit_of(data)
                else:
                    chunks.append(Chunk(STREAMS[kind], data))
        except Malformed as exc:
            log.warning("process %s: %s", pid, exc)
            ended = Exit(-1, "malformed output", error=MALFORMED)
        finally:
            timer.cancel()
            child.kill()
            code = child.wait()
        if code == MISSING and after == cursor:
            raise NotFoundError(f"no process {pid} in the sandbox", hint="list them with commands.list()")
        return self._ended(pid, Output(tuple(chunks), after, ended))

    def running(self) -> Sequence[ProcessInfo]:
        done = guest_call(self.endpoint, ["list"])
        if done.returncode != 0:
            raise VmsandboxError(f"the guest's processes could not be listed: {said(done.stderr)}")
        try:
            return [_info(item) for item in json.loads(done.stdout)]
        except (AttributeError, KeyError, TypeError, ValueError, InvalidError):
            raise RefusedError("the guest's answer is not a list of its processes") from None

    def _known(self, pid: int) -> None:
        if pid not in {p.pid for p in self.running()}:
            raise NotFoundError(f"no running process {pid} in the sandbox", hint="list them with commands.list()")

    def send_input(self, pid: int, data: bytes) -> None:
        self._known(pid)
        done = guest_call(self.endpoint, ["input", str(pid)], input=data)
        if done.returncode != 0:
            raise RefusedError(f"process {pid} takes no input: {said(done.stderr, 200)}")

    def close_input(self, pid: int) -> None:
        self._known(pid)
        guest_call(self.endpoint, ["close", str(pid)])

    def signal(self, pid: int, signal: Signal) -> None:
        self._known(pid)
        guest_call(self.endpoint, ["signal", str(pid), str(int(signal))])
