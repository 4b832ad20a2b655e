"""The front ends' door (core/door): the kernel names who holds the other end of a connection by its 4-tuple
(sock_diag), a closed or TIME_WAIT socket names nobody, and the gate neither reads a connection nor lets the
server hold a slot for it before the kernel answered and its head is whole; a crowd is asked for in batches
and leaves the process its descriptors; a lookup that waits stops no admitted connection.
On real loopback sockets; the API's server (apiserver.py) where uvicorn's slots are the question."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import resource
import socket
import threading
from collections.abc import Collection, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.unit.apiserver import Served, served, wait_until
from vmsandbox.core.door import gate, kernel
from vmsandbox.core.door.judge import judge

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


def test_a_dump_names_the_sockets_connected_to_one_server_only() -> None:
    """More than a few connections are asked for in one dump whose filter (the server's address and port) the
    kernel runs: each live client is named, a closed one is not, and a client of another server (here on the
    same port number of another address) is not in the answer."""
    with socket.socket() as listener, socket.socket() as elsewhere:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        server = listener.getsockname()
        elsewhere.bind(("127.0.0.2", server[1]))
        elsewhere.listen(1)
        clients = [socket.create_connection(server) for _ in range(kernel.FEW + 4)]
        other = socket.create_connection(elsewhere.getsockname())
        accepted = [listener.accept()[0] for _ in clients]
        try:
            gone = clients.pop()
            asked = [c.getsockname() for c in clients] + [gone.getsockname()]
            gone.close()
            rows = kernel.dump(socket.AF_INET, server)
            assert rows is not None and {r.remote for r in rows} == {server}
            assert other.getsockname() not in {r.local for r in rows}
            found = kernel.tcp_holders(socket.AF_INET, server, asked)
            assert [found[c] for c in asked] == [os.geteuid()] * len(clients) + [None]
        finally:
            for s in (*clients, other, *accepted):
                s.close()


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
    server = loop.run_until_complete(loop.create_server(_Gate, "127.0.0.1", 0, backlog=gate.room(64)))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        server.close()
        loop.close()


def _ask(port: int, source: str = "127.0.0.1") -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=20, source_address=(source, 0)) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        with contextlib.suppress(ConnectionResetError):  # (after the whole answer: a refused client sent more)
            while chunk := s.recv(4096):
                answer += chunk
        return answer


def _crowd(pipe: Connection, count: int) -> None:
    """(In a child process.) `count` connections to the port it is sent, made as fast as it can and held until
    it is told to stop."""
    port = pipe.recv()
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(count)]
    pipe.send("made")
    pipe.recv()
    for s in held:
        s.close()


def _open_descriptors() -> int:
    return len(list(Path("/proc/self/fd").iterdir()))


def test_a_crowd_of_another_account_is_judged_in_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another account's 2,000 connections, made as fast as a process can and held: each is judged once (in
    batches: a dump each, not a request per connection), the person (here: whoever connects from 127.0.0.2) is
    answered while they are held, and none keeps a descriptor of the server's after. (One request per
    connection, in a thread pool, waited on the interpreter's lock behind the loop that accepted them: 59 of 904
    were judged in the first second, each holding a descriptor meanwhile.)"""
    real = kernel.tcp_holders
    asked: list[int] = []

    def held_by(
        family: int, server: tuple[str, int], clients: Collection[tuple[str, int]]
    ) -> dict[tuple[str, int], int | None]:
        asked.append(len(clients))
        found = real(family, server, clients)  # (the kernel asked, as for any connection)
        return {c: u if c[0] == "127.0.0.2" or u is None else u + 1 for c, u in found.items()}

    monkeypatch.setattr(kernel, "tcp_holders", held_by)
    forks = multiprocessing.get_context("fork")
    pipe, childs = forks.Pipe()
    crowd = forks.Process(target=_crowd, args=(childs, 2000), daemon=True)
    crowd.start()  # (before the gate's thread: a fork copies no running loop)
    before = _open_descriptors()
    try:
        with gated() as port:
            pipe.send(port)
            assert pipe.poll(60) and pipe.recv() == "made"
            assert _ask(port, source="127.0.0.2").endswith(b"hello")
            pipe.send("stop")
    finally:
        crowd.join(60)
        crowd.kill()
    assert sum(asked) == 2001  # each connection asked for once
    assert _open_descriptors() - before < 10


def test_connections_accepted_while_the_kernel_is_asked_are_asked_for_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While one answer is waited for (before Linux 6.9, another account's dumps can hold the lock every
    inet_diag request takes for a second at a time), what is accepted meanwhile waits, and is then asked for in
    one request; and a connection admitted before goes on being served."""
    real = kernel.tcp_holders
    asked: list[int] = []
    stuck, release = threading.Event(), threading.Event()

    def slow_for_the_second(
        family: int, server: tuple[str, int], clients: Collection[tuple[str, int]]
    ) -> dict[tuple[str, int], int | None]:
        asked.append(len(clients))
        if len(asked) == 2:
            stuck.set()
            release.wait(30)
        return real(family, server, clients)

    monkeypatch.setattr(kernel, "tcp_holders", slow_for_the_second)
    with gated() as port, socket.create_connection(("127.0.0.1", port)) as first:
        wait_until(lambda: asked == [1] and judge.waiting() == 0, "the first connection judged")
        with socket.create_connection(("127.0.0.1", port)) as second:
            assert stuck.wait(20)
            held = [socket.create_connection(("127.0.0.1", port)) for _ in range(50)]
            try:
                wait_until(lambda: judge.waiting() == 50, "50 connections waiting")
                first.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                first.settimeout(20)
                assert first.recv(4096).endswith(b"hello")  # while the second's answer is waited for
                release.set()
                wait_until(lambda: len(asked) == 3, "the 50 asked for")
                second.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                second.settimeout(20)
                assert second.recv(4096).endswith(b"hello")
            finally:
                release.set()
                for s in held:
                    s.close()
    assert asked == [1, 1, 50]


def test_a_connection_reset_before_its_verdict_is_refused() -> None:
    """The kernel is asked by addresses: a client that resets its connection before the answer frees them for
    another connection (the person's, to a port the other account guessed), and the answer could be about that
    one. The verdict holds only for a socket still ESTABLISHED (or CLOSE_WAIT), which held them all along."""
    import struct

    with connected() as (client, accepted):
        assert gate._same_connection(accepted)
        client.shutdown(socket.SHUT_WR)  # (half-closed by its client: CLOSE_WAIT here, the same connection)
        assert wait_until_state(accepted, gate.TCP_CLOSE_WAIT) and gate._same_connection(accepted)
    with connected() as (client, accepted):
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()  # (a reset)
        assert wait_until_state(accepted, 7) and not gate._same_connection(accepted)  # (TCP_CLOSE)
    left, right = socket.socketpair()
    with left, right:
        assert gate._same_connection(left)  # (a Unix socket: SO_PEERCRED names who holds this very one)


def wait_until_state(sock: socket.socket, state: int) -> bool:
    wait_until(lambda: sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0] == state, f"TCP state {state}")
    return True


def test_a_head_and_its_body_sent_while_the_verdict_waits_are_handed_over_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A request whose head and body (past MOST_HEAD) come before the kernel's answer is served once admitted:
    a whole head is never taken for one that grows too long (a 300 KB upload was reset when verdicts were
    slow), and what waits for the verdict is not read on."""
    real = kernel.tcp_holders
    release = threading.Event()

    def slow(
        family: int, server: tuple[str, int], clients: Collection[tuple[str, int]]
    ) -> dict[tuple[str, int], int | None]:
        release.wait(30)
        return real(family, server, clients)

    monkeypatch.setattr(kernel, "tcp_holders", slow)
    with gated() as port, socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"PUT / HTTP/1.1\r\nHost: x\r\ncontent-length: 300000\r\n\r\n" + b"x" * 100_000)
        s.sendall(b"x" * 200_000)
        release.set()
        s.settimeout(20)
        assert s.recv(4096).endswith(b"hello")


def test_a_judge_that_fails_refuses_that_batch_and_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure of the judge's own (not the kernel's) names nobody in its batch; the next is judged."""
    real, failed = judge._answer, threading.Event()

    def once(batch: list[Any]) -> None:
        if not failed.is_set():
            failed.set()
            raise RuntimeError("a bug in the judge")
        real(batch)

    monkeypatch.setattr(judge, "_answer", once)
    with gated() as port:
        assert _ask(port).endswith(b"None")  # (refused: nobody named)
        assert _ask(port).endswith(b"hello")


def test_a_failure_while_judging_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails closed: a lookup that raises (anything, not only an OSError) names nobody, and the connection is
    refused, never handed over."""

    def broken(*_: object) -> dict[tuple[str, int], int | None]:
        raise ValueError("a row the parser did not expect")

    monkeypatch.setattr(kernel, "tcp_holders", broken)
    with gated() as port:
        assert _ask(port).endswith(b"None")


