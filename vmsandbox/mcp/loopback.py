"""`vmsandbox mcp --http`: the MCP server over streamable HTTP on 127.0.0.1, for the clients that connect rather than
start a server, under `vmsandbox serve`'s rules:

- only the account that started it: the core's gate (core/door/gate.py) stands before the HTTP server, and a
  connection whose other end the kernel does not name as this account is answered 403 and closed before anything
  of it is read (another account's crowd holds none of its slots);
- only with the key it printed, in `Authorization: Bearer KEY`, compared in constant time; a new key each start;
- only from a program: Host must be 127.0.0.1:PORT or localhost:PORT (a DNS-rebinding page is refused before the
  key is looked at), and a request a browser marks as a page's (`Origin`, `Sec-Fetch-Site`) is refused;
- never as root nor under sudo, for `vmsandbox serve`'s reasons (refuse_root).
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import socket
from collections.abc import Callable, Collection

from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from vmsandbox import sudo
from vmsandbox.core.door import gate
from vmsandbox.errors import VmsandboxError

OWNER = os.geteuid()
PATH = "/mcp"
LIMIT_CONNECTIONS = 64
AS_YOURSELF = "run `vmsandbox mcp --http` as your own account, a member of the libvirt group"


def refuse_root() -> None:
    """As `vmsandbox serve`: a key root handed out would drive sessions as root, and under sudo the process switches
    accounts for file work while it serves."""
    who = sudo.invoker()
    if who is not None:
        raise VmsandboxError(f"`vmsandbox mcp --http` runs as the account it serves, not under sudo (you are "
                             f"{who.pw_name})", hint=AS_YOURSELF)  # fmt: skip
    if os.geteuid() == 0:
        raise VmsandboxError("`vmsandbox mcp --http` does not run as root: it serves one account", hint=AS_YOURSELF)


def _answer(status: int, reason: str, said: dict[str, str]) -> bytes:
    body = json.dumps(said).encode()
    head = f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
    return f"{head}connection: close\r\n\r\n".encode() + body


class OwnerOnly(gate.Gate):
    """uvicorn's HTTP/1.1 protocol behind the core's gate: this account's connections only."""

    inner = H11Protocol

    def owners(self) -> Collection[int]:
        return (OWNER,)

    def refusal(self, uid: int | None) -> bytes:
        who = "an account that could not be found" if uid is None else f"uid {uid}"
        return _answer(403, "Forbidden", {
            "error": f"a connection from {who}: this MCP server serves only the account that started it",
            "hint": "connect as the account that runs `vmsandbox mcp --http`, or start one as yours",
        })  # fmt: skip


class KeyGuard:
    """ASGI middleware: where a request comes from, and the key, before the MCP app sees it."""

    def __init__(self, app: ASGIApp, *, key: str, port: int) -> None:
        self.app, self.key, self.hosts = app, key.encode(), {f"127.0.0.1:{port}", f"localhost:{port}"}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":
            return
        why = self.refused(Headers(scope=scope))
        if why is not None:
            status, said, hint = why
            body = json.dumps({"error": said, "hint": hint}).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            if status == 401:
                headers.append((b"www-authenticate", b"Bearer"))
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)

    def refused(self, headers: Headers) -> tuple[int, str, str] | None:
        if headers.get("host") not in self.hosts:
            return 403, "this MCP server answers on 127.0.0.1 only", "use the URL `vmsandbox mcp --http` printed"
        if "origin" in headers or headers.get("sec-fetch-site") not in (None, "none"):
            return 403, "a request from a web page", "connect from an MCP client, not from a browser"
        scheme, _, given = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self.key):
            return (
                401,
                "no key, or not this server's (Authorization: Bearer KEY)",
                ("use the header `vmsandbox mcp --http` printed (the key is new each time it starts)"),
            )
        return None


def listen(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError as exc:
        sock.close()
        raise VmsandboxError(f"cannot listen on 127.0.0.1:{port}: {exc.strerror}",
                             hint="choose another --port, or leave it out for a free one") from exc  # fmt: skip
    return sock


def serve(server: MCPServer, *, port: int, ready: Callable[[str, str], None]) -> None:
    """Serve until interrupted; `ready` gets the URL and the key once the socket listens."""
    import uvicorn

    refuse_root()
    sock = listen(port)
    bound = sock.getsockname()[1]
    key = secrets.token_urlsafe(32)
    hosts = [f"127.0.0.1:{bound}", f"localhost:{bound}"]
    security = TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=[])
    app = KeyGuard(server.streamable_http_app(streamable_http_path=PATH, transport_security=security), key=key,
                   port=bound)  # fmt: skip
    try:
        ready(f"http://127.0.0.1:{bound}{PATH}", key)
        config = uvicorn.Config(
            app, http=OwnerOnly, log_level="warning", access_log=False, log_config=None, lifespan="on",
            limit_concurrency=LIMIT_CONNECTIONS, backlog=gate.room(LIMIT_CONNECTIONS), timeout_graceful_shutdown=5,
        )  # fmt: skip
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
