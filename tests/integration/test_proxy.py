"""The egress proxy on the host, driven over loopback sockets (no VM): every request targets 127.0.0.1
stand-ins, reached through a resolver the test gives the proxy (as it gives the proxy the test CA); refused
names never get a connection."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from vmsandbox.egress.policy import ProxyConfig, SecretRule
from vmsandbox.egress.relay import certs
from vmsandbox.egress.relay.certs import Issuer
from vmsandbox.egress.relay.proxy import Proxy
from vmsandbox.egress.relay.upstream import resolve_checked, verified_tls
from vmsandbox.egress.rules import tlshello
from vmsandbox.egress.rules.netpolicy import IPNetwork, Mode, Policy, parse_rule

from .standins import LOOPBACK, Recorder, Upstream, UpstreamCA, http_upstream, make_ca

pytestmark = pytest.mark.no_vm

SECRET = "s3cr3t-value-never-in-guest"
PLACEHOLDER = "vmsandbox-placeholder-abc123"


@dataclass
class Rig:
    port: int
    log: Path
    session_ca: Path
    http: Upstream
    tls: Upstream
    api: Upstream
    bad: Upstream
    recorder: Recorder
    config: list[ProxyConfig]
    secrets: dict[str, str]
    test_ca: Path

    def events(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    test_ca = make_ca(tmp_path / "test-ca", "upstream-ca", ["tls.up.example.com", "api.up.example.com"])
    rogue_ca = make_ca(tmp_path / "rogue-ca", "rogue-ca", ["bad.up.example.com"])
    certs.create_ca(
        tmp_path / "session.pem",
        tmp_path / "session.key",
        session="t",
        hosts=["api.up.example.com", "bad.up.example.com"],
    )
    recorder = Recorder()
    with (
        http_upstream("http.up.example.com") as plain,
        http_upstream("tls.up.example.com", test_ca.server_context("tls.up.example.com")) as tls,
        http_upstream("api.up.example.com", test_ca.server_context("api.up.example.com")) as api,
        http_upstream("bad.up.example.com", rogue_ca.server_context("bad.up.example.com")) as bad,
    ):
        ups = {u.name: (LOOPBACK, u.port) for u in (plain, tls, api, bad)}

        async def resolver(host: str, port: int, networks: tuple[IPNetwork, ...]) -> list[tuple[str, int]]:
            if host in ups:  # the stand-ins; every other name through the product's checked resolver
                return [ups[host]]
            return await resolve_checked(host, port, networks)

        def upstream_tls() -> ssl.SSLContext:
            ctx = verified_tls()
            ctx.load_verify_locations(cafile=test_ca.cert)
            return ctx

        rules = (
            "http.up.example.com",
            "tls.up.example.com",
            "api.up.example.com",
            "bad.up.example.com",
            f"localhost:{recorder.port}",
        )
        config = [
            ProxyConfig(
                policy=Policy(Mode.ALLOWLIST, tuple(parse_rule(r, source="t") for r in rules)),
                secrets=(
                    SecretRule("api", "api.up.example.com", "x-api-key", PLACEHOLDER),
                    SecretRule("api", "bad.up.example.com", "x-api-key", PLACEHOLDER),
                ),
            )
        ]
        secrets = {"api": SECRET}
        issuer = Issuer(tmp_path / "session.pem", tmp_path / "session.key")
        log = tmp_path / "proxy.jsonl"
        proxy = Proxy(lambda: config[0], log, secrets.get, lambda: issuer, resolver=resolver, upstream_tls=upstream_tls)
        loop = asyncio.new_event_loop()
        server = loop.run_until_complete(asyncio.start_server(proxy.handle, LOOPBACK, 0))
        port = server.sockets[0].getsockname()[1]
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        try:
            yield Rig(
                port, log, tmp_path / "session.pem", plain, tls, api, bad, recorder, config, secrets, test_ca.cert
            )
        finally:
            loop.call_soon_threadsafe(server.close)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=5)
            recorder.close()


def _exchange(port: int, data: bytes) -> bytes:
    with socket.create_connection((LOOPBACK, port), timeout=10) as s:
        s.sendall(data)
        return _read_all(s)


def _read_all(s: socket.socket | ssl.SSLSocket) -> bytes:
    out = b""
    while True:
        try:
            chunk = s.recv(65536)
        except (ConnectionResetError, ssl.SSLError):
            break
        if not chunk:
            break
        out += chunk
    return out


def _connect(port: int, target: str) -> tuple[socket.socket, bytes]:
    s = socket.create_connection((LOOPBACK, port), timeout=10)
    s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    reply = b""
    while b"\r\n\r\n" not in reply:
        chunk = s.recv(4096)
        if not chunk:
            break
        reply += chunk
    return s, reply


def _https_get(rig: Rig, host: str, ca: Path, headers: str = "", sni: str | None = None, method: str = "GET") -> bytes:
    s, reply = _connect(rig.port, f"{host}:443")
    assert reply.startswith(b"HTTP/1.1 200"), reply
    ctx = ssl.create_default_context(cafile=str(ca))
    if sni is not None:
        ctx.check_hostname = False
    with ctx.wrap_socket(s, server_hostname=sni or host) as tls:
        tls.sendall(f"{method} /v1/thing HTTP/1.1\r\nHost: {host}\r\n{headers}\r\n".encode())
        return _read_all(tls)


def test_plain_http_to_an_allowed_host(rig: Rig) -> None:
    out = _exchange(rig.port, b"GET http://http.up.example.com/hi?x=1 HTTP/1.1\r\nHost: http.up.example.com\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200"), out
    assert b"hello from http.up.example.com GET /hi?x=1" in out
    (event,) = rig.events()
    assert event["decision"] == "allow" and event["host"] == "http.up.example.com" and int(str(event["down"])) > 0


@pytest.mark.parametrize(
    ("target", "why"),
    [
        ("denied.invalid:443", "special-use"),
        ("evil.up.example.com:443", "not in the allowlist"),  # not allowed, never resolved
        ("127.0.0.1:{port}", "IP literal"),
        ("[::1]:{port}", "IP literal"),
        ("2130706433:{port}", "IP literal"),
        ("localhost:{port}", "loopback"),
        ("http.up.example.com:22", "not in the allowlist"),
    ],
)
def test_connect_refusals_never_reach_anything(rig: Rig, target: str, why: str) -> None:
    s, reply = _connect(rig.port, target.format(port=rig.recorder.port))
    reply += _read_all(s)  # to the end: the proxy logs before it closes
    s.close()
    assert reply.startswith(b"HTTP/1.1 403"), reply
    assert why in reply.decode()
    assert rig.recorder.hits == 0
    (event,) = rig.events()
    assert event["decision"] == "deny" and why in str(event["reason"])


def test_tls_passthrough_checks_the_server_name(rig: Rig) -> None:
    out = _https_get(rig, "tls.up.example.com", rig.test_ca)
    assert b"hello from tls.up.example.com GET /v1/thing" in out
    with pytest.raises((ssl.SSLError, ConnectionResetError, OSError)):
        _https_get(rig, "tls.up.example.com", rig.test_ca, sni="api.up.example.com")
    events = rig.events()
    assert events[0]["decision"] == "allow" and events[0]["tls"] == "passthrough"
    assert events[1]["decision"] == "deny" and "does not match" in str(events[1]["reason"])
    assert len(rig.tls.requests) == 1


def test_secret_is_injected_only_after_verifying_the_upstream(rig: Rig) -> None:
    out = _https_get(rig, "api.up.example.com", rig.session_ca, f"x-api-key: {PLACEHOLDER}\r\n")
    assert out.startswith(b"HTTP/1.1 200"), out
    assert rig.api.requests[-1]["x-api-key"] == SECRET
    assert SECRET.encode() not in out
    # an upstream whose certificate does not verify never sees the secret: 502 inside the tunnel
    out = _https_get(rig, "bad.up.example.com", rig.session_ca, f"x-api-key: {PLACEHOLDER}\r\n")
    assert out.startswith(b"HTTP/1.1 502") and b"failed verification" in out, out
    assert rig.bad.requests == []
    ev = rig.events()
    assert ev[0]["tls"] == "terminated" and ev[0]["secret"] == "api" and ev[1]["decision"] == "error"


@pytest.mark.parametrize("method", ["TRACE", "TRACK", "OPTIONS", "PROPFIND"])
def test_a_secret_never_rides_a_method_that_could_hand_it_back(rig: Rig, method: str) -> None:
    """TRACE echoes the request, headers and all: a guest that sent one to an allowed API host would read
    the injected secret in the answer. Only the methods of REST APIs get it; the others never go upstream."""
    out = _https_get(rig, "api.up.example.com", rig.session_ca, f"x-api-key: {PLACEHOLDER}\r\n", method=method)
    assert out.startswith(b"HTTP/1.1 403") and b"never carries a secret" in out, out
    assert SECRET.encode() not in out
    assert rig.api.requests == []
    (event,) = rig.events()
    assert event["decision"] == "deny" and event.get("secret") in (None, "")


def test_missing_or_revoked_secret(rig: Rig) -> None:
    rig.secrets.clear()
    out = _https_get(rig, "api.up.example.com", rig.session_ca, f"x-api-key: {PLACEHOLDER}\r\n")
    assert out.startswith(b"HTTP/1.1 502") and b"vmsandbox secret set api" in out, out
    rig.secrets["api"] = SECRET
    rig.config[0] = replace(rig.config[0], revoked=True)
    out = _https_get(rig, "api.up.example.com", rig.session_ca, f"x-api-key: {PLACEHOLDER}\r\n")
    assert out.startswith(b"HTTP/1.1 200")
    assert rig.api.requests[-1]["x-api-key"] == PLACEHOLDER


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GARBAGE\r\n\r\n", b"400"),
        (b"GET http://http.up.example.com/ HTTP/1.1\r\nX-Big: " + b"a" * 40000 + b"\r\n\r\n", b"400"),
        (b"GET http://http.up.example.com/ HTTP/1.1\r\n folded: x\r\n\r\n", b"400"),
        (
            b"POST http://http.up.example.com/ HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"400",
        ),
        (b"GET /relative HTTP/1.1\r\nHost: http.up.example.com\r\n\r\n", b"400"),
        (b"GET http://user:pw@http.up.example.com/ HTTP/1.1\r\n\r\n", b"403"),
    ],
)
def test_malformed_requests(rig: Rig, request_bytes: bytes, status: bytes) -> None:
    out = _exchange(rig.port, request_bytes)
    assert out.startswith(b"HTTP/1.1 " + status), out
    assert rig.http.requests == []


def test_client_hello_parser_reads_real_hellos() -> None:
    """The SNI parser against a ClientHello made by Python's own TLS stack."""
    ctx = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname="Example.ORG")
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    hello = outgoing.read()
    assert tlshello.needed(hello) == len(hello)
    assert tlshello.needed(hello[:10]) == 0
    assert tlshello.server_name(hello) == "example.org"


