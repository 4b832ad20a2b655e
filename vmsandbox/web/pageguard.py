"""Who may use the page: the person `vmsandbox ui` opened it for, in their browser, from the page itself.

- **Its own loopback address.** The page listens on an address of 127.0.0.0/8 drawn at random for each run
  (`127.a.b.c`), not on 127.0.0.1, where the guests' published ports are. A browser keeps cookies per host, not
  per port, and counts every port of one host as the same site: a cookie of 127.0.0.1 would go with every
  request to a page a guest serves there, and SameSite would not hold back a request that page makes. On an
  address of its own, the cookie goes nowhere else and every other page is another site.
- **A secret that never leaves the process.** The cookie's value is never printed, never on a command line,
  never in a URL. A URL carries a *ticket* instead, which works once: it is exchanged for the HttpOnly,
  SameSite=Strict cookie, and the page sends the browser on to the same URL without it. The browser is never handed a
  ticket on its command line (every local account reads those in /proc): it is opened on a file only this
  account can read, which sends it on (server.py).
- **Host** must be this address and port: a DNS-rebinding page (evil.example resolving here) is refused before
  anything else.
- **From the page only.** A browser says where a request comes from (`Sec-Fetch-Site`, which no page can
  forge): anything but the page itself or the person typing the URL is refused, a GET included, so a page
  of another site (a guest's) reads nothing, changes nothing and starts nothing, not even a fetch from a
  guest. A request that changes something must also carry the page's Origin. The cookie is what keeps out
  a program that is not a browser (it can send any header it likes): nothing but this process and the
  person's browser ever holds it.
- **A ticket is spent** when the browser comes back with the cookie it was exchanged for (the page the exchange
  answers sends it straight on), and with it every other ticket given out with it (the printed URL and the
  launcher's: one opens the page, the other then opens nothing), and every other cookie handed out for one; an
  unused one expires after TICKET_SECONDS. An exchange whose answer never reached a browser (a request that
  waited until the browser gave up) spends nothing: the same URL opens the page when it is tried again.
- **Only the person's account.** The page is served behind the core's gate (core/door): a connection from any
  other account is refused as it is made, holds none of the server's slots, and never sees a head timeout's
  worth of the page's time; the cookie a browser would send to another port of this address (browsers keep
  cookies per host) is of no use to an account the page refuses.
- Every answer forbids framing, sniffing, referrers to other sites and caching, and carries a Content Security
  Policy that runs no script but our own file and loads nothing from anywhere else.
"""

from __future__ import annotations

import hmac
import html
import secrets
import time
from collections.abc import Callable
from urllib.parse import urlencode

from starlette.datastructures import URL
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
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
TICKET_SECONDS = 600.0
FROM_THE_PAGE = frozenset({"same-origin", "none"})  # Sec-Fetch-Site: the page itself, or the person
MOST_TICKETS = 64


def loopback_address() -> str:
    """An address of 127.0.0.0/8 of its own for one run of the page (never 127.0.0.x, where other servers and
    the guests' published ports are)."""
    return f"127.{secrets.randbelow(254) + 1}.{secrets.randbelow(256)}.{secrets.randbelow(254) + 1}"


