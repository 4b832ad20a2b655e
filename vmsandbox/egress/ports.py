"""Published ports: a guest port reachable on host addresses (loopback by default), carried by the egress
daemon over the session's SSH connection to the guest's own 127.0.0.1. One type from the command line to
the session record to the daemon."""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass, replace
from typing import Any

from vmsandbox.errors import VmsandboxError

LOOPBACKS = ("127.0.0.1", "::1")
_NO_IPV6 = (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT)


@dataclass(frozen=True)
class Publish:
    guest: int
    host: int | None = None  # None: a free port (chosen before boot)
    addresses: tuple[str, ...] = LOOPBACKS

    def as_dict(self) -> dict[str, Any]:
        return {"guest": self.guest, "host": self.host, "addresses": list(self.addresses)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Publish:
        return cls(int(data["guest"]), data.get("host"), tuple(data.get("addresses", LOOPBACKS)))

    def places(self) -> list[str]:
        """Where it answers: 127.0.0.1:PORT, [::1]:PORT."""
        return [place(a, self.host) for a in self.addresses]


def place(address: str, port: int | None) -> str:
    """address:port as people write it (IPv6 in brackets)."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def listener(address: str, port: int) -> socket.socket:
    """A listening TCP socket on address:port (IPv4 or IPv6, v6 only), as published ports use."""
    s = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if ":" in address:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        s.bind((address, port))
        s.listen(64)
    except BaseException:
        s.close()
        raise
    return s


def free_port(address: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def choose(wanted: tuple[Publish, ...]) -> tuple[Publish, ...]:
    """Host ports for --publish: the one asked for, or one free on every address; checked before boot. On a
    host without IPv6 loopback, the default publishes on 127.0.0.1 only."""
    chosen = []
    for p in wanted:
        port = p.host if p.host is not None else free_port()
        addresses = []
        for address in p.addresses:
            try:
                listener(address, port).close()
            except OSError as exc:
                if address == "::1" and p.addresses == LOOPBACKS and exc.errno in _NO_IPV6:
                    continue
                raise VmsandboxError(
                    f"--publish: cannot listen on {address} port {port}: {exc.strerror}",
                    hint="pick another host port (HOST_PORT:GUEST_PORT)",
                ) from None
            addresses.append(address)
        chosen.append(replace(p, host=port, addresses=tuple(addresses)))
    return tuple(chosen)
