"""A daemon's published ports: it listens on host addresses (loopback by default) and carries each connection to
the guest's 127.0.0.1:PORT over the daemon's SSH link, through its ports pump (at most `capacity` at once, the
others closed at once)."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable

from vmsandbox.egress import ports
from vmsandbox.egress.door.pump import Pump
from vmsandbox.egress.ports import Publish
from vmsandbox.guest import channel

log = logging.getLogger("vmsandbox.egress.daemon")

Key = tuple[str, int, int]  # (host address, host port, guest port)


class Published:
    """The listeners of one daemon; they change in the loop's thread (SIGUSR1) and are reported in others."""

    def __init__(self, link: Callable[[], channel.Link | None], stop: threading.Event) -> None:
        self._link = link
        self._stop = stop
        self.listeners: dict[Key, socket.socket] = {}
        self.lock = threading.Lock()
        self.pump: Pump | None = None  # set when the daemon runs

    def places(self) -> tuple[str, ...]:
        with self.lock:
            return tuple(ports.place(address, host) for address, host, _ in self.listeners)

    def open(self, publish: tuple[Publish, ...], *, start: bool = True) -> None:
        """Listen where `publish` says and nowhere else (listeners no longer in it are closed); before the daemon
        runs (`start` False) a port that cannot be had is an error, later a warning."""
        wanted = {(a, p.host or 0, p.guest) for p in publish for a in p.addresses}
        with self.lock:
            for key in [k for k in self.listeners if k not in wanted]:
                self.listeners.pop(key).close()  # its accept loop ends; connections it carries go on
            for key in sorted(wanted - self.listeners.keys()):
                try:
                    self.listeners[key] = ports.listener(key[0], key[1])
                except OSError as exc:
                    if not start:
                        raise
                    log.warning("cannot publish guest port %d on %s:%d: %s", key[2], key[0], key[1], exc)
                    continue
                if start:
                    self._serve(self.listeners[key], key[2])

    def start(self) -> None:
        with self.lock:
            for (_, _, guest_port), listener in self.listeners.items():
                self._serve(listener, guest_port)

    def _serve(self, listener: socket.socket, guest_port: int) -> None:
        threading.Thread(target=self.accept, args=(listener, guest_port), daemon=True).start()

    def accept(self, listener: socket.socket, guest_port: int) -> None:
        """Accept on a host address and carry each connection to the guest's 127.0.0.1:guest_port."""
        listener.settimeout(1)
        while not self._stop.is_set():
            try:
                conn, peer = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._carry(conn, peer, guest_port)

    def _carry(self, conn: socket.socket, peer: tuple[str, int], guest_port: int) -> None:
        link, pump = self._link(), self.pump
        if link is None or pump is None:
            log.info("published port %d: no connection to the guest yet", guest_port)
            conn.close()
            return
        if pump.count >= pump.capacity:  # (checked again by add: this only spares the guest a channel)
            conn.close()
            return
        try:
            ch = link.open_direct(guest_port, (str(peer[0]), int(peer[1])))
        except channel.LinkError as exc:
            log.info("published port %d: %s", guest_port, exc)
            conn.close()
            return
        if not pump.add(ch, conn, half_close=True):
            ch.close()
            conn.close()
