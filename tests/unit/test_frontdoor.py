"""The front ends' door (core/door): the kernel names who holds the other end of a connection by its 4-tuple
(sock_diag), a closed or TIME_WAIT socket names nobody, and the gate neither reads a connection nor lets the
server hold a slot for it before the kernel answered and its head is whole — lookups run off the event loop.
On real loopback sockets; the API's server (apiserver.py) where uvicorn's slots are the question."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.unit.apiserver import Served, served, wait_until
from vmsandbox.core.door import gate, kernel

LOOPBACK = {socket.AF_INET: "127.0.0.1", socket.AF_INET6: "::1"}


@contextlib.contextmanager
def connected(family: socket.AddressFamily = socket.AF_INET) -> Iterator[tuple[socket.socket, socket.socket]]:
    """A client socket and the server's end of its connection, on loopback."""
    with socket.socket(family) as listener:
        listener.bind((LOOPBACK[family], 0))
        listener.listen(1)
        client = socket.create_connection(listener.getsockname()[:2])
        accepted, _ = listener.accept()
        with client, accepted:
            yield client, accepted


def test_the_kernel_names_the_holder_of_a_connection_by_its_four_tuple() -> None:
    with connected() as (client, accepted):
        assert kernel.tcp_holder(socket.AF_INET, accepted.getpeername(), accepted.getsockname()) == os.geteuid()
        assert client.getsockname() == accepted.getpeername()
    if socket.has_ipv6 and Path("/proc/net/tcp6").exists():
        with connected(socket.AF_INET6) as (_client, accepted):
            assert kernel.tcp_holder(socket.AF_INET6, accepted.getpeername(), accepted.getsockname()) == os.geteuid()
    left, right = socket.socketpair(socket.AF_UNIX)
    with left, right:
        assert kernel.unix_holder(right) == os.geteuid()


def test_a_connection_its_client_closed_names_nobody() -> None:
    """Closed by its client, its end is an orphan, then a TIME_WAIT socket, which the kernel reports as uid 0
    whoever made it (a root `serve` let 398 of 400 such connections of another account in). None of them is
    held by anybody: refused, whatever the server's account."""
    with connected() as (client, accepted):
        peer, ours = accepted.getpeername(), accepted.getsockname()
        client.close()
        wait_until(lambda: accepted.recv(1) == b"", "the client's FIN")
        row = kernel.lookup(socket.AF_INET, peer, ours)
        assert row is not None and row.state != kernel.ESTABLISHED and row.inode == 0  # (what /proc/net/tcp showed)
        assert kernel.tcp_holder(socket.AF_INET, peer, ours) is None
    assert kernel.tcp_holder(socket.AF_INET, ("127.0.0.1", 1), ("127.0.0.1", 2)) is None  # nothing there


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({}, 1001),
        ({"state": 6}, None),  # TIME_WAIT
        ({"state": 10}, None),  # a listener at the client's address (what an exact lookup falls back to)
        ({"inode": 0}, None),  # an orphan: closed by whoever held it
        ({"remote": ("127.0.0.1", 9)}, None),  # another socket than the one asked for
        ({"family": socket.AF_INET6}, None),
    ],
)
def test_only_a_live_held_socket_at_exactly_that_four_tuple_names_its_holder(
    change: dict[str, object], named: int | None
) -> None:
    fields: dict[str, object] = {
        "family": socket.AF_INET, "state": kernel.ESTABLISHED, "local": ("127.0.0.1", 50000),
        "remote": ("127.0.0.1", 8080), "uid": 1001, "inode": 4242,
    }  # fmt: skip
    row = kernel.Row(**{**fields, **change})  # type: ignore[arg-type]
    assert kernel.holder(row, socket.AF_INET, ("127.0.0.1", 50000), ("127.0.0.1", 8080)) == named