def _room(pipe: Connection, soft: int, hard: int) -> None:
    """(In a child process.) gate.room(64) under these limits, and the soft limit after."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    pipe.send((gate.room(64), resource.getrlimit(resource.RLIMIT_NOFILE)[0]))


def test_a_front_end_makes_room_for_its_backlog() -> None:
    """asyncio accepts up to the backlog each time, a few times before the gate has closed any: that many
    backlogs fit under the soft limit of descriptors, which is raised to the hard one (here 1,024 and 4,096;
    then a hard limit of 512)."""
    forks = multiprocessing.get_context("fork")
    found = []
    for limits in ((1024, 4096), (512, 512)):
        pipe, childs = forks.Pipe()
        child = forks.Process(target=_room, args=(childs, *limits))
        child.start()
        found.append(pipe.recv())
        child.join(30)
    fits = [(soft - 64 - gate.RESERVE) // gate.ACCEPTED_AT_ONCE for soft in (4096, 512)]
    assert found == [(min(gate.MOST_BACKLOG, fits[0]), 4096), (fits[1], 512)]


def test_another_account_is_answered_without_being_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each of 300 refused requests gets its answer whole: closed with the request unread, a socket is reset,
    and the reset overtook the answer about once in a hundred times on a loaded host (what the client sent is
    dropped unseen before the close)."""
    monkeypatch.setattr(kernel, "tcp_holder", lambda *_: os.geteuid() + 1)
    with gated() as port:
        answers = [_ask(port) for _ in range(300)]
    assert all(a.startswith(b"HTTP/1.1 403") and a.endswith(str(os.geteuid() + 1).encode()) for a in answers)
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
