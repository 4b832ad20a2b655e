"""The gate before a front end's HTTP server (an asyncio protocol that stands where the server's own would, then
hands the connection over): nothing of a connection is read, and the server holds no slot for it, until the
kernel said it is the person's (judge.py: one thread asks for every connection accepted meanwhile, in one
request for a crowd) and it sent a whole request head within HEAD_TIMEOUT seconds.

- Another account's connection is answered (`refusal`) and closed as soon as the kernel named it (what it sent
  by then dropped unseen, so that the close is rarely a reset that could overtake the answer): it never holds
  one of the server's slots, so no number of them takes the person's (the server counts only what it was
  handed), and a crowd of them costs the kernel a request per batch, whatever the size of the socket table.
- Fails closed: a connection is handed over only once it was admitted; an answer that cannot be had, or a
  failure while judging, refuses it.
- A connection that sends no whole head in time, or a head over MOST_HEAD bytes, is closed (idle browser
  preconnections, a head a byte at a time).
- Once admitted, the server's own limits hold: its concurrency limit, its keep-alive timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
from collections.abc import Callable, Collection
from typing import Any, ClassVar

from vmsandbox.core.door.judge import judge

HEAD_TIMEOUT = 10.0  # seconds from connecting to a whole request head (the kernel's verdict included)
MOST_HEAD = 64 * 1024  # bytes of a request head
END_OF_HEAD = b"\r\n\r\n"
MOST_BACKLOG = 2048  # connections the kernel queues before they are accepted (uvicorn's default; with 4,096 the
# person waited behind a crowd's longer queue: 1.5 to 6.9 s at worst instead of about 1 s)
MOST_DESCRIPTORS = 65536  # the soft limit raised to this at most (never past the hard one)
RESERVE = 256  # descriptors kept for everything but connections (files, logs, the session's own)
TCP_ESTABLISHED, TCP_CLOSE_WAIT = 1, 8  # tcp_info's first byte
ACCEPTED_AT_ONCE = 3  # backlogs accepted before the first of them is judged (measured: 6,157 open of 2,048)


def room(slots: int) -> int:
    """The backlog a front end with `slots` connections at once may listen with, and descriptors enough for it.

    asyncio accepts up to the backlog each time the listener is ready, and the gate closes another account's
    only once they are judged: a few batches (ACCEPTED_AT_ONCE) are open at once. Past the free descriptors
    accept fails with EMFILE, which asyncio logs once per connection and then retries (a crowd of another
    account's 1,000 connections held the page's 1,024 descriptors and its every request failed). So the soft
    limit is raised (to the hard one, MOST_DESCRIPTORS at most) and the backlog is what fits under it that many
    times. (Descriptors past 1,023 are why nothing of vmsandbox waits with select(2): pids.readable.)"""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = MOST_DESCRIPTORS if hard == resource.RLIM_INFINITY else min(hard, MOST_DESCRIPTORS)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
    if soft == resource.RLIM_INFINITY:
        return MOST_BACKLOG
    return max(16, min(MOST_BACKLOG, (soft - slots - RESERVE) // ACCEPTED_AT_ONCE))


def _same_connection(sock: Any) -> bool:
    """Whether the connection the kernel was asked about is still the one it answered for. The kernel was asked
    by addresses: had this connection's client reset it before the answer, another connection could have taken
    the same addresses (the person's, to a port the other account guessed), and the answer be about that one. A
    TCP state never goes back: a socket still ESTABLISHED (or CLOSE_WAIT: its client half-closed) now held those
    addresses all along; anything else is refused."""
    if sock is None:
        return False
    if sock.family == socket.AF_UNIX:
        return True  # (SO_PEERCRED: read from this very socket)
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)
    except OSError:
        return False
    return bool(info) and info[0] in (TCP_ESTABLISHED, TCP_CLOSE_WAIT)


def _drop_what_waits(sock: Any) -> None:
    """What the client already sent, taken from the kernel and dropped unseen (at most MOST_HEAD bytes, never
    waited for): a socket closed with bytes unread is reset, and the reset can reach the client before the
    refusal written just before it, which it then never reads."""
    if sock is None:
        return
    with contextlib.suppress(OSError), sock.dup() as copy:
        dropped = 0
        while dropped < MOST_HEAD and (chunk := copy.recv(MOST_HEAD, socket.MSG_DONTWAIT)):
            dropped += len(chunk)


class Gate(asyncio.Protocol):
    """Stands before `inner` (the HTTP server's protocol, made with the arguments the server gave the gate) until
    the connection is the person's and its first request head is whole. A front end names `inner`, who the
    person is (`owners`) and what a refused connection is answered (`refusal`)."""

    inner: ClassVar[Callable[..., asyncio.Protocol]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._made = (args, kwargs)
        self._transport: asyncio.Transport | None = None
        self._head = bytearray()
        self._end = -1  # where the head ends in it, once seen
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
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(HEAD_TIMEOUT, self._late)  # (a verdict that never comes included)
        # nothing is read before the kernel said whose it is: paused once asyncio has added its reader, which
        # Python 3.11 adds after connection_made whatever a pause said (and before any read)
        loop.call_soon(self._pause_unless_admitted)
        try:
            judge.ask(transport.get_extra_info("socket"), self._judged)
        except Exception:  # (fails closed)
            self._refuse(None)
            raise

    def _pause_unless_admitted(self) -> None:
        if self._transport is not None and not self._transport.is_closing() and not self._admitted:
            self._transport.pause_reading()

    def _judged(self, uid: int | None) -> None:
        transport = self._transport
        if transport is None or transport.is_closing() or self._admitted:
            return  # (gone, or judged already: a verdict is given once)
        try:
            if uid is None or uid not in self.owners() or not _same_connection(transport.get_extra_info("socket")):
                self._refuse(uid if uid is not None and uid not in self.owners() else None)
                return
            self._admitted = True
            transport.resume_reading()
            self._read_on(transport)
        except Exception:  # (fails closed)
            self._admitted = False
            self._refuse(None)
            raise

    def _refuse(self, uid: int | None) -> None:
        self._stop_timer()
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(self.refusal(uid))
            _drop_what_waits(self._transport.get_extra_info("socket"))
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
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        self._head += data  # (an admitted connection's, or what came before the pause held: never handed over
        self._read_on(transport, len(self._head) - len(data))  # before the verdict)

    def _read_on(self, transport: asyncio.Transport, seen: int = 0) -> None:
        """A whole head of an admitted connection is handed over (with what followed it: a body); a head that
        grows past MOST_HEAD closes the connection; before the verdict, a whole head pauses reading."""
        if self._end < 0:
            found = self._head.find(END_OF_HEAD, max(0, seen - len(END_OF_HEAD) + 1), MOST_HEAD + len(END_OF_HEAD))
            self._end = found
        if self._end < 0 and len(self._head) > MOST_HEAD:
            self._stop_timer()
            transport.close()
        elif self._end >= 0 and self._admitted:
            self._hand_over(transport)
        elif self._end >= 0:
            transport.pause_reading()  # (nothing more is kept before the verdict)

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
