"""Bytes between SSH channels and local sockets for one daemon: one thread for every connection, none that waits.

Each guest connection (a channel) is paired with a socket (the proxy's end of a socket pair, or a published
port's client). One thread moves the bytes of every pair with non-blocking calls only, so what a pair costs is
fixed and small whatever its peers do: two buffers of at most CHUNK bytes, its socket, and a slot of
`capacity`. A channel has no descriptor: paramiko's thread tells the pump when something arrives on it
(Channel.watch). A pair ends when both sides have ended, or when a side takes no byte of what waits for it for
`send_timeout` seconds (a guest that shut its window, a client that does not read), or when nothing moves
either way for `idle_timeout`. A shut window has nothing to wait on either: while one is, the thread looks
again every POLL seconds.

The thread notes when it last came round (`beat`): the only calls that can hold it are paramiko's writes to a
link whose guest stopped reading its SSH connection, and the daemon closes such a link when the beat is late,
which ends those calls.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable

from vmsandbox.guest.channel import CHUNK, Channel, LinkError

log = logging.getLogger(__name__)

POLL = 0.05  # while a channel's window is shut, how often it is looked at again
TICK = 1.0  # the longest the thread waits for an event
SWEEP = 0.25  # every pair's deadlines and window are checked this often (at most)


class Pair:
    """One channel and its socket."""

    def __init__(self, ch: Channel, sock: socket.socket, *, half_close: bool, now: float) -> None:
        sock.setblocking(False)
        self.ch, self.sock = ch, sock
        self.half_close = half_close  # the socket's side may end its sending and still read (a host client)
        self.to_sock, self.to_ch = bytearray(), bytearray()
        self.ch_eof = self.sock_eof = False  # each side's end, read
        self.sock_shut = self.ch_shut = False  # each side told of the other's end
        self.moved = now  # the last time a byte moved
        self.waiting: float | None = None  # since when bytes wait for a side that takes none
        self.failed: str | None = None
        self.interest = 0  # the socket's events asked of the selector

    @property
    def done(self) -> bool:
        if self.failed is not None:
            return True
        if self.ch_eof and self.sock_shut and self.sock_eof and self.ch_shut:
            return True
        # the proxy's side ended: it reads nothing more, so nothing the guest sends can go anywhere
        return not self.half_close and self.sock_eof and self.ch_shut

    @property
    def window_shut(self) -> bool:
        return bool(self.to_ch) and not self.ch.writable

    @property
    def more(self) -> bool:
        """Something could move now without an event to tell of it: the channel holds more than this step took
        (and there is room for it), or bytes for the channel wait and its window is open."""
        inbound = not self.ch_eof and len(self.to_sock) < CHUNK and self.ch.readable
        return inbound or (bool(self.to_ch) and self.ch.writable)

    def step(self, now: float) -> None:
        """Move what can move now, both ways, without waiting."""
        try:
            got, sent = self._to_socket()
            got2, sent2 = self._to_channel()
        except (OSError, LinkError) as exc:
            self.failed = f"{type(exc).__name__}: {exc}"
            return
        if got or got2 or sent or sent2:
            self.moved = now
        if not (self.to_ch or self.to_sock):
            self.waiting = None
        elif sent or sent2 or self.waiting is None:
            self.waiting = now

    def _to_socket(self) -> tuple[int, int]:
        got = sent = 0
        if not self.ch_eof and len(self.to_sock) < CHUNK:
            data = self.ch.read(CHUNK - len(self.to_sock))
            if data == b"":
                self.ch_eof = True
            elif data:
                self.to_sock += data
                got = len(data)
        if self.to_sock:
            try:
                sent = self.sock.send(self.to_sock)
            except BlockingIOError:
                sent = 0
            except (BrokenPipeError, ConnectionResetError):  # its reader is gone: the other way may go on
                self.to_sock.clear()
                self.ch_eof = self.sock_shut = True
            del self.to_sock[:sent]
        if self.ch_eof and not self.to_sock and not self.sock_shut:
            self.sock_shut = True
            self.sock.shutdown(socket.SHUT_WR)
        return got, sent

    def _to_channel(self) -> tuple[int, int]:
        got = 0
        if not self.sock_eof and len(self.to_ch) < CHUNK:
            try:
                data = self.sock.recv(CHUNK - len(self.to_ch))
            except BlockingIOError:
                data = None
            except ConnectionResetError:  # its end closed with bytes unread: what it sent was read before
                data = b""
            if data == b"":
                self.sock_eof = True
            elif data:
                self.to_ch += data
                got = len(data)
        sent = 0
        while self.to_ch:  # paramiko sends one packet a call (at most 32 KiB): as many as the window takes
            took = self.ch.write(bytes(self.to_ch))
            if not took:
                break
            del self.to_ch[:took]
            sent += took
        if self.sock_eof and not self.to_ch and not self.ch_shut:
            self.ch_shut = True
            self.ch.end()
        return got, sent

    def expired(self, now: float, send_timeout: float, idle_timeout: float) -> bool:
        waited = self.waiting is not None and now - self.waiting > send_timeout
        return waited or now - self.moved > idle_timeout

    def wanted(self) -> int:
        read = selectors.EVENT_READ if not self.sock_eof and len(self.to_ch) < CHUNK else 0
        return read | (selectors.EVENT_WRITE if self.to_sock else 0)

    def close(self) -> None:
        self.ch.close()
        self.sock.close()


class Pump:
    """The pairs of one kind (the guest's door, or the published ports) of one daemon: at most `capacity`."""

    def __init__(
        self,
        name: str,
        capacity: int,
        *,
        send_timeout: float,
        idle_timeout: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name, self.capacity = name, capacity
        self.send_timeout, self.idle_timeout = send_timeout, idle_timeout
        self._clock = clock
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._new: list[Pair] = []
        self._arrived: set[Pair] = set()  # channels something arrived on (paramiko's thread adds to it)
        self._count = 0  # pairs taken and not yet closed (read in any thread)
        self._pairs: set[Pair] = set()  # the pump thread's own
        self._shut: set[Pair] = set()  # of them, those with bytes for a channel whose window is shut
        self._again: set[Pair] = set()  # those whose channel holds more than one step took
        self._swept = clock()
        self._stop = False
        self.beat = clock()
        self._thread = threading.Thread(target=self._run, name=f"pump-{name}", daemon=True)
        self._thread.start()

    @property
    def count(self) -> int:
        return self._count

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stalled(self, now: float | None = None) -> float:
        """How long the pump thread has been away (in one call) since it last came round."""
        return (self._clock() if now is None else now) - self.beat

    def add(self, ch: Channel, sock: socket.socket, *, half_close: bool = False) -> bool:
        """Take a pair (it is the pump's to close from now on); False, taking nothing, when `capacity` are open."""
        with self._lock:
            if self._stop or self._count >= self.capacity:
                return False
            self._count += 1
            pair = Pair(ch, sock, half_close=half_close, now=self._clock())
            self._new.append(pair)
        ch.watch(lambda: self._notify(pair))
        self._wake()
        return True

    def _notify(self, pair: Pair) -> None:
        with self._lock:
            first = not self._arrived
            self._arrived.add(pair)
        if first:
            self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # (full: it wakes anyway)
            self._wake_w.send(b"\0")

    def close(self) -> None:
        """End every pair and the thread."""
        with self._lock:
            self._stop = True
        self._wake()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        try:
            while not self._stop:
                self._round()
        except Exception:  # a fault of ours: every pair ends (and is counted out) rather than hang
            log.exception("the %s pump failed", self.name)
        finally:
            with self._lock:
                self._stop = True  # it takes no more
            for pair in [*self._pairs, *self._new]:
                self._drop(pair)
            self._sel.close()
            self._wake_r.close()
            self._wake_w.close()

    def _round(self) -> None:
        self.beat = self._clock()
        timeout = 0 if self._again else POLL if self._shut else TICK
        ready = {key.data for key, _ in self._sel.select(timeout) if key.data is not None}
        with contextlib.suppress(OSError):
            while self._wake_r.recv(4096):
                pass
        with self._lock:
            new, self._new = self._new, []
            arrived, self._arrived = self._arrived, set()
        self._pairs.update(new)
        now = self.beat = self._clock()
        for pair in (ready | arrived | set(new) | self._shut | self._again) & self._pairs:
            pair.step(now)
            if pair.done:
                self._drop(pair)
            else:
                self._watch(pair)
        if now - self._swept >= SWEEP:  # deadlines, and guests past their window, of every pair
            self._swept = now
            for pair in list(self._pairs):
                try:
                    pair.ch.check()
                except LinkError as exc:
                    pair.failed = str(exc)
                if pair.failed or pair.expired(now, self.send_timeout, self.idle_timeout):
                    self._drop(pair)

    def _watch(self, pair: Pair) -> None:
        wanted = pair.wanted()
        if wanted != pair.interest:
            if not pair.interest:
                self._sel.register(pair.sock, wanted, pair)
            elif not wanted:
                self._sel.unregister(pair.sock)
            else:
                self._sel.modify(pair.sock, wanted, pair)
            pair.interest = wanted
        for flagged, into in ((pair.window_shut, self._shut), (pair.more, self._again)):
            if flagged:
                into.add(pair)
            else:
                into.discard(pair)

    def _drop(self, pair: Pair) -> None:
        if pair.interest:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._sel.unregister(pair.sock)
        pair.interest = 0
        self._pairs.discard(pair)
        self._shut.discard(pair)
        self._again.discard(pair)
        pair.close()
        with self._lock:
            self._count -= 1
