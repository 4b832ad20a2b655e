"""What a hostile guest's sshd can do to the SSH link the egress daemon holds (guest.channel, paramiko), played
by stand-ins on loopback (no VM): a version line that never ends, chatter instead of a version, garbage after
one, silence, a real handshake with another host key. Each ends in our one error within the timeout, holding
little memory; none gets a session."""

from __future__ import annotations

import socket
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import paramiko
import pytest

from vmsandbox.errors import VmsandboxError
from vmsandbox.guest import channel
from vmsandbox.guest.ssh import Endpoint
from vmsandbox.paths import SessionPaths

pytestmark = pytest.mark.no_vm

TIMEOUT = 3.0


def _endless_line(c: socket.socket) -> None:
    while True:
        c.sendall(b"A" * 65536)


def _chatter(c: socket.socket) -> None:
    while True:
        c.sendall(b"hello there\r\n" * 5000)


def _garbage_after_a_version(c: socket.socket) -> None:
    c.sendall(b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n")
    while True:
        c.sendall(b"\xff\x00\x00\x10" * 16384)


def _silence(c: socket.socket) -> None:
    time.sleep(TIMEOUT * 3)


def _another_host_key(c: socket.socket) -> None:
    server = paramiko.Transport(c)
    server.add_server_key(paramiko.RSAKey.generate(2048))
    server.start_server(server=paramiko.ServerInterface())
    time.sleep(TIMEOUT * 2)
    server.close()


@pytest.fixture
def guest_sshd() -> Iterator[Callable[[Callable[[socket.socket], None]], int]]:
    """A loopback listener that plays `behaviour` on the first connection; its port."""
    listeners: list[socket.socket] = []

    def start(behaviour: Callable[[socket.socket], None]) -> int:
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        listeners.append(srv)

        def serve() -> None:
            c, _ = srv.accept()
            try:
                behaviour(c)
            except (OSError, EOFError, paramiko.SSHException):
                pass
            finally:
                c.close()

        threading.Thread(target=serve, daemon=True).start()
        return int(srv.getsockname()[1])

    yield start
    for srv in listeners:
        srv.close()


def _keys(port: int) -> channel.Keys:
    hosts = paramiko.HostKeys()
    hosts.add(f"[127.0.0.1]:{port}", "ssh-rsa", paramiko.RSAKey.generate(2048))  # the key pinned at start
    return channel.Keys(paramiko.RSAKey.generate(2048), hosts)


@pytest.mark.parametrize(
    ("behaviour", "said"),
    [
        (_endless_line, "cannot reach the guest"),
        (_chatter, "Indecipherable protocol version"),
        (_garbage_after_a_version, "cannot reach the guest"),
        (_silence, "cannot reach the guest"),
        (_another_host_key, "does not match the pinned one"),
    ],
    ids=["endless-line", "chatter", "garbage", "silence", "another-host-key"],
)
def test_a_hostile_sshd_gets_one_error_in_bounded_time_and_memory(
    guest_sshd: Callable[[Callable[[socket.socket], None]], int],
    behaviour: Callable[[socket.socket], None],
    said: str,
    tmp_path: Path,
) -> None:
    port = guest_sshd(behaviour)
    endpoint = Endpoint("hostile", port, "root", SessionPaths(tmp_path))
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(VmsandboxError, match=said):
            channel.connect(endpoint, keys=_keys(port), timeout=TIMEOUT)
        took = time.monotonic() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert took < TIMEOUT * 2 + 5, took  # (a banner is waited for up to the timeout, then the handshake)
    assert peak < 32 * 1024**2, peak
