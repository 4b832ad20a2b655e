"""The host-side egress proxy of one session (asyncio, no third-party code in the data path).

Why our own: the policy has to see every decision point (CONNECT target, TLS SNI, Host header, the resolved
addresses), secrets are injected only after the upstream certificate is verified, and the whole data path
is a few hundred lines we can read. mitmproxy would bring a large dependency tree into a root-run daemon
for features we would have to turn off.

Each connection from the guest is one request: HTTP CONNECT (passed through after checking the SNI, or
terminated with the session CA for hosts that get a secret injected) or plain HTTP in absolute form.
Every connection ends in one JSON line in the session's proxy log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from vmsandbox.egress import httphead, tlshello
from vmsandbox.egress.certs import Issuer
from vmsandbox.egress.httphead import ProtocolError, RequestHead
from vmsandbox.egress.log import Event, Writer, append
from vmsandbox.egress.netpolicy import Refused, parse_target
from vmsandbox.egress.policy import ProxyConfig, SecretRule
from vmsandbox.egress.streams import Stream, TlsStream, read_head, read_hello
from vmsandbox.egress.upstream import Resolver, Upstream, connect, resolve_checked, verified_tls

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 256
HEAD_TIMEOUT = 30.0
HELLO_TIMEOUT = 15.0
# The methods of the HTTP APIs agents call (REST): only these get a secret. TRACE and TRACK echo the request,
# headers and all; OPTIONS, CONNECT and extension methods have no business carrying an API key.
SECRET_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"})
IDLE_TIMEOUT = 600.0  # an agent may stream one answer for minutes; a silent connection goes after 10


def _may_carry_a_secret(method: str) -> None:
    if method not in SECRET_METHODS:
        raise Refused(f"{method} never carries a secret: it could hand it back (an echo, a TRACE)")


def _same_origin(authority: str, target: str, host: str, port: int | None) -> None:
    """A request inside a terminated tunnel must be for the tunnel's own host, in origin form."""
    if parse_target(authority, default_port=port)[0] != host or not target.startswith("/"):
        raise Refused(f"request for {authority}{target[:80]} inside the tunnel to {host}")


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
    ) -> None:
        self._load_config = load_config
        self._log_file = log_file
        self._read_secret = read_secret
        self._issuer = issuer
        self._resolver = resolver  # a test gives its own (stand-ins on loopback); the product never does
        self._upstream_tls = upstream_tls
        self._active = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        client = Stream(reader, writer)
        ev = Event()
        if self._active >= MAX_CONNECTIONS:
            ev.decision, ev.reason = "deny", f"too many connections (limit {MAX_CONNECTIONS})"
            await self._answer(client, 503, "Service Unavailable", ev.reason)
        else:
            self._active += 1
            try:
                await self._serve(client, ev)
            finally:
                self._active -= 1
        if ev.method is not None or ev.decision == "deny":
            self._log(ev)  # before the guest sees the connection end: the log is never behind the guest
        await client.close()

    async def _serve(self, client: Stream, ev: Event) -> None:
        """One guest connection; every way it can end is turned into an answer (while one can be sent)."""
        try:
            cfg = self._load_config()
            head = httphead.parse_request(await asyncio.wait_for(read_head(client), HEAD_TIMEOUT))
            ev.method, ev.target = head.method, head.target[:200]
            if head.method == "CONNECT":
                await self._connect(cfg, head, client, ev)
            else:
                await self._forward(cfg, head, client, ev)
        except EOFError:
            ev.reason = ev.reason or "the guest closed the connection"
        except Refused as exc:
            ev.decision, ev.reason = "deny", exc.reason
            if not ev.answered:
                await self._answer(client, 403, "Forbidden", f"refused: {exc.reason}")
        except ProtocolError as exc:
            ev.decision, ev.reason = "deny", f"malformed request: {exc}"
            await self._answer(client, 400, "Bad Request", ev.reason)
        except Upstream as exc:
            ev.decision, ev.reason = "error", str(exc)
            if not ev.answered:
                await self._answer(client, 502, "Bad Gateway", ev.reason)
        except TimeoutError:
            ev.reason = "timed out"
            if ev.method is None:
                await self._answer(client, 408, "Request Timeout", "no complete request in time")
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError) as exc:
            ev.reason = ev.reason or f"{type(exc).__name__}: {exc}"

    async def _answer(self, client: Stream, status: int, reason: str, text: str) -> None:
        with contextlib.suppress(OSError, ssl.SSLError):
            await client.send(
                httphead.render_response(
                    status, reason, f"vmsandbox egress proxy: {text}\n", [("X-Vmsandbox-Reason", text)]
                )
            )

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
            hello = await asyncio.wait_for(read_hello(client), HELLO_TIMEOUT)
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
                await self._tunnelled_http(client, upstream, ev)
                return
            ev.tls = "passthrough"
            ev.decision = "allow"
            await upstream.send(hello)
            ev.up += len(hello)
            await self._relay(client, upstream, ev)
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
        await asyncio.wait_for(tls.handshake(), HELLO_TIMEOUT)
        try:
            head = httphead.parse_request(await asyncio.wait_for(read_head(tls), HEAD_TIMEOUT))
            ev.method = f"CONNECT {head.method}"
            authority = (head.get("host") or [host])[0].lower()
            _same_origin(authority, head.target, host, ev.port)
            _may_carry_a_secret(head.method)
            headers = httphead.forward_headers(head, authority)
            headers = self._inject(cfg, rule, headers, ev)
            upstream = await connect(addresses, f"{host}:{ev.port}", tls=self._upstream_tls(), server_hostname=host)
        except Refused as exc:
            ev.decision, ev.reason = "deny", exc.reason
            await self._answer(tls, 403, "Forbidden", f"refused: {exc.reason}")
            return
        except ProtocolError as exc:
            ev.decision, ev.reason = "deny", f"malformed request: {exc}"
            await self._answer(tls, 400, "Bad Request", ev.reason)
            return
        except Upstream as exc:
            ev.decision, ev.reason = "error", str(exc)
            await self._answer(tls, 502, "Bad Gateway", ev.reason)
            return
        ev.decision = "allow"
        try:
            out = httphead.render_request(head.method, head.target, headers)
            await upstream.send(out)
            ev.up += len(out)
            await self._relay(tls, upstream, ev)
        finally:
            await upstream.close()

    async def _tunnelled_http(self, client: Stream, upstream: Stream, ev: Event) -> None:
        """One plain HTTP request inside a CONNECT tunnel: it must be for the tunnel's own host, in origin
        form; it goes upstream with `Connection: close`, so each request is checked on its own."""
        host = ev.host or ""
        head = httphead.parse_request(await asyncio.wait_for(read_head(client), HEAD_TIMEOUT))
        ev.method = f"CONNECT {head.method}"
        authority = (head.get("host") or [""])[0].lower()
        try:
            _same_origin(authority, head.target, host, ev.port)
        except Refused as exc:  # the tunnel speaks plain HTTP: say so in it
            await self._answer(client, 403, "Forbidden", f"refused: {exc.reason}")
            raise
        out = httphead.render_request(head.method, head.target, httphead.forward_headers(head, authority))
        ev.decision = "allow"
        await upstream.send(out)
        ev.up += len(out)
        await self._relay(client, upstream, ev)

    def _inject(
        self, cfg: ProxyConfig, rule: SecretRule, headers: list[tuple[str, str]], ev: Event
    ) -> list[tuple[str, str]]:
        rule = cfg.secret_in(rule.host, headers, lambda s: self._read_secret(s) is not None) or rule
        if cfg.revoked:
            ev.reason = f"secret {rule.secret} was revoked by `vmsandbox clean`; the placeholder passed unchanged"
            return headers
        value = self._read_secret(rule.secret)
        if value is None and not any(rule.placeholder in v for _, v in headers):  # the guest's own login
            ev.reason = f"secret {rule.secret} is not set: the request went with the guest's own credentials"
            return headers
        if value is None:
            raise Upstream(
                f"secret {rule.secret} is not set on the host; set it with `vmsandbox secret set {rule.secret}`"
            )
        ev.secret = rule.secret
        name = rule.header.lower()
        if any(k.lower() == name for k, _ in headers):
            return [(k, v.replace(rule.placeholder, value) if k.lower() == name else v) for k, v in headers]
        return [*headers, (rule.header, rule.value.replace("{secret}", value))]

    # ------------------------------------------------------------------ plain HTTP

    async def _forward(self, cfg: ProxyConfig, head: RequestHead, client: Stream, ev: Event) -> None:
        url = urlsplit(head.target)
        if url.scheme != "http" or not url.netloc:
            raise ProtocolError("a proxy request needs an absolute http:// URL (use CONNECT for https)")
        if "@" in url.netloc:
            raise Refused("credentials in the URL are not passed on")
        ev.host, ev.port = parse_target(url.netloc, default_port=80)
        cfg.policy.decide(ev.host, ev.port)
        addresses = await self._resolve(cfg, ev.host, ev.port)
        upstream = await connect(addresses, f"{ev.host}:{ev.port}")
        ev.decision = "allow"
        try:
            path = (url.path or "/") + (f"?{url.query}" if url.query else "")
            out = httphead.render_request(head.method, path, httphead.forward_headers(head, url.netloc))
            await upstream.send(out)
            ev.up += len(out)
            await self._relay(client, upstream, ev)
        finally:
            await upstream.close()

    # ------------------------------------------------------------------ upstream

    async def _resolve(self, cfg: ProxyConfig, host: str, port: int) -> list[tuple[str, int]]:
        return await self._resolver(host, port, cfg.policy.networks)

    async def _relay(self, client: Stream, upstream: Stream, ev: Event) -> None:
        """Copy both ways until the upstream is done; a half-closed guest side is passed on."""

        async def guest_to_upstream() -> None:
            while data := await asyncio.wait_for(client.recv(), IDLE_TIMEOUT):
                ev.up += len(data)
                await upstream.send(data)
            await upstream.send_eof()

        async def upstream_to_guest() -> None:
            while data := await asyncio.wait_for(upstream.recv(), IDLE_TIMEOUT):
                ev.down += len(data)
                await client.send(data)

        sending = asyncio.create_task(guest_to_upstream())
        try:
            await upstream_to_guest()
        finally:
            if not sending.done():
                sending.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError, TimeoutError, ssl.SSLError):
                await sending
