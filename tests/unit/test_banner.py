"""Waiting for a guest's sshd (guest/ssh.py): slirp accepts a connection on the forwarded port before sshd
listens, so only a banner says it answers; the connection that got one is kept, its banner unread, for a login
on it. Played with listeners on 127.0.0.1."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from vmsandbox.errors import VmsandboxError
from vmsandbox.guest import ssh

from . import guest_standin as standin

BANNER = b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n"


class Forward:
    """A forwarded port: each connection is closed at once (no sshd yet) until `listening`, then greeted."""

    def __init__(self) -> None:
        self.listening = threading.Event()
        self.accepted = 0
        self.greeted: list[socket.socket] = []
        self.sock = standin.listen(self._take, name="standin-forward")
        self.port = int(self.sock.getsockname()[1])

    def _take(self, conn: socket.socket) -> None:
        self.accepted += 1
        if self.listening.is_set():
            self.greeted.append(conn)  # before the banner: the test reads the list once the banner has come
            conn.sendall(BANNER)
        else:
            conn.close()

    def close(self) -> None:
        self.sock.close()
        for conn in self.greeted:
            conn.close()


@pytest.fixture
def forward() -> Iterator[Forward]:
    f = Forward()
    yield f
    f.close()


def test_the_connection_that_answered_is_kept_with_its_banner_unread(forward: Forward) -> None:
    tries = [0]

    def alive() -> str | None:
        tries[0] += 1
        if tries[0] == 3:
            forward.listening.set()  # sshd listens now
        return None

    s = ssh.banner_socket(forward.port, timeout=30, alive=alive)
    with s:
        s.settimeout(10)
        assert s.recv(len(BANNER)) == BANNER  # the login reads the banner itself
    assert tries[0] >= 3 and len(forward.greeted) == 1  # no connection made after the one that answered


def test_a_vm_that_stops_ends_the_wait_with_its_reason(forward: Forward) -> None:
    said = iter([None, None, "domain crashed"])
    with pytest.raises(VmsandboxError, match="stopped while booting: domain crashed"):
        ssh.banner_socket(forward.port, timeout=30, alive=lambda: next(said))
    assert forward.greeted == []


def test_no_banner_within_the_timeout_is_an_error(forward: Forward) -> None:
    with pytest.raises(VmsandboxError, match="did not answer on SSH within 0 s"):
        ssh.banner_socket(forward.port, timeout=0.3, alive=lambda: None)
    assert ssh.answers(forward.port) is False
    forward.listening.set()
    assert ssh.answers(forward.port) is True
