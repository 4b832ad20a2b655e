"""The one module that imports paramiko: an SSH link to a guest held by a long-running host process (the egress
daemon), with the session's pinned host key, remote forwards, direct channels, and a byte bridge.

paramiko is imported lazily: 150 ms of imports that `run` and `exec` (which use the system ssh) never need.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vmsandbox.errors import VmsandboxError
from vmsandbox.guest.ssh import LOOPBACK, Endpoint

if TYPE_CHECKING:
    import paramiko


RUN_OUTPUT = 1024**2


class LinkError(Exception):
    """The SSH link failed (paramiko's errors, socket errors and EOF, as one type)."""


class Link:
    """A connected SSH client to one guest."""

    def __init__(self, client: paramiko.SSHClient) -> None:
        self.client = client
        transport = client.get_transport()
        if transport is None:
            raise LinkError("no SSH transport")
        self.transport = transport

    @property
    def active(self) -> bool:
        return bool(self.transport.is_active())

    def keepalive(self, seconds: int) -> None:
        self.transport.set_keepalive(seconds)

    def forward_remote(self, port: int) -> None:
        """Ask the guest to listen on its 127.0.0.1:port and hand each connection to us (accept())."""
        with _as_link_error():
            self.transport.request_port_forward(LOOPBACK, port)

    def accept(self, timeout: float) -> Any | None:
        with _as_link_error():
            return self.transport.accept(timeout=timeout)

    def open_direct(self, port: int, peer: tuple[str, int], timeout: float = 10) -> Any:
        """A channel to the guest's own 127.0.0.1:port (published ports)."""
        with _as_link_error():
            return self.transport.open_channel("direct-tcpip", (LOOPBACK, port), peer, timeout=timeout)

    def run(self, command: str, timeout: float = 30) -> tuple[int, bytes]:
        """Run a command; its exit status and stdout (at most `RUN_OUTPUT` bytes of it: the guest writes it)."""
        with _as_link_error():
            _stdin, stdout, _stderr = self.client.exec_command(command, timeout=timeout)
            data = stdout.read(RUN_OUTPUT)
            return int(stdout.channel.recv_exit_status()), bytes(data)

    def run_unread(self, command: str, timeout: float) -> int | None:
        """Run a command whose output nobody reads (paramiko buffers at most a window of it); its exit status,
        or None if it did not end within `timeout` seconds. What a hostile guest sends here costs us nothing."""
        with _as_link_error():
            ch = self.transport.open_session(timeout=timeout)
            try:
                ch.exec_command(command)
                return int(ch.recv_exit_status()) if ch.status_event.wait(timeout) else None
            finally:
                ch.close()

    def close(self) -> None:
        self.client.close()


@contextlib.contextmanager
def _as_link_error() -> Any:
    import paramiko

    try:
        yield
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise LinkError(f"{type(exc).__name__}: {exc}") from exc


@dataclass(frozen=True)
class Keys:
    """A session's client key and pinned host keys, read once: the egress daemon reads them before it drops root
    (the files are root's then) and connects with them for as long as it runs."""

    client: Any  # paramiko.PKey
    hosts: Any  # paramiko.HostKeys


def load_keys(endpoint: Endpoint) -> Keys:
    import paramiko

    try:
        client = paramiko.Ed25519Key.from_private_key_file(str(endpoint.files.client_key))
        return Keys(client, paramiko.HostKeys(str(endpoint.files.known_hosts)))
    except (paramiko.SSHException, OSError) as exc:
        raise VmsandboxError(f"cannot read the SSH keys of session {endpoint.session}: {exc}") from exc


def connect(endpoint: Endpoint, *, user: str | None = None, timeout: float = 15, keys: Keys | None = None) -> Link:
    """A link with the pinned host key and the session key (read now, or `keys` read before); unknown keys are
    rejected."""
    import paramiko

    keys = keys or load_keys(endpoint)
    client = paramiko.SSHClient()
    for host, entry in keys.hosts.items():
        for kind, key in entry.items():
            client.get_host_keys().add(host, kind, key)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        client.connect(
            LOOPBACK,
            port=endpoint.port,
            username=user or endpoint.user,
            pkey=keys.client,
            look_for_keys=False,
            allow_agent=False,
            timeout=timeout,
            banner_timeout=timeout,
            auth_timeout=timeout,
        )
    except paramiko.BadHostKeyException as exc:
        client.close()
        raise VmsandboxError(
            f"the guest of session {endpoint.session} presented a host key that does not match the pinned one",
            hint="the VM is not the one this session started; destroy the session",
        ) from exc
    except (paramiko.SSHException, OSError) as exc:
        client.close()
        raise VmsandboxError(
            f"cannot reach the guest of session {endpoint.session} over SSH: {exc}",
            hint=f"check the VM with `vmsandbox logs {endpoint.session} console`",
        ) from exc
    return Link(client)


def bridge(channel: Any, sock: socket.socket) -> None:
    """Copy bytes between an SSH channel and a socket, both ways, until both end."""

    def pump_in() -> None:
        with contextlib.suppress(OSError, EOFError):
            while data := channel.recv(65536):
                sock.sendall(data)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)

    t = threading.Thread(target=pump_in, daemon=True)
    t.start()
    with contextlib.suppress(OSError, EOFError):
        while data := sock.recv(65536):
            channel.sendall(data)
    with contextlib.suppress(OSError, EOFError):
        channel.shutdown_write()
    t.join(timeout=5)
    channel.close()
    sock.close()
