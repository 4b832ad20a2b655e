"""A stand-in for a session's guest, in process and on loopback only: its sshd (paramiko in server mode, with the
session's pinned host key) that takes the egress daemon's link, its reverse forward and its clock command, and
plays the guest's programs connecting to their door (127.0.0.1:3128): each such connection is a channel it opens
to the daemon. A hostile guest's sshd is played too: it can shut a channel's window (the daemon may send it
nothing) or stop reading the link altogether.

Also the session itself (its files, a policy, the keys the daemon reads) and a plain HTTP upstream on
127.0.0.1, which the daemon reaches through a resolver the test gives it."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paramiko
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat
from paramiko.common import AUTH_FAILED, AUTH_SUCCESSFUL, OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED, OPEN_SUCCEEDED

from vmsandbox import paths
from vmsandbox.egress import control, policy
from vmsandbox.egress.rules.netpolicy import IPNetwork, Mode
from vmsandbox.guest import ssh

LOOPBACK = "127.0.0.1"
logging.getLogger("standin.sshd").setLevel(logging.CRITICAL)
URI = "test:///default"  # libvirt's test driver: never asked (the daemon is told it dropped root)


def listen(serve: Callable[[socket.socket], None], *, name: str, backlog: int = 16) -> socket.socket:
    """A socket listening on 127.0.0.1 (a free port): a thread named `name` hands each connection to `serve`, one
    after another, until the socket is closed."""
    sock = socket.socket()
    sock.bind((LOOPBACK, 0))
    sock.listen(backlog)

    def accept() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            serve(conn)

    threading.Thread(target=accept, name=name, daemon=True).start()
    return sock


def _key(path: Path) -> str:
    """A new Ed25519 key at `path` (OpenSSH format); its public line."""
    key = Ed25519PrivateKey.generate()
    path.write_bytes(key.private_bytes(Encoding.PEM, PrivateFormat.OpenSSH, NoEncryption()))
    path.chmod(0o600)
    return key.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()


class _Server(paramiko.ServerInterface):
    def __init__(self, client_key: paramiko.PKey) -> None:
        self.client_key = client_key
        self.forwarded = threading.Event()
        self.commands: list[bytes] = []  # what the daemon ran on this link (its clock step)

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        return AUTH_SUCCESSFUL if key == self.client_key else AUTH_FAILED

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return OPEN_SUCCEEDED if kind == "session" else OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        self.commands.append(command)
        done = threading.Thread(target=channel.send_exit_status, args=(0,), name="standin-exec", daemon=True)
        done.start()  # `date -s`: done
        return True

    def check_port_forward_request(self, address: str, port: int) -> int:
        self.forwarded.set()
        return port


class Sshd:
    """The guest's sshd on 127.0.0.1: it serves one link at a time (the daemon makes another when one ends)."""

    def __init__(self, host_key: Path, client_key: Path, banner: str | None = None) -> None:
        self.banner = banner  # its version line, if not paramiko's
        self.host_key = paramiko.Ed25519Key.from_private_key_file(str(host_key))
        self.client_key = paramiko.Ed25519Key.from_private_key_file(str(client_key))
        self.links: list[tuple[paramiko.Transport, _Server]] = []
        self.accepted = 0  # connections made to it (each costs a real guest a login's start-up)
        self._released = threading.Event()  # (a link that stopped reading reads again at the end)
        self.sock = listen(self._take, name="standin-accept", backlog=8)
        self.port = int(self.sock.getsockname()[1])

    def _take(self, conn: socket.socket) -> None:
        self.accepted += 1
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as sshd: no small write waits for an ACK
        transport = paramiko.Transport(conn)
        transport.name = "standin-sshd"  # (not one of the daemon's threads)
        transport.set_log_channel("standin.sshd")  # (its complaints about a banner probe are not the test's)
        if self.banner is not None:
            transport.local_version = self.banner
        transport.add_server_key(self.host_key)
        server = _Server(self.client_key)
        try:
            transport.start_server(server=server)
        except (paramiko.SSHException, EOFError, OSError):
            transport.close()
            return
        self.links.append((transport, server))

    @property
    def transport(self) -> paramiko.Transport:
        """The link in use now (its door forwarded)."""
        return self.links[-1][0]

    def wait_forwarded(self, timeout: float = 60) -> None:
        """Until the daemon has asked for the door on the newest link."""
        deadline = time.monotonic() + timeout
        while not (self.links and self.links[-1][1].forwarded.is_set()):
            assert time.monotonic() < deadline, "the daemon never opened the guest's door"
            time.sleep(0.02)

    def connect(self, *, window: int | None = None, source_port: int = 40000) -> paramiko.Channel:
        """A guest program's connection to its door. With `window` 0 the guest never reads what comes."""
        transport = self.transport
        made: list[paramiko.Channel] = []
        put = transport._channels.put  # type: ignore[attr-defined]

        def keep(chanid: int, chan: paramiko.Channel) -> None:
            made.append(chan)  # paramiko forgets a channel the daemon closes before open_channel returns it
            put(chanid, chan)

        sanitize = transport._sanitize_window_size  # type: ignore[attr-defined]
        transport._channels.put = keep  # type: ignore[attr-defined]
        if window is not None:
            transport._sanitize_window_size = lambda size: size  # type: ignore[attr-defined]  # a guest that lies
        try:
            return transport.open_channel("forwarded-tcpip", (LOOPBACK, 3128), (LOOPBACK, source_port), window)
        except paramiko.SSHException:
            if made and transport.is_active():  # opened, answered and closed at once (a refusal): it is here
                return made[0]
            raise
        finally:
            transport._channels.put = put  # type: ignore[attr-defined]
            transport._sanitize_window_size = sanitize  # type: ignore[attr-defined]

    def stop_reading(self) -> None:
        """The guest's sshd reads nothing more of the link in use (a hostile one: the daemon's writes pile up)."""
        packetizer = self.transport.packetizer
        real = packetizer.read_message

        def read_message() -> Any:
            self._released.wait()
            return real()

        packetizer.read_message = read_message  # type: ignore[method-assign]

    def close(self) -> None:
        self._released.set()
        self.sock.close()
        for transport, _ in self.links:
            transport.close()


