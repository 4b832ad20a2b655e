"""Who may use the page: whoever holds the token printed by `vmsandbox ui`, through 127.0.0.1, from the page
itself.

- The token comes once in the URL (`/?token=…`); it is exchanged for an HttpOnly, SameSite=Strict cookie and the
  browser is sent to the same URL without it (it does not stay in the history or a Referer). Every request
  without the token — another local user, another program, a page of another site — gets 403.
- Host must be 127.0.0.1:PORT or localhost:PORT: a DNS-rebinding page (evil.example resolving to 127.0.0.1) is
  refused even before the token is looked at.
- A request that changes anything (POST) must come from the page: its Origin, where the browser sends one, must
  be this server; a form of another site is refused even with the cookie (SameSite would already keep it).
- Every answer forbids framing, sniffing, referrers to other sites and caching, and carries a Content Security
  Policy that runs no script but our own file and loads nothing from anywhere else.
"""

from __future__ import annotations

import hmac
from urllib.parse import urlencode

from starlette.datastructures import URL
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

COOKIE = "vmsandbox_ui"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",  # (no-referrer would make the page's own forms send `Origin: null`)
    "Cache-Control": "no-store",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}
SAFE_METHODS = frozenset({"GET", "HEAD"})


class Guard:
    """ASGI middleware: Host, token and Origin checked before the app sees a request; headers on every answer."""

    def __init__(self, app: ASGIApp, *, token: str, port: int) -> None:
        self.app = app
        self.token = token
        self.hosts = {f"127.0.0.1:{port}", f"localhost:{port}"}
        self.origins = {f"http://{h}" for h in self.hosts}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # a websocket: the page has none, and nothing unchecked gets through
            return
        request = Request(scope)
        response = self.refusal(request)
        if response is None and request.query_params.get("token") is not None:
            response = self.exchange(request)

        async def with_headers(message: dict[str, object]) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))  # type: ignore[call-overload]
                headers += [(k.lower().encode(), v.encode()) for k, v in HEADERS.items()]
                message = {**message, "headers": headers}
            await send(message)

        if response is not None:
            await response(scope, receive, with_headers)  # type: ignore[arg-type]
            return
        await self.app(scope, receive, with_headers)  # type: ignore[arg-type]

    def holds_token(self, request: Request) -> bool:
        given = request.query_params.get("token") or request.cookies.get(COOKIE) or ""
        return hmac.compare_digest(given.encode(), self.token.encode())

    def refusal(self, request: Request) -> Response | None:
        if request.headers.get("host") not in self.hosts:
            return PlainTextResponse("refused: this page answers on 127.0.0.1 only", status_code=403)
        if not self.holds_token(request):
            return PlainTextResponse("refused: open the URL `vmsandbox ui` printed (it holds the token)", 403)
        if request.method not in SAFE_METHODS:
            origin = request.headers.get("origin")
            if origin is not None and origin not in self.origins:
                return PlainTextResponse("refused: a request from another site", status_code=403)
            if request.headers.get("sec-fetch-site") not in (None, "same-origin", "none"):
                return PlainTextResponse("refused: a request from another site", status_code=403)
        return None

    def exchange(self, request: Request) -> Response:
        """The token in the URL for a cookie, and the same URL without it."""
        rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
        url = URL(path=request.url.path, query=urlencode(rest))
        response = RedirectResponse(str(url), status_code=303)
        response.set_cookie(COOKIE, self.token, httponly=True, samesite="strict", path="/")
        return response
