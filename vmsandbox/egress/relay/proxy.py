"""The host-side egress proxy of one session (asyncio, no third-party code in the data path).

Why our own: the policy has to see every decision point (CONNECT target, TLS SNI, Host header, the resolved
addresses), secrets are injected only after the upstream certificate is verified, and the whole data path
is a few hundred lines we can read. mitmproxy would bring a large dependency tree into a root-run daemon
for features we would have to turn off.

Each connection from the guest is one request: HTTP CONNECT (passed through after checking the SNI, or
terminated with the session CA for hosts that get a secret injected) or plain HTTP in absolute form. Its body
goes upstream as its head frames it and nothing after it does (body.py). Every connection, whatever bytes it
sends, ends in an answer or a refusal (an error nobody foresaw is a 400 like a parser's) and in one JSON line in
the session's proxy log, and counts against the limit until it is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from vmsandbox.egress.policy import ProxyConfig, SecretRule
from vmsandbox.egress.proxylog import Event, Writer, append
from vmsandbox.egress.relay.body import relay
from vmsandbox.egress.relay.certs import Issuer
from vmsandbox.egress.relay.streams import Stream, TlsStream, read_head, read_hello
from vmsandbox.egress.relay.upstream import Resolver, Upstream, connect, resolve_checked, verified_tls
from vmsandbox.egress.rules import httphead, inject, tlshello
from vmsandbox.egress.rules.httphead import ProtocolError, RequestHead
from vmsandbox.egress.rules.limits import Limits
from vmsandbox.egress.rules.netpolicy import Refused, parse_target
from vmsandbox.errors import VmsandboxError

log = logging.getLogger(__name__)


class Proxy:
    """Serves guest connections: `await proxy.handle(reader, writer)` per connection."""

    def __init__(
        self,
        load_config: Callable[[], ProxyConfig],
        log_file: Path | Writer,
        read_secret: Callable[[str], str | None],
        issuer: Callable[[], Issuer | None],
        *,
        resolver: Resolver = resolve_checked,
        upstream_tls: Callable[[], ssl.SSLContext] = verified_tls,
        limits: Limits = Limits(),  # noqa: B008 - frozen
    ) -> None:
        self._load_config = load_config
        self._log_file = log_file
        self._read_secret = read_secret
        self._issuer = issuer
        self._resolver = resolver  # a test gives its own (stand-ins on loopback); the product never does
        self._upstream_tls = upstream_tls
        self.limits = limits
        self.active = 0  # connections not yet closed
        self._told: set[str] = set()  # kinds of unforeseen error already written to the daemon's log

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        client = Stream(reader, writer, send_timeout=self.limits.send_timeout)
        ev = Event()
        self.active += 1
        try:
            if self.active > self.limits.connections:
                ev.decision, ev.reason = "deny", f"too many connections (limit {self.limits.connections})"
                await self._answer(client, 503, "Service Unavailable", ev.reason)
            else:
                await self._serve(client, ev)
        except Exception as exc:  # noqa: BLE001 - a fault in the refusal itself: the line and the close still come
            self._unforeseen(exc, ev)
        finally:
            try:
                self._log(ev)  # before the guest sees the connection end: the log is never behind the guest
                await client.close()
            finally:
                self.active -= 1

    async def _serve(self, client: Stream, ev: Event) -> None:
        """One guest connection; every way it can end is turned into an answer (while one can be sent)."""
        try:
            cfg = self._load_config()
            head = httphead.parse_request(await asyncio.wait_for(read_head(client), self.limits.head_timeout))
            ev.method, ev.target = head.method, head.target[:200]
            if head.method == "CONNECT":
                await self._connect(cfg, head, client, ev)
            else:
                await self._forward(cfg, head, client, ev)
        except EOFError:
            ev.reason = ev.reason or "the guest closed the connection"
        except Refused as exc:
            ev.decision, ev.reason = "deny", exc.reason
            await self._answer(client, 403, "Forbidden", f"refused: {exc.reason}", ev)
        except ProtocolError as exc:
            ev.decision, ev.reason = "deny", f"malformed request: {exc}"
            await self._answer(client, 400, "Bad Request", ev.reason, ev)
        except Upstream as exc:
            ev.decision, ev.reason = "error", str(exc)
            await self._answer(client, 502, "Bad Gateway", ev.reason, ev)
        except VmsandboxError as exc:  # its policy cannot be read
            ev.decision, ev.reason = "deny", exc.message
            await self._answer(client, 503, "Service Unavailable", ev.reason, ev)
        except TimeoutError:
            ev.reason = ev.reason or "timed out"
            if ev.method is None:
                await self._answer(client, 408, "Request Timeout", "no complete request in time")
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError) as exc:
            ev.reason = ev.reason or f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # noqa: BLE001 - whatever else the guest's bytes raise is a refusal like a parser's
            self._unforeseen(exc, ev)
            await self._answer(client, 400, "Bad Request", ev.reason or "malformed request", ev)

    def _unforeseen(self, exc: Exception, ev: Event) -> None:
        ev.decision, ev.reason = "deny", f"malformed request ({type(exc).__name__}: {exc})"
        kind = f"{type(exc).__module__}.{type(exc).__qualname__}"
        if kind not in self._told:  # once per kind: a guest repeating it does not fill the daemon's log
            self._told.add(kind)
            log.warning("an unforeseen %s in a guest's request, refused (400)", kind, exc_info=exc)

    async def _answer(self, client: Stream, status: int, reason: str, text: str, ev: Event | None = None) -> None:
        if ev is not None and ev.answered:
            return  # a tunnel's TLS, or an answer under way: only the end of the connection can say it now
        with contextlib.suppress(OSError, ssl.SSLError, TimeoutError):
            await client.send(
                httphead.render_response(
                    status, reason, f"vmsandbox egress proxy: {text}\n", [("X-Vmsandbox-Reason", text)]
                )
            )

    def refused(self, reason: str) -> None:
        """A connection refused before it reached the proxy (the door was full): its line in the log."""
        self._log(Event(decision="deny", reason=reason))

    def _log(self, ev: Event) -> None:
        try:
            append(self._log_file, ev)
        except OSError as exc:
            log.warning("cannot write the proxy log: %s", exc)

    # ------------------------------------------------------------------ CONNECT

    async def _connect(self, cfg: ProxyConfig, head: RequestHead, client: Stream, ev: Event) -> None:
        ev.host, ev.port = parse_target(head.target)
        cfg.policy.decide(ev.host, ev.port)
        addresses = await self._resolve(cfg, ev.host, ev.port)
        rule = cfg.secret_for(ev.host)
        upstream = None if rule is not None else await connect(addresses, f"{ev.host}:{ev.port}")
        try:
            await client.send(b"HTTP/1.1 200 Connection established\r\n\r\n")
            ev.answered = True
            hello = await asyncio.wait_for(read_hello(client), self.limits.hello_timeout)
            if hello:
                try:
                    sni = tlshello.server_name(hello)
                except tlshello.HelloError as exc:
                    raise Refused(f"bad TLS ClientHello: {exc}") from None
                if sni != ev.host:
                    raise Refused(f"TLS server name {sni!r} does not match the CONNECT host {ev.host}")
            elif ev.port == 443 or rule is not None:
                raise Refused(f"{ev.host}:{ev.port} is reached over TLS only")
            if rule is not None:
                ev.tls = "terminated"
                await self._terminate(cfg, rule, client, hello, addresses, ev)
                return
            if upstream is None:
                raise Upstream("no upstream connection")
            if not hello:  # plain HTTP in a tunnel: held to the same Host rule as a terminated one
                ev.answered = False  # the tunnel speaks plain HTTP: refusals are said in it
                await self._tunnelled_http(client, upstream, ev)
                return
            ev.tls = "passthrough"
            ev.decision = "allow"
            await upstream.send(hello)
            ev.up += len(hello)
            await relay(client, upstream, ev, None, self.limits.idle_timeout)
        finally:
            if upstream is not None:
                await upstream.close()

    async def _terminate(
        self,
        cfg: ProxyConfig,
        rule: SecretRule,
        client: Stream,
        hello: bytes,
        addresses: list[tuple[str, int]],
        ev: Event,
    ) -> None:
        """TLS with the guest under the session CA, verified TLS to the real host, the secret in between."""
        issuer = self._issuer()
        if issuer is None:
            raise Refused("this session has no CA to inject secrets with")
        host = ev.host or ""
        tls = TlsStream(client, issuer.context(host), hello)
        await asyncio.wait_for(tls.handshake(), self.limits.hello_timeout)
        try:
            head = httphead.parse_request(await asyncio.wait_for(read_head(tls), self.limits.head_timeout))
            ev.method = f"CONNECT {head.method}"
            authority = (head.get("host") or [host])[0].lower()
            inject.same_origin(authority, head.target, host, ev.port)
            inject.may_carry_a_secret(head.method)
            headers = inject.inject(cfg, rule, httphead.forward_headers(head, authority), self._read_secret, ev)
            upstream = await connect(addresses, f"{host}:{ev.port}", tls=self._upstream_tls(), server_hostname=host)
        except (Refused, ProtocolError, Upstream) as exc:
            await self._answer_in(tls, exc, ev)
            return
        ev.decision = "allow"
        try:
            await self._send_head(upstream, head.method, head.target, headers, ev)
            await relay(tls, upstream, ev, head.body, self.limits.idle_timeout)
        except ProtocolError as exc:  # the body's framing: said inside the TLS while nothing came back yet
            await self._answer_in(tls, exc, ev)
        finally:
            await upstream.close()

    async def _answer_in(self, tls: TlsStream, exc: Refused | ProtocolError | Upstream, ev: Event) -> None:
        """A refusal inside the terminated TLS (while nothing of an answer went to the guest yet)."""
        if isinstance(exc, Refused):
            ev.decision, ev.reason, status = "deny", exc.reason, (403, "Forbidden", f"refused: {exc.reason}")
        elif isinstance(exc, ProtocolError):
            ev.decision, ev.reason = "deny", f"malformed request: {exc}"
            status = (400, "Bad Request", ev.reason)
        else:
            ev.decision, ev.reason, status = "error", str(exc), (502, "Bad Gateway", str(exc))
        if not ev.down:
            await self._answer(tls, *status)

    async def _tunnelled_http(self, client: Stream, upstream: Stream, ev: Event) -> None:
        """One plain HTTP request inside a CONNECT tunnel: it must be for the tunnel's own host, in origin
        form; it goes upstream with `Connection: close`, so each request is checked on its own."""
        host = ev.host or ""
        head = httphead.parse_request(await asyncio.wait_for(read_head(client), self.limits.head_timeout))
        ev.method = f"CONNECT {head.method}"
        authority = (head.get("host") or [""])[0].lower()
        inject.same_origin(authority, head.target, host, ev.port)
        ev.decision = "allow"
        await self._send_head(upstream, head.method, head.target, httphead.forward_headers(head, authority), ev)
        await relay(client, upstream, ev, head.body, self.limits.idle_timeout)

    # ------------------------------------------------------------------ plain HTTP

    async def _forward(self, cfg: ProxyConfig, head: RequestHead, client: Stream, ev: Event) -> None:
        try:
            url = urlsplit(head.target)
            netloc = url.netloc
        except ValueError:  # urlsplit's own refusals (a bracket left open, a port that is no number)
            raise ProtocolError("a malformed URL") from None
        if url.scheme != "http" or not netloc:
            raise ProtocolError("a proxy request needs an absolute http:// URL (use CONNECT for https)")
        if "@" in netloc:
            raise Refused("credentials in the URL are not passed on")
        ev.host, ev.port = parse_target(netloc, default_port=80)
        cfg.policy.decide(ev.host, ev.port)
        addresses = await self._resolve(cfg, ev.host, ev.port)
        upstream = await connect(addresses, f"{ev.host}:{ev.port}")
        ev.decision = "allow"
        try:
            path = (url.path or "/") + (f"?{url.query}" if url.query else "")
            await self._send_head(upstream, head.method, path, httphead.forward_headers(head, netloc), ev)
            await relay(client, upstream, ev, head.body, self.limits.idle_timeout)
        finally:
            await upstream.close()

    # ------------------------------------------------------------------ upstream

    async def _resolve(self, cfg: ProxyConfig, host: str, port: int) -> list[tuple[str, int]]:
        return await self._resolver(host, port, cfg.policy.networks)

    async def _send_head(
        self, upstream: Stream, method: str, target: str, headers: list[tuple[str, str]], ev: Event
    ) -> None:
        out = httphead.render_request(method, target, headers)
        await upstream.send(out)
        ev.up += len(out)
