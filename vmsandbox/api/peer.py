"""Only this account: a connection from another local account is answered 403 whatever it sends, key or not.

On the Unix socket the kernel says who connected (SO_PEERCRED). On 127.0.0.1 the kernel's socket table says it
too: the connecting socket is a row of /proc/net/tcp (its address, ours as the remote one) that names its owner.
A connection whose owner cannot be found is refused as well (fail closed). The check runs once, when the
connection is made, and a refused one is answered and closed then.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
from pathlib import Path

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from vmsandbox.api import errors
from vmsandbox.api.errors import ForbiddenError
from vmsandbox.errors import VmsandboxError

TCP_TABLES = {socket.AF_INET: Path("/proc/net/tcp"), socket.AF_INET6: Path("/proc/net/tcp6")}
UID_COLUMN = 7


def _hex_address(host: str, port: int) -> str:
    """An address and port as /proc/net/tcp (and tcp6) write them: each 32 bits of the address in host order,
    in hex."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    packed = socket.inet_pton(family, host)
    words = struct.unpack(f"={len(packed) // 4}I", packed)
    return "".join(f"{w:08X}" for w in words) + f":{port:04X}"


def tcp_owner(client: tuple[str, int], server: tuple[str, int], table: str) -> int | None:
    """The uid owning the socket at `client` connected to `server`, from the text of /proc/net/tcp(6)."""
    ours, theirs = _hex_address(*client[:2]), _hex_address(*server[:2])
    for line in table.splitlines()[1:]:
        columns = line.split()
        if len(columns) > UID_COLUMN and columns[1] == ours and columns[2] == theirs:
            return int(columns[UID_COLUMN])
    return None


def owner(sock: socket.socket) -> int | None:
    """Who is at the other end of an accepted connection."""
    if sock.family == socket.AF_UNIX:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        return int(uid)
    table = TCP_TABLES.get(sock.family)
    if table is None:
        return None
    try:
        return tcp_owner(sock.getpeername(), sock.getsockname(), table.read_text())
    except OSError:
        return None


OWNER = os.geteuid()  # the account served, as it was when serve started (it never changes while it serves)
HEAD_TIMEOUT = 10.0  # seconds a connection has to send a request's whole head


def refusal(uid: int | None) -> VmsandboxError | None:
    if uid == OWNER:
        return None
    who = "an account that could not be found" if uid is None else f"uid {uid}"
    return ForbiddenError(
        f"a connection from {who}: this API serves only the account that runs `vmsandbox serve`",
        hint="run the client as the account that started `vmsandbox serve`, or start one as yours",
    )


def refused_response(exc: VmsandboxError) -> bytes:
    """The whole answer to a refused connection, written at once: it is not read, nor held open."""
    found = errors.problem(exc)
    body = json.dumps(errors.control_body(found)).encode()
    head = f"HTTP/1.1 {found.status} Forbidden\r\ncontent-type: application/json\r\n"
    head += f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    return head.encode() + body


class PeerCheckedH11(H11Protocol):
    """uvicorn's HTTP/1.1 protocol: a connection from another account is answered 403 and closed as it is made
    (nothing of it is read, it holds nothing); any connection gets HEAD_TIMEOUT seconds for each request's head
    (one that sends nothing, or a head a byte at a time, is closed)."""

    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        refused = refusal(owner(sock) if sock is not None else None)
        if refused is not None:
            transport.write(refused_response(refused))
            transport.close()
            return
        self._arm()

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(HEAD_TIMEOUT, self._head_late)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm()  # (a whole head came: the request runs as long as it runs)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()  # the next request's head has its own time

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)
