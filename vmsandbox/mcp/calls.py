"""How a tool's call runs: in a worker thread, its progress said while it runs (`long`), its failures as the
client's error in the core's words, named by this front end's tools (`guarded`, `resourced`), and what it started
in the guest ended when the call is cancelled (`Launched`)."""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import anyio.to_thread
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceError, ToolError

from vmsandbox import ui
from vmsandbox.errors import VmsandboxError

T = TypeVar("T")
BEAT = 2.0  # seconds between progress notifications of a long call


# The fixes the API's side of the core words for E2B's SDK, in this front end's words (its tools).
OUR_WORDS = {
    "Sandbox.list()": "list_sessions", "list them with commands.list()": "use a process_id run_command returned",
    "commands.kill": "kill_process",
    "connect to it to resume it": "resume it with start_session", "Sandbox.create": "create_session",
}  # fmt: skip


NEW_REVIEW = re.compile(r"POST /vmsandbox/v1/sessions/[^ )]*/reviews")


def said(exc: VmsandboxError) -> str:
    """A failure in the core's words and with its fix, named by this front end's tools."""
    text = f"{exc.message} (fix: {exc.hint})" if exc.hint else exc.message
    for theirs, ours in OUR_WORDS.items():
        text = text.replace(theirs, ours)
    return NEW_REVIEW.sub("get_review", text)


def guarded(call: Callable[[], T]) -> T:
    """`call`, its VmsandboxError the tool's error result (the core's message and its fix)."""
    try:
        return call()
    except VmsandboxError as exc:
        raise ToolError(said(exc)) from exc


class Launched:
    """What a call started in the guest, for the call's cancel to end (`kill`): a process started once the call was
    cancelled (its worker thread was let go meanwhile) is killed by that thread, at once."""

    def __init__(self, kill: Callable[[int], None]) -> None:
        self.kill = kill
        self._pids: list[int] = []
        self._cancelled = False
        self._lock = threading.Lock()

    def __call__(self, pid: int) -> None:
        with self._lock:
            if not self._cancelled:
                self._pids.append(pid)
                return
        self.kill(pid)
        raise VmsandboxError(f"process {pid} started after its call was cancelled: killed")

    def cancel(self) -> list[int]:
        """The call is cancelled: the processes started so far, for the caller to kill."""
        with self._lock:
            self._cancelled = True
            return list(self._pids)


def quietly(call: Callable[[], object]) -> None:
    """`call`, a failure said on stderr (the server's log: no client waits for it any more)."""
    try:
        call()
    except VmsandboxError as exc:
        ui.warn(said(exc))


async def long(ctx: Context | None, what: str, call: Callable[[], T]) -> T:
    """`call` in a worker thread, and while it runs its progress, in words, at once and every BEAT seconds (what
    MCP clients show on a cold boot, a fan-out, a long command; the protocol's log lines are deprecated since
    2026-07-28, its progress is not). A cancelled call returns at once; what it started is the caller's to end."""

    async def beat() -> None:
        begun = time.monotonic()
        while ctx is not None:
            seconds = round(time.monotonic() - begun)
            with contextlib.suppress(Exception):  # (a client that asked for no progress still gets its answer)
                await ctx.report_progress(seconds, None, f"{what}: {seconds} s")
            await anyio.sleep(BEAT)

    async with anyio.create_task_group() as group:
        group.start_soon(beat)
        try:
            found = await anyio.to_thread.run_sync(lambda: guarded(call), abandon_on_cancel=True)
        finally:
            group.cancel_scope.cancel()
    return found


def resourced(call: Callable[[], T]) -> T:
    """`call`, its VmsandboxError a resource's error (the core's message and its fix)."""
    try:
        return call()
    except VmsandboxError as exc:
        raise ResourceError(said(exc)) from exc
