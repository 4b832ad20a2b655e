"""A sandbox's processes, from the host (interface.Processes): started, followed, fed and signalled through the
guest's side (supervisor.py), each call one ssh command as root over the session's pinned connection.

A process's output is followed by one `follow` per process, read into memory here as it comes; a caller asks
from a cursor (a byte offset of the guest's log, which holds all of it) and waits for more. When the follow
ends without the exit (the VM was stopped, the connection dropped), the next call starts another from where
the last one stopped: nothing is lost, since the guest keeps the log."""

from __future__ import annotations

import base64
import json
import shlex
import struct
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from vmsandbox import proc
from vmsandbox.core.sandbox.interface import NotFoundError, RefusedError
from vmsandbox.core.sandbox.model import Chunk, Exit, Output, ProcessInfo, ProcessSpec, Signal, Stream
from vmsandbox.core.sandbox.names import GuestPath, GuestUser
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest.ssh import Endpoint

HEAD = struct.Struct(">BI")
STREAMS = {1: Stream.STDOUT, 2: Stream.STDERR}
BATCH = 4 * 1024**2  # bytes of output in one answer
KEPT = 64 * 1024**2  # bytes of a process's output held here; older output is read again from the guest's log
CALL_TIMEOUT = 120.0


def guest_program() -> str:
    """The guest's side, as one `python3 -c` argument (never installed in the image)."""
    code = (Path(__file__).parent / "supervisor.py").read_bytes()
    loader = (
        f"import base64, sys; exec(compile(base64.b64decode({base64.b64encode(code).decode()!r}), 'vmsandbox', 'exec'))"
    )
    return f"python3 -c {shlex.quote(loader)}"


def guest_call(
    endpoint: Endpoint, args: Sequence[str], *, input: bytes | None = None, as_user: str | None = None
) -> proc.Result:
    """One verb of the guest's side, as root or (`as_user`) as that account."""
    run = f"{guest_program()} {shlex.join(args)}"
    if as_user is not None:
        run = f"runuser -u {shlex.quote(as_user)} -- {run}"
    argv = [*endpoint.ssh_argv("-T", user="root"), "--", run]
    return proc.run(argv, input=input, check=False, timeout=CALL_TIMEOUT)


class _Follow:
    """The output of one process, as read from the guest: records from `base` on, the exit once seen."""

    def __init__(self, endpoint: Endpoint, pid: int, since: int) -> None:
        self.endpoint, self.pid = endpoint, pid
        self.base = self.end = since  # cursor range held: [base, end)
        self.records: list[tuple[int, Chunk]] = []  # (offset just after it, chunk)
        self.exit: Exit | None = None
        self.changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def ensure(self) -> None:
        """A follow running from where the last one stopped, unless the exit was read."""
        if self.exit is None and not self.alive():
            self._thread = threading.Thread(target=self._read, daemon=True)
            self._thread.start()

    def _read(self) -> None:
        run = f"{guest_program()} follow {self.pid} {self.end}"
        child = proc.start([*self.endpoint.ssh_argv("-T", user="root"), "--", run])
        try:
            if child.stdout is not None:
                self._records(child.stdout)
        finally:
            child.kill()
            child.wait()
            with self.changed:
                self.changed.notify_all()

    def _records(self, stream: IO[bytes]) -> None:
        while head := stream.read(HEAD.size):
            if len(head) < HEAD.size:
                return
            kind, length = HEAD.unpack(head)
            data = stream.read(length)
            if len(data) < length:
                return
            with self.changed:
                self.end += HEAD.size + length
                if kind in STREAMS:
                    self.records.append((self.end, Chunk(STREAMS[kind], data)))
                    self._trim()
                else:
                    said = json.loads(data)
                    self.exit = Exit(int(said["code"]), str(said["status"]))
                self.changed.notify_all()

    def _trim(self) -> None:
        held = sum(len(c.data) for _, c in self.records)
        while held > KEPT and self.records:
            offset, chunk = self.records.pop(0)
            held -= len(chunk.data)
            self.base = offset

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


class GuestProcesses:
    """interface.Processes for one running session; `envs`: the sandbox's own, under every process's; `workdir`:
    where a process that names none starts (None: its account's home)."""

    def __init__(self, endpoint: Endpoint, user: str, envs: Mapping[str, str], workdir: str | None = None) -> None:
        self.endpoint, self.user, self.envs, self.workdir = endpoint, user, dict(envs), workdir
        self._follows: dict[int, _Follow] = {}
        self._lock = threading.Lock()

    def start(self, spec: ProcessSpec) -> int:
        wanted = {
            "cmd": spec.cmd, "args": list(spec.args), "envs": {**self.envs, **spec.envs},
            "cwd": self.workdir if spec.cwd is None else str(spec.cwd), "user": str(spec.user or self.user),
            "stdin": spec.stdin, "timeout": spec.timeout,
        }  # fmt: skip
        done = guest_call(self.endpoint, ["start"], input=json.dumps(wanted).encode())
        pid = done.stdout.strip()
        if done.returncode != 0 or not pid.isdigit():
            raise VmsandboxError(f"the process could not be started in the guest: {done.stderr.strip()[-300:]}")
        return int(pid)

    def _follow(self, pid: int, since: int) -> _Follow:
        with self._lock:
            found = self._follows.get(pid)
            if found is None or since < found.base:  # (older output than is held: read again from the log)
                found = self._follows[pid] = _Follow(self.endpoint, pid, since)
            found.ensure()
            return found

    def output(self, pid: int, cursor: int | None, wait: float) -> Output:
        f = self._follow(pid, cursor or 0)
        start = f.end if cursor is None else cursor
        deadline = time.monotonic() + max(wait, 0.0)
        with f.changed:
            while True:
                chunks, after, last = f.after(start)
                if chunks or (f.exit is not None and last) or time.monotonic() >= deadline:
                    return Output(chunks, after, f.exit if last else None)
                if not f.alive():
                    f.ensure()
                f.changed.wait(timeout=min(1.0, max(deadline - time.monotonic(), 0.01)))

    def running(self) -> Sequence[ProcessInfo]:
        done = guest_call(self.endpoint, ["list"])
        if done.returncode != 0:
            raise VmsandboxError(f"the guest's processes could not be listed: {done.stderr.strip()[-300:]}")
        found = []
        for item in json.loads(done.stdout):
            s = item["spec"]
            spec = ProcessSpec(
                cmd=s["cmd"], args=tuple(s.get("args") or ()), envs=s.get("envs") or {},
                cwd=GuestPath(s["cwd"]) if s.get("cwd") else None, user=GuestUser(s["user"]),
                stdin=bool(s.get("stdin")), timeout=s.get("timeout"),
            )  # fmt: skip
            found.append(ProcessInfo(int(item["pid"]), spec))
        return found

    def _known(self, pid: int) -> None:
        if pid not in {p.pid for p in self.running()}:
            raise NotFoundError(f"no running process {pid} in the sandbox", hint="list them with commands.list()")

    def send_input(self, pid: int, data: bytes) -> None:
        self._known(pid)
        done = guest_call(self.endpoint, ["input", str(pid)], input=data)
        if done.returncode != 0:
            raise RefusedError(f"process {pid} takes no input: {done.stderr.strip()[-200:]}")

    def close_input(self, pid: int) -> None:
        self._known(pid)
        guest_call(self.endpoint, ["close", str(pid)])

    def signal(self, pid: int, signal: Signal) -> None:
        self._known(pid)
        guest_call(self.endpoint, ["signal", str(pid), str(int(signal))])
