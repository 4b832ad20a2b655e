"""Who holds each accepted connection, asked of the kernel by one thread for every gate of this process, in
batches: whatever has been accepted since the last answer is asked for at once (kernel.tcp_holders: one dump
for a crowd), and the answers go back to each connection's event loop in one call.

Why a thread, and why batches. On the event loop, one request that waits stops every connection: before Linux
6.9 every account's inet_diag requests take one lock, and another account can hold it for a second at a time
with dumps of its own sockets. One request per connection, in a thread, waits on the interpreter's lock behind
a loop busy accepting a crowd: 59 of 904 connections were judged in the first second, each holding a
descriptor meanwhile. A batch costs the same few requests whether it holds one connection or thousands.

Fails closed: a batch whose asking raised names nobody in it (refused)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from vmsandbox.core.door import kernel

Answer = Callable[[int | None], None]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Asked:
    family: int
    server: tuple[str, int]
    client: tuple[str, int]
    loop: asyncio.AbstractEventLoop
    answer: Answer


class Judge:
    """The thread (started when first asked) and what waits for it."""

    def __init__(self) -> None:
        self._waiting: list[_Asked] = []
        self._woken = threading.Condition()
        self._thread: threading.Thread | None = None

    def ask(self, sock: Any, answer: Answer) -> None:
        """`answer(uid)` is called on the running loop once the kernel has named who holds the other end of
        `sock` (None: nobody it could name). Addresses are read here, on the loop; nothing else of the socket is
        used by the thread."""
        loop = asyncio.get_running_loop()
        family = getattr(sock, "family", None)
        if family == socket.AF_UNIX:
            loop.call_soon(answer, kernel.unix_holder(sock))  # (SO_PEERCRED: read from the socket, at once)
            return
        try:
            client, server = sock.getpeername(), sock.getsockname()
        except (OSError, AttributeError):  # (gone already: reset by its client; or no socket at all)
            client = server = None
        if family not in (socket.AF_INET, socket.AF_INET6) or client is None or server is None:
            loop.call_soon(answer, None)
            return
        with self._woken:
            self._waiting.append(_Asked(family, (server[0], server[1]), (client[0], client[1]), loop, answer))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="vmsandbox-door", daemon=True)
                self._thread.start()
            if len(self._waiting) == 1:  # (the thread waits only for a first: it takes the rest with it)
                self._woken.notify()

    def waiting(self) -> int:
        """How many connections wait for the thread to ask for them (not counting those being asked for)."""
        with self._woken:
            return len(self._waiting)

    def _run(self) -> None:
        while True:
            with self._woken:
                while not self._waiting:
                    self._woken.wait()
                batch, self._waiting = self._waiting, []
            try:
                self._answer(batch)
            except BaseException:  # (fails closed, and the thread goes on: nobody named, all refused)
                log.exception("the gate's judge failed on %d connections", len(batch))
                for loop, answers in _by_loop((a, None) for a in batch).items():
                    with contextlib.suppress(BaseException):
                        loop.call_soon_threadsafe(_deliver, answers)

    def _answer(self, batch: list[_Asked]) -> None:
        groups: dict[tuple[int, tuple[str, int]], list[_Asked]] = defaultdict(list)
        for asked in batch:
            groups[asked.family, asked.server].append(asked)
        found: dict[tuple[int, tuple[str, int], tuple[str, int]], int | None] = {}
        for (family, server), askers in groups.items():
            try:
                holders = kernel.tcp_holders(family, server, [a.client for a in askers])
            except Exception:  # (fails closed: nobody named, all refused)
                log.exception("asking the kernel who holds %d connections to %s failed", len(askers), server)
                holders = {}
            for a in askers:
                found[family, server, a.client] = holders.get(a.client)
        verdicts = ((a, found.get((a.family, a.server, a.client))) for a in batch)
        for loop, answers in _by_loop(verdicts).items():
            with contextlib.suppress(RuntimeError):  # (its loop is closed: those connections are gone)
                loop.call_soon_threadsafe(_deliver, answers)


def _by_loop(
    verdicts: Iterable[tuple[_Asked, int | None]],
) -> dict[asyncio.AbstractEventLoop, list[tuple[Answer, int | None]]]:
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Answer, int | None]]] = defaultdict(list)
    for asked, uid in verdicts:
        by_loop[asked.loop].append((asked.answer, uid))
    return by_loop


def _deliver(answers: list[tuple[Answer, int | None]]) -> None:
    for answer, uid in answers:
        try:
            answer(uid)
        except Exception:  # (one connection's failure is no other's)
            log.exception("a gate's answer failed")


judge = Judge()
