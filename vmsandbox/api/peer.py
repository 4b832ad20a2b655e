"""Only this account: a connection from another local account is answered 403 whatever it sends, key or not, and
holds none of serve's slots.

The core's gate (core/door/gate.py) stands before uvicorn's HTTP/1.1 protocol: the kernel says who holds the
other end (SO_PEERCRED on the Unix socket; on loopback the one socket at that 4-tuple, asked for over sock_diag in
a thread, never by reading the socket table on the event loop); a connection whose holder cannot be named (a
TIME_WAIT or closed socket, nothing there) is refused as well (fail closed). A refused one is answered and closed
as it is made; an admitted one has gate.HEAD_TIMEOUT seconds for its first request head, then uvicorn's own limits.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection

from uvicorn.protocols.http.h11_impl import H11Protocol

from vmsandbox.api import errors
from vmsandbox.api.errors import ForbiddenError
from vmsandbox.core.door import gate
from vmsandbox.errors import VmsandboxError

OWNER = os.geteuid()  # the account served, as it was when serve started (it never changes while it serves)


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


class PeerCheckedH11(gate.Gate):
    """uvicorn's HTTP/1.1 protocol behind the gate: this account's connections only, each with gate.HEAD_TIMEOUT
    seconds for its first request head (uvicorn's keep-alive timeout for the ones after)."""

    inner = H11Protocol

    def owners(self) -> Collection[int]:
        return (OWNER,)

    def refusal(self, uid: int | None) -> bytes:
        return refused_response(refusal(uid) or ForbiddenError("refused", hint="use the account that runs serve"))
