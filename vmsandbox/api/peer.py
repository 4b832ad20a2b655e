"""Only this account: a connection from another local account is answered 403 whatever it sends, key or not.

On the Unix socket the kernel says who connected (SO_PEERCRED). On 127.0.0.1 the kernel's socket table says it
too: the connecting socket is a row of /proc/net/tcp (its address, ours as the remote one) that names its owner.
A connection whose owner cannot be found is refused as well (fail closed). The check runs once, when the
connection is made; every request on a refused connection gets the refusal (`H11Protocol.app` is per connection).
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from pathlib import Path

from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from vmsandbox.api import guard
from vmsandbox.api.errors import ForbiddenError
from vmsandbox.errors import VmsandboxError

TCP_TABLE = Path("/proc/net/tcp")
UID_COLUMN = 7


def _hex_address(host: str, port: int) -> str:
    """An IPv4 address and port as /proc/net/tcp writes them: the address's 32 bits in host order, in hex."""
    (number,) = struct.unpack("=I", socket.inet_aton(host))
    return f"{number:08X}:{port:04X}"


def tcp_owner(client: tuple[str, int], server: tuple[str, int], table: str) -> int | None:
    """The uid owning the socket at `client` connected to `server`, from the text of /proc/net/tcp."""
    ours, theirs = _hex_address(*client), _hex_address(*server)
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
    if sock.family == socket.AF_INET:
        try:
            return tcp_owner(sock.getpeername(), sock.getsockname(), TCP_TABLE.read_text())
        except OSError:
            return None
    return None


def refusal(uid: int | None) -> VmsandboxError | None:
    if uid == os.geteuid():
        return None
    who = "an account that could not be found" if uid is None else f"uid {uid}"
    return ForbiddenError(
        f"a connection from {who}: this API serves only the account that runs `vmsandbox serve`",
        hint="run the client as the account that started `vmsandbox serve`, or start one as yours",
    )


class PeerCheckedH11(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, refusing every request of a connection from another account."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        refused = refusal(owner(sock) if sock is not None else None)
        if refused is not None:
            self.app = _Refuse(refused)


class _Refuse:
    def __init__(self, exc: VmsandboxError) -> None:
        self.exc = exc

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await guard.refuse(self.exc, send)
