"""envd's Process service (process.Process) over the backend's Processes.

A process runs in the guest independently of the stream that started it: a client that disconnects, or whose
stream ends, leaves it running; `Connect` follows it again from that moment, `SendSignal` ends it. A stream
follows a process by polling the backend from a cursor, sending what came and, on a quiet stream, a keepalive
every Keepalive-Ping-Interval seconds. A Start's Connect-Timeout-Ms is the process's own timeout (envd kills
it then, whoever is watching) and ends the stream with deadline_exceeded.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from vmsandbox.api.envd import wire
from vmsandbox.api.envd.connect import Call, Kind, Method, RpcError
from vmsandbox.api.envd.wire import Message
from vmsandbox.api.threads import POLL, blocking
from vmsandbox.core.sandbox.interface import Backend, NotFoundError, NotRunningError, Processes
from vmsandbox.core.sandbox.model import ProcessSpec, Stream
from vmsandbox.core.sandbox.names import SessionName

SERVICE = "process.Process"
T = TypeVar("T")
NO_PTY = "a terminal (pty) is not served by vmsandbox's API"
NO_PTY_HINT = "run the command without a pty (commands.run), or use `vmsandbox shell NAME` for a terminal"


class ProcessService:
    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def methods(self) -> dict[str, Method]:
        return {
            f"/{SERVICE}/List": Method(Kind.UNARY, self.list),
            f"/{SERVICE}/Start": Method(Kind.SERVER_STREAM, self.start),
            f"/{SERVICE}/Connect": Method(Kind.SERVER_STREAM, self.connect),
            f"/{SERVICE}/Update": Method(Kind.UNARY, self.update),
            f"/{SERVICE}/StreamInput": Method(Kind.CLIENT_STREAM, self.stream_input),
            f"/{SERVICE}/SendInput": Method(Kind.UNARY, self.send_input),
            f"/{SERVICE}/SendSignal": Method(Kind.UNARY, self.send_signal),
            f"/{SERVICE}/CloseStdin": Method(Kind.UNARY, self.close_stdin),
        }

    async def _processes(self, call: Call) -> Processes:
        return await reach(self.backend.processes, call.sandbox)

    async def list(self, call: Call, _message: Message) -> Message:
        processes = await self._processes(call)
        found = await blocking(processes.running)
        return {"processes": [wire.process_info(p) for p in found]}

    async def start(self, call: Call, message: Message) -> AsyncIterator[Message]:
        if wire.child(message, "pty") is not None:
            raise RpcError("unimplemented", NO_PTY, hint=NO_PTY_HINT)
        spec = wire.process_spec(message, call.timeout)
        if not spec.cmd:
            raise RpcError("invalid_argument", "the process has no cmd", hint="name the program to run in `cmd`")
        processes = await self._processes(call)
        pid = await blocking(processes.start, _as_user(spec, call))
        return follow(processes, pid, 0, call)

    async def connect(self, call: Call, message: Message) -> AsyncIterator[Message]:
        processes = await self._processes(call)
        pid = await _pid(processes, message)
        now = await blocking(processes.output, pid, None, 0.0)  # a pid that is not there: not_found now
        return follow(processes, pid, now.cursor, call)

    async def update(self, _call: Call, _message: Message) -> Message:
        raise RpcError("unimplemented", NO_PTY, hint=NO_PTY_HINT)

    async def send_input(self, call: Call, message: Message) -> Message:
        processes = await self._processes(call)
        pid = await _pid(processes, message)
        await _give(processes, pid, wire.child(message, "input") or {})
        return {}

    async def stream_input(self, call: Call, messages: AsyncIterator[Message]) -> Message:
        processes = await self._processes(call)
        pid: int | None = None
        async for message in messages:
            if (start := wire.child(message, "start")) is not None:
                pid = await _pid(processes, start)
            elif (data := wire.child(message, "data")) is not None:
                if pid is None:
                    raise RpcError("invalid_argument", "input before the start message that names the process")
                await _give(processes, pid, wire.child(data, "input") or {})
        return {}

    async def send_signal(self, call: Call, message: Message) -> Message:
        processes = await self._processes(call)
        pid = await _pid(processes, message)
        await blocking(processes.signal, pid, wire.signal(message))
        return {}

    async def close_stdin(self, call: Call, message: Message) -> Message:
        processes = await self._processes(call)
        pid = await _pid(processes, message)
        await blocking(processes.close_input, pid)
        return {}


async def reach(bind: Callable[[SessionName], T], name: SessionName) -> T:
    """A running sandbox's processes or files. One that does not exist is, to envd's side, one not running."""
    try:
        return await blocking(bind, name)
    except NotFoundError as exc:
        raise NotRunningError(exc.message, hint=exc.hint) from None


def _as_user(spec: ProcessSpec, call: Call) -> ProcessSpec:
    return ProcessSpec(spec.cmd, spec.args, spec.envs, spec.cwd, call.user, spec.stdin, spec.tag, spec.timeout)


async def _pid(processes: Processes, message: Message) -> int:
    """The process a ProcessSelector names, by pid or by tag."""
    selector = wire.child(message, "process") or {}
    if wire.field(selector, "pid") is not None:
        return wire.integer(selector, "pid")
    tag = wire.optional_text(selector, "tag")
    if tag is None:
        raise RpcError("invalid_argument", "no process named", hint="select the process by its pid (or tag)")
    running = await blocking(processes.running)
    found = [p.pid for p in running if p.spec.tag == tag]
    if not found:
        raise RpcError("not_found", f"no running process is tagged {tag[:64]!r}")
    return found[0]


async def _give(processes: Processes, pid: int, given: Message) -> None:
    if wire.field(given, "pty") is not None:
        raise RpcError("unimplemented", NO_PTY, hint=NO_PTY_HINT)
    data = wire.raw_bytes(given, "stdin")
    if data:
        await blocking(processes.send_input, pid, data)


async def follow(processes: Processes, pid: int, cursor: int | None, call: Call) -> AsyncIterator[Message]:
    """The events of a process: its start, its output as it comes (keepalives between), its end."""
    yield {"event": {"start": {"pid": pid}}}
    deadline = None if call.timeout is None else time.monotonic() + call.timeout
    quiet_since = time.monotonic()
    while True:
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            raise RpcError(
                "deadline_exceeded",
                f"the stream ran past its timeout of {call.timeout:g} s",
                hint="pass a longer timeout (0 for none); a command started with it was killed then",
            )
        wait = min(POLL, call.keepalive, (deadline - now) if deadline is not None else POLL)
        out = await blocking(processes.output, pid, cursor, max(wait, 0.0))
        cursor = out.cursor
        for chunk in out.chunks:
            key = "stdout" if chunk.stream is Stream.STDOUT else "stderr"
            yield {"event": {"data": {key: wire.b64(chunk.data)}}}
        if out.exit is not None:
            yield wire.end_event(out.exit)
            return
        if out.chunks:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= call.keepalive:
            yield {"event": {"keepalive": {}}}
            quiet_since = time.monotonic()