def test_test_ca_helper_is_a_ca(tmp_path: Path) -> None:
    ca: UpstreamCA = make_ca(tmp_path, "x", ["a.test"])
    assert b"BEGIN CERTIFICATE" in ca.cert.read_bytes()
    assert oct(ca.key.stat().st_mode & 0o777) == "0o600"


def test_open_mode_allows_names_but_never_loopback(rig: Rig) -> None:
    rig.config[0] = replace(rig.config[0], policy=replace(rig.config[0].policy, mode=Mode.OPEN, rules=()))
    out = _exchange(rig.port, b"GET http://http.up.example.com/open HTTP/1.1\r\n\r\n")
    assert b"hello from http.up.example.com GET /open" in out
    for target in (f"localhost:{rig.recorder.port}", f"127.0.0.1:{rig.recorder.port}", "metadata.google.internal:80"):
        s, reply = _connect(rig.port, target)
        reply += _read_all(s)
        s.close()
        assert reply.startswith(b"HTTP/1.1 403"), reply
    assert rig.recorder.hits == 0


def test_plain_http_inside_connect_is_held_to_the_tunnel_host(rig: Rig) -> None:
    s, reply = _connect(rig.port, "http.up.example.com:80")
    assert reply.startswith(b"HTTP/1.1 200"), reply
    s.sendall(b"GET /inside HTTP/1.1\r\nHost: http.up.example.com\r\n\r\n")
    out = _read_all(s)
    s.close()
    assert b"hello from http.up.example.com GET /inside" in out
    s, reply = _connect(rig.port, "http.up.example.com:80")
    s.sendall(b"GET /x HTTP/1.1\r\nHost: localhost\r\n\r\n")  # smuggling another host through the tunnel
    out = _read_all(s)
    s.close()
    assert b"403" in out and b"inside the tunnel" in out
    s, _ = _connect(rig.port, "http.up.example.com:80")
    s.sendall(b"GET http://localhost/x HTTP/1.1\r\nHost: http.up.example.com\r\n\r\n")  # absolute form: refused too
    assert b"403" in _read_all(s)
    s.close()
    events = rig.events()
    assert [e["decision"] for e in events] == ["allow", "deny", "deny"]
    assert len(rig.http.requests) == 1 and rig.recorder.hits == 0


