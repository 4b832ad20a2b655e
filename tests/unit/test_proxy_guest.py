"""The egress proxy under a hostile guest, in process: each guest connection is one end of a socket pair (as the
daemon hands it over), every upstream a stand-in on 127.0.0.1 that records the raw bytes it gets. Whatever a
guest sends, its connection ends in an answer or a refusal, a log line and a close, and counts until then; one
request goes up per head, framed as the guest's head framed it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from vmsandbox.egress.policy import ANY_NETWORK, ProxyConfig
from vmsandbox.egress.relay.proxy import Proxy
from vmsandbox.egress.relay.upstream import checked_resolver
from vmsandbox.egress.rules.limits import Limits
from vmsandbox.egress.rules.netpolicy import IPAddress, IPNetwork, Mode, Policy, Refused, parse_rule

from . import guest_standin as standin

LOOPBACK = "127.0.0.1"
ALLOWED = "allowed.example"
TIMEOUT = 30.0  # the longest a test waits for what should come at once (never reached when all is well)


@dataclass
class Upstream:
    """A naive HTTP server on 127.0.0.1: it reads one head (and the body its Content-Length or chunks frame),
    answers, and records every byte that reached it until the proxy closed the connection."""

    answer: bytes = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    received: list[bytes] = field(default_factory=list)
    done: threading.Condition = field(default_factory=threading.Condition)

    def __post_init__(self) -> None:
        self.sock = standin.listen(self._take, name="standin-upstream", backlog=64)
        self.port = int(self.sock.getsockname()[1])

    def _take(self, conn: socket.socket) -> None:
        threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        got = b""
        with conn, contextlib.suppress(OSError):
            conn.settimeout(TIMEOUT)
            while b"\r\n\r\n" not in got and (chunk := conn.recv(65536)):
                got += chunk
            head = got.split(b"\r\n\r\n", 1)[0].lower()
            length = re.search(rb"\r\ncontent-length: *(\d+)", head)
            want = len(head) + 4 + (int(length.group(1)) if length else 0)
            while len(got) < want and (chunk := conn.recv(65536)):
                got += chunk
            while b"chunked" in head and b"0\r\n\r\n" not in got and (chunk := conn.recv(65536)):
                got += chunk
            conn.sendall(self.answer)
            conn.shutdown(socket.SHUT_WR)
            while chunk := conn.recv(65536):  # what a naive server would take for a next request
                got += chunk
        with self.done:
            self.received.append(got)
            self.done.notify_all()

    def wait(self, n: int = 1) -> list[bytes]:
        with self.done:
            assert self.done.wait_for(lambda: len(self.received) >= n, TIMEOUT), "the upstream got nothing"
            return list(self.received)


@dataclass
class Rig:
    proxy: Proxy
    loop: asyncio.AbstractEventLoop
    log: Path
    upstream: Upstream
    config: list[ProxyConfig]

    def open(self) -> socket.socket:
        """A guest connection (the daemon's end of it goes to the proxy)."""
        guest, ours = socket.socketpair()
        guest.settimeout(TIMEOUT)
        asyncio.run_coroutine_threadsafe(self._handle(ours), self.loop)
        return guest

    async def _handle(self, sock: socket.socket) -> None:
        reader, writer = await asyncio.open_connection(sock=sock)
        await self.proxy.handle(reader, writer)

    def exchange(self, data: bytes) -> bytes:
        """Send `data` and read to the end of the connection (which must come). A refusal that needs no request (too
        many connections) may answer and close before the guest sent it: what it answered is read all the same."""
        with self.open() as guest:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                guest.sendall(data)
            return _read_to_end(guest)

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []

    def settle(self) -> None:
        """Wait until no connection is open in the proxy."""
        wait_for(lambda: self.proxy.active == 0, "the proxy to close every connection")


def _read_to_end(guest: socket.socket) -> bytes:
    out = b""
    with contextlib.suppress(ConnectionResetError):  # (its end closed with what the guest sent unread)
        while chunk := guest.recv(65536):
            out += chunk
    return out


def wait_for(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _config(mode: Mode = Mode.ALLOWLIST, networks: tuple[IPNetwork, ...] = ()) -> ProxyConfig:
    rules = (parse_rule(ALLOWED, source="t"), parse_rule(f"{ALLOWED}:8080", source="t"))
    return ProxyConfig(policy=Policy(mode, rules, networks, session="t"))


@contextlib.contextmanager
def rig_with(tmp_path: Path, limits: Limits, resolver: Any = None, answer: bytes | None = None) -> Iterator[Rig]:
    upstream = Upstream(answer) if answer is not None else Upstream()

    async def standin(host: str, port: int, networks: tuple[IPNetwork, ...]) -> list[tuple[str, int]]:
        if host != ALLOWED:
            raise Refused(f"{host} does not resolve")
        return [(LOOPBACK, upstream.port)]

    config = [_config()]
    log = tmp_path / "proxy.jsonl"
    proxy = Proxy(lambda: config[0], log, lambda _s: None, lambda: None, resolver=resolver or standin, limits=limits)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield Rig(proxy, loop, log, upstream, config)
    finally:
        asyncio.run_coroutine_threadsafe(_end_all(), loop).result(timeout=TIMEOUT)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
        upstream.sock.close()


async def _end_all() -> None:
    """Every connection still open ends (as at a daemon's stop: its log line, then its close)."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    with rig_with(tmp_path, Limits(head_timeout=2.0, send_timeout=2.0)) as r:
        yield r


@pytest.mark.parametrize(
    ("line", "status", "why"),
    [
        (f"CONNECT {ALLOWED}:² HTTP/1.1", b"403", "bad port"),
        ("CONNECT denied.example:² HTTP/1.1", b"403", "bad port"),  # a denied host written so: a DENY line too
        (f"GET http://{ALLOWED}:¹/ HTTP/1.1", b"403", "bad port"),
        (f"GET http://[{ALLOWED}/ HTTP/1.1", b"400", "malformed URL"),
        (f"GET http://{ALLOWED}/ HTTP/1.1\r\nContent-Length: ²", b"400", "Content-Length"),
    ],
)
def test_every_malformed_request_is_answered_logged_and_closed(rig: Rig, line: str, status: bytes, why: str) -> None:
    """These once raised ValueError out of the proxy: no answer, no log line, the connection left open (and no
    longer counted against the limit); 300 of them held 604 threads and 612 descriptors."""
    out = rig.exchange(f"{line}\r\n\r\n".encode("latin-1"))  # "²" as the byte \xb2; read to the end (closed)
    assert out.startswith(b"HTTP/1.1 " + status), out
    rig.settle()
    (event,) = rig.events()
    assert event["decision"] == "deny" and why in event["reason"], event
    assert rig.upstream.received == []


def test_an_error_nobody_foresaw_is_a_refusal_too(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Not a list of the errors parsers raise: anything raised while serving a connection is a 400, a line in
    the proxy log (the kind, once, in the daemon's) and a close."""

    async def broken(host: str, port: int, networks: tuple[IPNetwork, ...]) -> list[tuple[str, int]]:
        raise RuntimeError(f"nobody listed this \x1b]52;c;{host}\x07")

    with rig_with(tmp_path, Limits(), resolver=broken) as rig, caplog.at_level(logging.WARNING):
        for _ in range(3):
            out = rig.exchange(f"GET http://{ALLOWED}/ HTTP/1.1\r\n\r\n".encode())
            assert out.startswith(b"HTTP/1.1 400") and b"RuntimeError" in out, out
            assert b"\x1b" not in out.split(b"\r\n\r\n")[0]  # (headers carry it escaped)
        rig.settle()
        events = rig.events()
    assert len(events) == 3 and all(e["decision"] == "deny" and "RuntimeError" in e["reason"] for e in events)
    assert len([r for r in caplog.records if "unforeseen" in r.getMessage()]) == 1


def test_every_connection_counts_against_the_limit_until_it_closes(tmp_path: Path) -> None:
    with rig_with(tmp_path, Limits(connections=2, head_timeout=1.0)) as rig:
        slow = [rig.open(), rig.open()]
        for guest in slow:
            guest.sendall(b"GET http://allowed.exa")  # and nothing more
        wait_for(lambda: rig.proxy.active == 2, "two connections in the proxy")
        out = rig.exchange(f"GET http://{ALLOWED}/ HTTP/1.1\r\n\r\n".encode())
        assert out.startswith(b"HTTP/1.1 503") and b"limit 2" in out, out
        for guest in slow:  # the head timeout ends them: answered, closed, counted out
            assert _read_to_end(guest).startswith(b"HTTP/1.1 408")
            guest.close()
        rig.settle()
        assert rig.exchange(f"GET http://{ALLOWED}/ HTTP/1.1\r\n\r\n".encode()).endswith(b"ok")
        assert [e["decision"] for e in rig.events()].count("deny") == 1 and len(rig.events()) == 4


def test_a_guest_that_does_not_read_is_dropped_after_the_send_timeout(tmp_path: Path) -> None:
    """An answer of 16 MB to a guest that reads none of it: the proxy gives up after `send_timeout` without a
    byte taken (set small here), logs the connection and closes both ends."""
    big = b"HTTP/1.1 200 OK\r\nContent-Length: 16000000\r\n\r\n" + b"x" * 16_000_000
    with rig_with(tmp_path, Limits(send_timeout=0.5), answer=big) as rig:
        guest = rig.open()
        guest.sendall(f"GET http://{ALLOWED}/big HTTP/1.1\r\n\r\n".encode())
        rig.upstream.wait()  # the upstream gave all it had and was closed
        rig.settle()
        (event,) = rig.events()
        assert event["decision"] == "allow" and 0 < event["down"] < 16_000_000, event
        guest.close()


def _head_and_rest(raw: bytes) -> tuple[bytes, bytes]:
    head, _, rest = raw.partition(b"\r\n\r\n")
    return head + b"\r\n\r\n", rest


@pytest.mark.parametrize(
    ("request_bytes", "body"),
    [
        (f"GET http://{ALLOWED}/one HTTP/1.1\r\nHost: {ALLOWED}\r\n\r\n", b""),
        (f"POST http://{ALLOWED}/one HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", b"hello"),
        (  # the body's length named in Connection once went before the framing was read: the body became a request
            f"POST http://{ALLOWED}/one HTTP/1.1\r\nConnection: content-length\r\nContent-Length: 5\r\n\r\nhello",
            b"hello",
        ),
        (
            f"POST http://{ALLOWED}/one HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
            "5;ext=x\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\n",
            b"5\r\nhello\r\n0\r\n\r\n",
        ),
    ],
    ids=["get", "content-length", "connection-names-content-length", "chunked"],
)
def test_one_request_goes_up_per_head_and_nothing_after_it(rig: Rig, request_bytes: str, body: bytes) -> None:
    """A second request on the same connection (here for another host) never reaches the upstream: it gets
    exactly the first request, with its body framed as the guest's head framed it; the guest gets the first
    answer, then the end of the connection, and the log says what was not passed on."""
    second = b"GET /smuggled HTTP/1.1\r\nHost: internal.example\r\n\r\n"
    out = rig.exchange(request_bytes.encode() + second)
    assert out.endswith(b"ok"), out
    (raw,) = rig.upstream.wait()
    head, rest = _head_and_rest(raw)
    assert rest == body and b"smuggled" not in raw, raw
    if body and b"chunked" not in head:
        assert f"Content-Length: {len(body)}".encode() in head
    rig.settle()
    (event,) = rig.events()
    assert event["decision"] == "allow" and "not passed on" in event["reason"], event


def test_one_request_per_head_inside_a_connect_tunnel_too(rig: Rig) -> None:
    with rig.open() as guest:
        guest.sendall(f"CONNECT {ALLOWED}:8080 HTTP/1.1\r\n\r\n".encode())
        reply = b""
        while b"\r\n\r\n" not in reply:
            reply += guest.recv(4096)
        assert reply.startswith(b"HTTP/1.1 200"), reply
        guest.sendall(f"GET /one HTTP/1.1\r\nHost: {ALLOWED}:8080\r\n\r\nGET /two HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert _read_to_end(guest).endswith(b"ok")
    (raw,) = rig.upstream.wait()
    assert raw.count(b"GET ") == 1 and b"/two" not in raw, raw


def test_a_malformed_chunk_ends_both_connections_with_a_refusal(rig: Rig) -> None:
    out = rig.exchange(
        f"POST http://{ALLOWED}/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n".encode()
    )
    assert out.startswith(b"HTTP/1.1 400") and b"longer than its size" in out, out
    rig.settle()
    (event,) = rig.events()
    assert event["decision"] == "deny"


def test_the_hosts_own_address_is_refused_through_the_proxy(tmp_path: Path) -> None:
    """Open mode, every network allowed: a name resolving to the host's own public address is refused by the
    product's checked resolver (its lookup and the kernel's answer played by the test). Whatever it decided,
    the connection could only reach a loopback recorder: no traffic leaves this host."""
    own = {"93.184.215.14"}

    async def lookup(host: str, port: int) -> list[str]:
        return ["93.184.215.14"] if host == "me.example" else ["1.1.1.1"]

    def mine(ip: IPAddress) -> str | None:
        return "one of this host's own addresses (the kernel routes it as local)" if str(ip) in own else None

    checked = checked_resolver(lookup, mine)
    recorder = Upstream()

    async def resolver(host: str, port: int, networks: tuple[IPNetwork, ...]) -> list[tuple[str, int]]:
        await checked(host, port, networks)
        return [(LOOPBACK, recorder.port)]  # never the address itself

    with rig_with(tmp_path, Limits(), resolver=resolver) as rig:
        rig.config[0] = replace(_config(Mode.OPEN, ANY_NETWORK))
        out = rig.exchange(b"GET http://me.example/ HTTP/1.1\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 403") and b"this host's own addresses" in out, out
        out = rig.exchange(b"CONNECT me.example:443 HTTP/1.1\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 403"), out
        assert rig.exchange(b"GET http://them.example/ HTTP/1.1\r\n\r\n").endswith(b"ok")  # (to the recorder)
        rig.settle()
    assert len(recorder.wait()) == 1
    recorder.sock.close()
