"""Backend calls block (they boot VMs, talk SSH); the edge makes them in worker threads, never on its loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, TypeVarTuple, Unpack

from anyio import to_thread

THREADS = 128  # backend calls at once (a followed process's poll holds one for up to POLL seconds)
POLL = 1.0  # the longest a stream waits in one backend call: a client that left is noticed within it

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


def widen() -> None:
    """Let THREADS backend calls run at once on this loop (anyio's default is 40). Called at startup."""
    to_thread.current_default_thread_limiter().total_tokens = THREADS


async def blocking(func: Callable[[Unpack[Ts]], T], *args: *Ts) -> T:
    """`func(*args)` in a worker thread. If the request that waits is cancelled (its client left), the call
    still runs to its end: what a client asked for is done, whether or not it stays to hear of it."""
    return await to_thread.run_sync(func, *args, abandon_on_cancel=True)
