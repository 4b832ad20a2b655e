"""Who may use the API: whoever holds the key `vmsandbox serve` printed, on this machine, not from a web page.

- Host must be 127.0.0.1:PORT or localhost:PORT (on a Unix socket: anything or nothing): a DNS-rebinding page
  (evil.example resolving to 127.0.0.1) is refused before the key is looked at.
- No CORS, and more: a request a browser marks as a page's (`Origin`, `Sec-Fetch-Site`) is refused, so no site
  can drive the API even with the key, and a preflight gets no grant.
- The control plane and the extension take the key in `X-API-Key` (E2B's header), compared in constant time.
  envd's side takes, per sandbox, the access token the control plane handed out for it (`X-Access-Token`, with
  `E2b-Sandbox-Id` naming the sandbox): an HMAC of the key, the sandbox's name and when that sandbox was made,
  so nothing is stored and a token is worth nothing to a later sandbox of the same name.
- A connection from another local account is refused before any of this (peer.py).
Every refusal is JSON with the fix; nothing it says depends on the key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable
from datetime import UTC, datetime

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from vmsandbox.api import errors
from vmsandbox.api.errors import ForbiddenError, UnauthenticatedError
from vmsandbox.api.threads import blocking
from vmsandbox.core.sandbox.interface import NotRunningError
from vmsandbox.core.sandbox.names import SessionName

ENVD_PATHS = ("/files", "/health")
ENVD_PREFIXES = ("/process.Process/", "/filesystem.Filesystem/")
KEY_HINT = "set E2B_API_KEY to the key `vmsandbox serve` printed (it changes each time serve starts)"


def is_envd(path: str) -> bool:
    return path in ENVD_PATHS or path.startswith(ENVD_PREFIXES)


class Keys:
    """The API key (in memory only) and the sandbox access tokens made from it. `born` says when the sandbox of a
    name was made (None: there is none; a blocking read, made in a worker thread)."""

    def __init__(self, api_key: str, born: Callable[[SessionName], datetime | None]) -> None:
        self._key = api_key.encode()
        self._born = born

    def envd_token(self, name: SessionName, born: datetime) -> str:
        """The access token of the sandbox `name` made at `born` (its started_at)."""
        made = born.astimezone(UTC).isoformat().encode()
        return hmac.new(self._key, b"envd:" + name.value.encode() + b"\0" + made, hashlib.sha256).hexdigest()

    def check_api_key(self, headers: Headers) -> None:
        given = headers.get("x-api-key")
        if given is None:
            raise UnauthenticatedError("no API key (X-API-Key)", hint=KEY_HINT)
        if not hmac.compare_digest(given.encode(), self._key):
            raise UnauthenticatedError("not the API key of this `vmsandbox serve`", hint=KEY_HINT)

    async def check_envd(self, headers: Headers) -> SessionName:
        """The sandbox a request to envd's side is for, once its access token is the one handed out for it (for
        this sandbox, not an earlier one of its name)."""
        given = headers.get("e2b-sandbox-id")
        if not given:
            raise UnauthenticatedError(
                "no sandbox named (E2b-Sandbox-Id)", hint="set E2B_SANDBOX_URL to the URL `vmsandbox serve` printed"
            )
        name = SessionName(given)
        born = await blocking(self._born, name)
        if born is None:
            raise NotRunningError(f"no sandbox {name.value}", hint="make one with Sandbox.create")
        token = headers.get("x-access-token", "")
        if not hmac.compare_digest(token.encode(), self.envd_token(name, born).encode()):
            raise UnauthenticatedError(
                f"no access token for sandbox {name} (X-Access-Token)",
                hint="get the sandbox from Sandbox.create or Sandbox.connect, which hand out its token",
            )
        return name


class Guard:
    """ASGI middleware: where a request comes from, and the API key where one is due, before the app sees it."""

    def __init__(self, app: ASGIApp, *, keys: Keys, port: int) -> None:
        self.app = app
        self.keys = keys
        self.hosts = {f"127.0.0.1:{port}", f"localhost:{port}"}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # a websocket: nothing here speaks one
            return
        try:
            self.check(scope)
        except (ForbiddenError, UnauthenticatedError) as exc:
            await refuse(exc, send)
            return
        await self.app(scope, receive, send)

    def check(self, scope: Scope) -> None:
        headers = Headers(scope=scope)
        server = scope.get("server")
        on_unix_socket = server is not None and server[1] is None  # (uvicorn: the socket's path, no port)
        if not on_unix_socket and headers.get("host") not in self.hosts:
            raise ForbiddenError("this API answers on 127.0.0.1 only", hint="use the URL `vmsandbox serve` printed")
        if "origin" in headers or headers.get("sec-fetch-site") not in (None, "none"):
            raise ForbiddenError("a request from a web page", hint="drive the API from a program, not from a browser")
        if not is_envd(scope["path"]):
            self.keys.check_api_key(headers)


async def refuse(exc: Exception, send: Send) -> None:
    found = errors.problem(exc)
    body = json.dumps(errors.control_body(found)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": found.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