def test_a_request_and_its_answer_round_trip_in_the_kernels_layout() -> None:
    message = kernel.request(socket.AF_INET, ("127.0.0.1", 50000), ("127.0.0.1", 8080), sequence=7)
    assert len(message) == 16 + 8 + 48 and message[4:6] == kernel.SOCK_DIAG_BY_FAMILY.to_bytes(2, "little")
    assert kernel.parse(message, sequence=7) is None  # (a request is not an answer: too short for one)
    error = kernel._HEADER.pack(36, kernel.NLMSG_ERROR, 0, 7, 0) + (-2).to_bytes(4, "little", signed=True)
    assert kernel.parse(error + bytes(16), sequence=7) is None


class _Hello(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        assert isinstance(self.transport, asyncio.Transport)
        self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello")
        self.transport.close()


class _Gate(gate.Gate):
    inner = _Hello

    def owners(self) -> tuple[int]:
        return (os.geteuid(),)

    def refusal(self, uid: int | None) -> bytes:
        return f"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n{uid}".encode()


@contextlib.contextmanager
def gated() -> Iterator[int]:
    """The test gate before a hello server, on a loop in a thread; its port."""
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(loop.create_server(_Gate, "127.0.0.1", 0))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        server.close()
        loop.close()


def _ask(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while chunk := s.recv(4096):
            answer += chunk
        return answer


def test_the_kernel_is_asked_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lookup that takes its time (any blocking call would) stops no other connection: the person's request is
    answered while another connection's lookup has not come back. (The old check read /proc/net/tcp on the loop
    itself: with an other account's 12k rows, every connection waited for every other's read.)"""
    stuck, release = threading.Event(), threading.Event()
    real = kernel.tcp_holder

    def slow_for_the_first(family: int, client: tuple[str, int], server: tuple[str, int]) -> int | None:
        if not stuck.is_set():
            stuck.set()
            release.wait(30)
        return real(family, client, server)

    monkeypatch.setattr(kernel, "tcp_holder", slow_for_the_first)
    with gated() as port, socket.create_connection(("127.0.0.1", port)) as first:
        assert stuck.wait(20)
        assert _ask(port).endswith(b"hello")  # while the first connection's lookup still waits
        release.set()
        first.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        first.settimeout(20)
        assert first.recv(4096).endswith(b"hello")


def test_another_account_is_answered_without_being_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel, "tcp_holder", lambda *_: os.geteuid() + 1)
    with gated() as port:
        assert _ask(port).startswith(b"HTTP/1.1 403") and _ask(port).endswith(str(os.geteuid() + 1).encode())
    monkeypatch.setattr(kernel, "tcp_holder", lambda *_: None)
    with gated() as port:
        assert _ask(port).endswith(b"None")


@pytest.fixture
def narrow_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    """The API with uvicorn's limit at 4 connections."""
    import uvicorn

    real = uvicorn.Config.__init__

    def narrow(self: uvicorn.Config, *args: object, **kwargs: object) -> None:
        real(self, *args, **{**kwargs, "limit_concurrency": 4})  # type: ignore[arg-type]

    monkeypatch.setattr(uvicorn.Config, "__init__", narrow)
    with served(tmp_path / "guests") as s:
        yield s


def test_connections_that_asked_nothing_hold_none_of_the_servers_slots(narrow_api: Served) -> None:
    """Ten connections that sent no head (idle preconnections, or a stalled client) never reach uvicorn, whose
    limit is 4: a request is answered, not 503. (Before, each was uvicorn's from its first moment.)"""
    quiet = [socket.create_connection(("127.0.0.1", narrow_api.port)) for _ in range(10)]
    try:
        answer = httpx.get(f"{narrow_api.url}/v2/sandboxes", headers=narrow_api.headers, timeout=20)
        assert answer.status_code == 200
    finally:
        for s in quiet:
            s.close()


def test_a_head_too_long_is_closed_unread(narrow_api: Served) -> None:
    with socket.create_connection(("127.0.0.1", narrow_api.port)) as s:
        s.settimeout(20)
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            s.sendall(b"GET / HTTP/1.1\r\nX: " + b"a" * (gate.MOST_HEAD + 10))
        with contextlib.suppress(ConnectionResetError):
            assert s.recv(4096) == b""