def exchange(ch: paramiko.Channel, data: bytes, timeout: float = 30) -> bytes:
    """Send `data` on a door connection and read to its end (what the guest's program gets)."""
    ch.settimeout(timeout)
    with contextlib.suppress(OSError):  # (answered and closed already: what came is read below)
        ch.sendall(data)
    out = b""
    with contextlib.suppress(TimeoutError, OSError, EOFError):
        while chunk := ch.recv(65536):
            out += chunk
    ch.close()
    return out


@dataclass
class Session:
    name: str
    files: paths.SessionPaths
    sshd: Sshd
    config: dict[str, Any] = field(default_factory=dict)

    def events(self) -> list[dict[str, Any]]:
        log = self.files.proxy_log
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def state(self) -> control.DaemonState | None:
        return control.daemon_state(self.files)


@contextlib.contextmanager
def session(
    name: str, allow: list[str], *, mode: Mode = Mode.ALLOWLIST, banner: str | None = None, fresh: bool = False
) -> Iterator[Session]:
    """A session's files (under the tests' state dir) and its guest's sshd, pinned; `fresh`: a guest that
    starts now (the daemon's spec says so)."""
    files = paths.session_paths(name)
    files.root.mkdir(parents=True)
    _key(files.client_key)
    host_public = _key(files.root / "host_key")
    sshd = Sshd(files.root / "host_key", files.client_key, banner)
    ssh.write_known_hosts(files, sshd.port, host_public)
    control.Spec(name, sshd.port, True, (), URI, f"vmsandbox-{name}", fresh).save(files)
    config = {"mode": mode.value, "allow": allow, "secrets": [], "session": name}
    policy.write_config(files, config)
    try:
        yield Session(name, files, sshd, config)
    finally:
        sshd.close()


class Upstream:
    """A plain HTTP server on 127.0.0.1 that answers every request `body` (after reading its head), then closes
    the connection — or, `kept_open`, keeps it open (keep-alive; a TLS tunnel's HTTP/2 stream): the answer's last
    bytes are followed by no end."""

    def __init__(self, body: bytes = b"hello\n", *, kept_open: bool = False) -> None:
        self.body = body
        self.kept_open = kept_open
        self.heads: list[bytes] = []
        self.sock = listen(self._take, name="standin-upstream", backlog=64)
        self.port = int(self.sock.getsockname()[1])

    def _take(self, conn: socket.socket) -> None:
        threading.Thread(target=self._answer, args=(conn,), name="standin-answer", daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.settimeout(30)
            head = b""
            while b"\r\n\r\n" not in head and (chunk := conn.recv(4096)):
                head += chunk
            self.heads.append(head)
            close = b"" if self.kept_open else b"Connection: close\r\n"
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n" % (len(self.body), close))
            conn.sendall(self.body)
            if self.kept_open:
                conn.recv(1)  # until the client ends it

    def resolver(self, name: str) -> Callable[[str, int, tuple[IPNetwork, ...]], Any]:
        """The daemon's resolver: `name` is this upstream; any other name does not resolve."""
        from vmsandbox.egress.rules.netpolicy import Refused

        async def resolve(host: str, port: int, networks: tuple[IPNetwork, ...]) -> list[tuple[str, int]]:
            if host != name:
                raise Refused(f"{host} does not resolve")
            return [(LOOPBACK, self.port)]

        return resolve

    def close(self) -> None:
        self.sock.close()