class Guard:
    """ASGI middleware: Host, where the request comes from, the ticket or the cookie, and Origin checked before
    the app sees a request; headers on every answer. `on_exchange(ticket)` is called when a ticket is used."""

    def __init__(
        self, app: ASGIApp, *, address: str, port: int, on_exchange: Callable[[str], None] | None = None
    ) -> None:
        self.app = app
        self.host = f"{address}:{port}"
        self.origin = f"http://{self.host}"
        self.cookie = f"{COOKIE}_{port}"  # (the port in its name: two pages of one address never mix theirs)
        self._held: list[str] = []  # the cookie's values browsers came back with; nothing else's
        self._pending: dict[str, float] = {}  # values handed out for a ticket, not yet come back -> expiry
        self._tickets: dict[str, float] = {}  # ticket -> when it expires (time.monotonic)
        self._on_exchange = on_exchange

    def ticket(self) -> str:
        """A new ticket: a URL that carries it works once."""
        if len(self._tickets) >= MOST_TICKETS:
            self._tickets.clear()
        found = secrets.token_urlsafe(24)
        self._tickets[found] = time.monotonic() + TICKET_SECONDS
        return found

    def url(self, path: str = "/") -> str:
        """The page at `path`, for a person: with a new ticket."""
        joint = "&" if "?" in path else "?"
        return f"{self.origin}{path}{joint}{urlencode({'ticket': self.ticket()})}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # a websocket: the page has none, and nothing unchecked gets through
            return
        request = Request(scope)
        response = self.refusal(request)

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

    def holds_cookie(self, request: Request) -> bool:
        """Whether the request carries the page's cookie. The first request that comes back with a value handed
        out for a ticket makes it the page's: every ticket and every other value handed out is spent then."""
        given = (request.cookies.get(self.cookie) or "").encode()
        if not given:
            return False
        if any(hmac.compare_digest(given, v.encode()) for v in self._held):
            return True
        now = time.monotonic()
        found = next((v for v in self._pending if hmac.compare_digest(given, v.encode())), None)
        if found is None or self._pending[found] < now:
            return False
        self._held.append(found)
        self._pending.clear()
        spent = list(self._tickets)
        self._tickets.clear()  # the others given out with it are spent too
        if self._on_exchange is not None:
            for ticket in spent:
                self._on_exchange(ticket)
        return True

    def refusal(self, request: Request) -> Response | None:
        """Why the request is refused (an answer), the ticket's exchange, or None: the app answers."""
        if request.headers.get("host") != self.host:
            return _refused("this page answers at its own address only")
        if "ticket" in request.query_params and request.method in SAFE_METHODS:
            if request.headers.get("sec-fetch-mode", "navigate") != "navigate":
                return _refused("a ticket is for opening the page")
            return self.exchange(request)  # (from the launcher file: a navigation no page can make without one)
        site = request.headers.get("sec-fetch-site")
        why = None
        if site is not None and site not in FROM_THE_PAGE:
            why = "a request from another page"
        elif not self.holds_cookie(request):
            why = "open the URL `vmsandbox ui` printed (each works once)"
        elif request.method not in SAFE_METHODS and (
            request.headers.get("origin") != self.origin or site not in (None, "same-origin")
        ):
            why = "a change must come from the page itself"
        return None if why is None else _refused(why)

    def exchange(self, request: Request) -> Response:
        """A ticket for a cookie, and the same URL without the ticket. Nothing is spent until the browser comes
        back with the cookie (holds_cookie): an answer that never reached one leaves the ticket as it was."""
        given = request.query_params["ticket"]
        now = time.monotonic()
        found = next((t for t in self._tickets if hmac.compare_digest(t.encode(), given.encode())), None)
        if found is None or self._tickets[found] < now:
            return _refused("this link was used already or expired (each works once); `vmsandbox ui` prints a new one")
        if len(self._pending) >= MOST_TICKETS:
            self._pending.clear()
        value = secrets.token_urlsafe(32)
        self._pending[value] = self._tickets[found]
        rest = [(k, v) for k, v in request.query_params.multi_items() if k != "ticket"]
        path = "/" + request.url.path.lstrip("/")  # `//evil.example/…` would be another site's address
        target = str(URL(path=path, query=urlencode(rest)))
        # Not a redirect: a browser carries the most foreign Sec-Fetch-Site of a redirect chain on (the launcher
        # file's), while a navigation this page starts is its own (same-origin).
        response = HTMLResponse(
            f'<!doctype html><meta http-equiv="refresh" content="0;url={html.escape(target)}">'
            f'<p><a href="{html.escape(target)}">Continue</a></p>'
        )
        response.set_cookie(self.cookie, value, httponly=True, samesite="strict", path="/")
        return response


def _refused(why: str) -> Response:
    return PlainTextResponse(f"refused: {why}", status_code=403)
