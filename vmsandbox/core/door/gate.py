"""The gate before a front end's HTTP server (an asyncio protocol that stands where the server's own would, then
hands the connection over): nothing of a connection is read, and the server holds no slot for it, until the
kernel said it is the person's (kernel.py, asked in a thread of its own, never on the event loop) and it sent a
whole request head within HEAD_TIMEOUT seconds.

- Another account's connection is answered (`refusal`) and closed as soon as the kernel named it: it never holds
  one of the server's slots, so no number of them takes the person's (the server counts only what it was
  handed), and each costs one hash lookup in the kernel, whatever the size of the socket table.
- A connection that sends no whole head in time, or a head over MOST_HEAD bytes, is closed (idle browser
  preconnections, a head a byte at a time).
- Once admitted, the server's own limits hold: its concurrency limit, its keep-alive timeout.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import socket
import threading
from collections.abc import Callable, Collection
from typing import Any, ClassVar

from vmsandbox.core.door import kernel

HEAD_TIMEOUT = 10.0  # seconds from connecting to a whole request head (the owner's lookup included)
MOST_HEAD = 64 * 1024  # bytes of a request head
END_OF_HEAD = b"\r\n\r\n"
LOOKUP_THREADS = 2  # lookups take microseconds each: two threads serve thousands of connections a second

log = logging.getLogger(__name__)
_lookups: concurrent.futures.ThreadPoolExecutor | None = None
_lookups_made = threading.Lock()


def lookups() -> concurrent.futures.ThreadPoolExecutor:
    """The threads that ask the kernel who connected (shared by every gate of this process)."""
    global _lookups  # noqa: PLW0603  (one pool per process, made when first needed)
    with _lookups_made:
        if _lookups is None:
            _lookups = concurrent.futures.ThreadPoolExecutor(LOOKUP_THREADS, thread_name_prefix="vmsandbox-door")
        return _lookups


def holder_of(sock: socket.socket | None) -> Callable[[], int | None]:
    """What finds who holds the other end of `sock` (a blocking call; nothing of the socket object is used by it
    but the addresses read here, on the loop)."""
    if sock is None:
        return lambda: None
    if sock.family == socket.AF_UNIX:
        found = kernel.unix_holder(sock)
        return lambda: found
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return lambda: None
    try:
        client, server = sock.getpeername(), sock.getsockname()
    except OSError:
        return lambda: None
    family = sock.family
    return lambda: kernel.tcp_holder(family, client, server)


class Gate(asyncio.Protocol):
    """Stands before `inner` (the HTTP server's protocol, made with the arguments the server gave the gate) until
    the connection is the person's and its first request head is whole. A front end names `inner`, who the
    person is (`owners`) and what a refused connection is answered (`refusal`)."""

    inner: ClassVar[Callable[..., asyncio.Protocol]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._made = (args, kwargs)
        self._transport: asyncio.Transport | None = None
        self._head = bytearray()
        self._admitted = False
        self._timer: asyncio.TimerHandle | None = None

    # -- what a front end says ------------------------------------------------------------------------------------
    def owners(self) -> Collection[int]:
        """The accounts let in (the person's)."""
        raise NotImplementedError

    def refusal(self, uid: int | None) -> bytes:
        """The whole answer to a connection of `uid` (None: nobody the kernel could name), written at once."""
        raise NotImplementedError

    # -- the connection -------------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not isinstance(transport, asyncio.Transport):  # (a server's stream transport is always one)
            transport.close()
            return
        self._transport = transport
        transport.pause_reading()  # nothing is read before the kernel said whose it is
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(HEAD_TIMEOUT, self._late)
        find = holder_of(transport.get_extra_info("socket"))
        try:
            asked = loop.run_in_executor(lookups(), find)
        except RuntimeError:  # (the pool is shut down: this process is ending)
            self._refuse(None)
            return
        asked.add_done_callback(self._judged)

    def _judged(self, asked: asyncio.Future[int | None]) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        uid = None if asked.cancelled() or asked.exception() is not None else asked.result()
        if uid is None or uid not in self.owners():
            self._refuse(uid)
            return
        self._admitted = True
        transport.resume_reading()
        self._read_on(transport)

    def _refuse(self, uid: int | None) -> None:
        self._stop_timer()
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(self.refusal(uid))
            self._transport.close()

    def _late(self) -> None:
        self._timer = None
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()  # (no answer: it asked nothing in time)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def data_received(self, data: bytes) -> None:
        if self._transport is None:
            return
        self._head += data  # (kept until the kernel has answered: asyncio may read once before the pause holds)
        self._read_on(self._transport, len(self._head) - len(data))

    def _read_on(self, transport: asyncio.Transport, seen: int = 0) -> None:
        """A whole head is handed over; one that grows past MOST_HEAD closes the connection."""
        end = self._head.find(END_OF_HEAD, max(0, seen - len(END_OF_HEAD) + 1), MOST_HEAD + len(END_OF_HEAD))
        if end < 0 and len(self._head) > MOST_HEAD:
            self._stop_timer()
            transport.close()
        elif end >= 0 and self._admitted:
            self._hand_over(transport)

    def _hand_over(self, transport: asyncio.Transport) -> None:
        """The connection to the server's protocol, as if it had been its from the start."""
        self._stop_timer()
        args, kwargs = self._made
        protocol = self.inner(*args, **kwargs)
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        protocol.data_received(bytes(self._head))
        self._head.clear()

    def eof_received(self) -> bool | None:
        return False  # (closed: a client that ends before its head asked nothing)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        self._transport = None
