"""The guest identity program's client of PID 1 (images/base/rootfs/usr/local/lib/vmsandbox/identity: Systemd,
Starter): what `systemctl start` asks, on systemd's private D-Bus socket, against a stand-in PID 1 on a unix
socket here that speaks D-Bus through jeepney (another implementation of the wire format than the one under
test), with the unrelated signals a subscribed client gets between the answers."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jeepney
import pytest
from jeepney.low_level import HeaderFields, MessageType, Parser

from .test_guest_identity import ident

MANAGER = jeepney.DBusAddress("/org/freedesktop/systemd1", interface="org.freedesktop.systemd1.Manager")


class Pid1:
    """systemd's private socket: takes the EXTERNAL authentication, answers Subscribe and StartUnit (a job per
    unit, JobRemoved with the result `results` gives, "done" if none), refuses units named `missing*`."""

    def __init__(self, path: Path, results: dict[str, str] | None = None) -> None:
        self.results = results or {}
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.auth = b""
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(1)
        self.serial = 1000
        threading.Thread(target=self._serve, daemon=True).start()

    def _send(self, conn: socket.socket, msg: jeepney.Message) -> None:
        self.serial += 1
        conn.sendall(msg.serialise(serial=self.serial))

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            got = b""
            while b"\r\n" not in got:
                got += conn.recv(4096)
            self.auth, got = got.split(b"\r\n", 1)
            self.auth += b"\r\n"
            conn.sendall(b"OK 0123456789abcdef0123456789abcdef\r\n")
            time.sleep(0.2)  # whatever the client sends after the answer has come by now: read at once, below
            while b"BEGIN\r\n" not in got:
                got += conn.recv(4096)
            parser, held = Parser(), []
            # as systemd's sd-bus: what came in the read that ended the authentication waits in its buffer
            # until more comes
            stuck = got.split(b"BEGIN\r\n", 1)[1]
            if stuck:
                more = conn.recv(4096)
                if not more:
                    return
                stuck += more
            parser.add_data(stuck)
            while True:
                msg = parser.get_next_message()
                while msg is None:
                    chunk = conn.recv(4096)
                    if not chunk:
                        return
                    parser.add_data(chunk)
                    msg = parser.get_next_message()
                assert msg.header.message_type is MessageType.method_call
                member = msg.header.fields[HeaderFields.member]
                self.calls.append((member, msg.body))
                # what a subscribed client also gets: signals of other units and jobs
                self._send(conn, jeepney.new_signal(MANAGER, "UnitNew", "so", ("other.service", "/unit/other")))
                if member == "Subscribe":
                    self._send(conn, jeepney.new_method_return(msg))
                elif member == "StartUnit" and msg.body[0].startswith("missing"):
                    no = jeepney.new_error(msg, "org.freedesktop.systemd1.NoSuchUnit", "s", ("Unit not found.",))
                    self._send(conn, no)
                elif member == "StartUnit":
                    unit = msg.body[0]
                    job = f"/org/freedesktop/systemd1/job/{len(self.calls)}"
                    self._send(conn, jeepney.new_method_return(msg, "o", (job,)))
                    held.append((len(self.calls), job, unit))
                    if len(held) == 2:  # the second job ends first, another job's removal between
                        other = (99, "/org/freedesktop/systemd1/job/99", "other.service", "done")
                        for n, j, u in [held[1], (other[0], other[1], other[2]), held[0]]:
                            result = self.results.get(u, "done")
                            removed = jeepney.new_signal(MANAGER, "JobRemoved", "uoss", (n, j, u, result))
                            self._send(conn, removed)
                        held.clear()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def socket_path(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "private"


def test_two_units_started_as_systemctl_would_each_with_its_result(socket_path: Path) -> None:
    """AUTH and BEGIN go in one write before the answer, as systemd's clients send them: a BEGIN sent after
    the answer may reach PID 1 in one read with the first message, which then waits there (a warm start hung
    so)."""
    pid1 = Pid1(socket_path, {"journal.service": "failed"})
    client = ident.Systemd(str(socket_path), timeout=5)  # (a message lost to PID 1's buffer: a timeout)
    try:
        ssh = client.start("ssh.service")
        journal = client.start("journal.service")
        assert client.wait([journal, ssh]) == {journal: "failed", ssh: "done"}
    finally:
        client.close()
        pid1.close()
    assert pid1.auth == b"\0AUTH EXTERNAL " + str(ident.os.getuid()).encode().hex().encode() + b"\r\n"
    assert pid1.calls == [
        ("Subscribe", ()),
        ("StartUnit", ("ssh.service", "replace")),
        ("StartUnit", ("journal.service", "replace")),
    ]


def test_an_error_answer_is_raised_with_its_name(socket_path: Path) -> None:
    pid1 = Pid1(socket_path)
    client = ident.Systemd(str(socket_path), timeout=10)
    try:
        with pytest.raises(OSError, match=r"StartUnit: org.freedesktop.systemd1.NoSuchUnit: Unit not found."):
            client.start("missing.service")
    finally:
        client.close()
        pid1.close()


def test_the_starter_uses_systemctl_when_pid1_cannot_be_reached(
    socket_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[list[str]] = []

    class Started:
        def __init__(self, argv: list[str]) -> None:
            ran.append(argv)

        def wait(self) -> int:
            return 0

    monkeypatch.setattr(ident, "SYSTEMD_SOCKET", str(socket_path))  # nobody listens there
    monkeypatch.setattr(ident.subprocess, "Popen", Started)
    starter = ident.Starter()
    try:
        assert starter.start(["ssh.service"])() is True
    finally:
        starter.close()
    assert ran == [["systemctl", "start", "ssh.service"]]


def test_the_starter_waits_on_pid1_for_each_set_of_units(socket_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pid1 = Pid1(socket_path, {"journal.service": "failed"})
    monkeypatch.setattr(ident, "SYSTEMD_SOCKET", str(socket_path))
    monkeypatch.setattr(ident.subprocess, "Popen", None)  # (no process is started)
    starter = ident.Starter()
    try:
        sshd = starter.start(["ssh.service"])
        journal = starter.start(["journal.service"])
        assert (journal(), sshd()) == (False, True)
    finally:
        starter.close()
        pid1.close()