def test_the_log_caps_what_the_guest_chose(rig: Rig) -> None:
    target = "x" * 5000 + ".up.example.com:443"
    s, reply = _connect(rig.port, target)
    reply += _read_all(s)
    s.close()
    (event,) = rig.events()
    assert all(len(v) <= 260 for v in event.values() if isinstance(v, str))
    assert rig.log.stat().st_mode & 0o077 == 0  # the log is private


def test_two_secrets_for_one_host_each_reach_the_header_its_placeholder_is_in(rig: Rig) -> None:
    """An API key and a login token for the same API host (Claude's x-api-key and its setup token as a Bearer):
    the request's placeholder says which; one without a placeholder gets the first secret that is set."""
    token = "login-token-never-in-guest"
    oauth = SecretRule(
        "oauth", "api.up.example.com", "Authorization", "vmsandbox-placeholder-oauth9", "Bearer {secret}"
    )
    rig.config[0] = replace(rig.config[0], secrets=(*rig.config[0].secrets, oauth))
    rig.secrets["oauth"] = token
    out = _https_get(rig, "api.up.example.com", rig.session_ca, f"authorization: Bearer {oauth.placeholder}\r\n")
    assert out.startswith(b"HTTP/1.1 200"), out
    sent = rig.api.requests[-1]
    assert sent["authorization"] == f"Bearer {token}" and "x-api-key" not in sent
    out = _https_get(rig, "api.up.example.com", rig.session_ca, f"x-api-key: {PLACEHOLDER}\r\n")
    assert rig.api.requests[-1]["x-api-key"] == SECRET and "authorization" not in rig.api.requests[-1]
    del rig.secrets["api"]  # only the login token is set: a request without a placeholder gets it
    out = _https_get(rig, "api.up.example.com", rig.session_ca, "")
    assert out.startswith(b"HTTP/1.1 200"), out
    assert rig.api.requests[-1]["authorization"] == f"Bearer {token}"
    del rig.secrets["oauth"]  # nothing set: a login of the guest's own (a kept one) goes as it is
    out = _https_get(rig, "api.up.example.com", rig.session_ca, "authorization: Bearer guest-own-login\r\n")
    assert out.startswith(b"HTTP/1.1 200"), out
    assert rig.api.requests[-1]["authorization"] == "Bearer guest-own-login" and "x-api-key" not in rig.api.requests[-1]
    assert [e.get("secret") for e in rig.events()] == ["oauth", "api", "oauth", None]
    assert "guest's own credentials" in str(rig.events()[-1]["reason"])
