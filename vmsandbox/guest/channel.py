"""The one module that imports paramiko: an SSH link to a guest held by a long-running host process (the egress
daemon), with the session's pinned host key, remote forwards, and direct channels used without ever blocking.

paramiko is imported lazily: 150 ms of imports that `run` and `exec` (which use the system ssh) never need.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vmsandbox.errors import VmsandboxError
from vmsandbox.guest.ssh import LOOPBACK, Endpoint

if TYPE_CHECKING:
    import socket

    import paramiko


# paramiko's config module imports `invoke` where it is installed, for ssh_config's `Match exec`, which no link here
# parses (nothing reads an ssh_config): ~4 MiB of its own and 40 ms in every session's egress daemon. Marked as
# absent before paramiko is first imported, paramiko goes on without it (it catches the ImportError).
sys.modules.setdefault("invoke", None)  # type: ignore[arg-type]

RUN_OUTPUT = 1024**2
CHUNK = 64 * 1024


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

    def limit_window(self, size: int) -> None:
        """The most a guest may send on a channel opened from now on before we read it (its SSH window)."""
        self.transport.default_window_size = size

    def accept(self, timeout: float) -> Channel | None:
        with _as_link_error():
            ch = self.transport.accept(timeout=timeout)
        return None if ch is None else Channel(ch)

    def interrupt(self) -> None:
        """End a wait in accept() now (from another thread): it returns None, as at its timeout."""
        with self.transport.lock:  # paramiko's accept() waits on this condition of its lock
            self.transport.server_accept_cv.notify_all()

    def open_direct(self, port: int, peer: tuple[str, int], timeout: float = 10) -> Channel:
        """A channel to the guest's own 127.0.0.1:port (published ports)."""
        with _as_link_error():
            return Channel(self.transport.open_channel("direct-tcpip", (LOOPBACK, port), peer, timeout=timeout))

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


class _Arrival(threading.Event):
    """What one of a channel's buffers calls (under its own lock, in paramiko's thread) when data or its end
    arrives, and when it is emptied: `notify` once each time it goes from empty to not."""

    def __init__(self, notify: Callable[[], None]) -> None:
        super().__init__()
        self._notify = notify
        self._arrived = False

    def set(self) -> None:
        if not self._arrived:
            self._arrived = True
            self._notify()

    def clear(self) -> None:
        self._arrived = False


class Channel:
    """One SSH channel, used without ever blocking and without a descriptor: `read` takes what has arrived,
    `write` what the guest's window takes now, `watch` says when something arrives (paramiko's own way, a pipe
    per channel, races its close against paramiko's thread). A guest that sends past the window it was given is
    refused (it would pile up here)."""

    def __init__(self, chan: paramiko.Channel) -> None:
        chan.settimeout(0.0)
        self._chan = chan
        self._window = int(chan.in_window_size)  # what the guest may have sent that we have not read

    def watch(self, notify: Callable[[], None]) -> None:
        """Call `notify` (in paramiko's thread; it must not wait) when data or the channel's end arrives."""
        self._chan.in_buffer.set_event(_Arrival(notify))
        self._chan.in_stderr_buffer.set_event(_Arrival(notify))

    @property
    def readable(self) -> bool:
        """A read would return something now (data, or the channel's end)."""
        ch = self._chan
        return bool(ch.recv_ready() or ch.recv_stderr_ready() or ch.eof_received or ch.closed)

    def read(self, n: int = CHUNK) -> bytes | None:
        """What has arrived (at most n bytes; b"" at the channel's end), or None when nothing has."""
        with _as_link_error():
            self.check()
            while self._chan.recv_stderr_ready():  # a forwarded connection has one stream: the other is dropped
                self._chan.recv_stderr(CHUNK)
            try:
                return bytes(self._chan.recv(n))
            except TimeoutError:
                return None

    def check(self) -> None:
        """LinkError when the guest sent past its window."""
        unread = len(self._chan.in_buffer) + len(self._chan.in_stderr_buffer)
        if unread > self._window:
            raise LinkError(f"the guest sent {unread} bytes past a window of {self._window}")

    @property
    def writable(self) -> bool:
        """A write would take at least one byte now (or fail at once: the channel ended)."""
        return bool(self._chan.send_ready())

    def write(self, data: bytes) -> int:
        """Send what the guest's window takes now: the number of bytes sent (0 when its window is shut)."""
        with _as_link_error():
            if not self._chan.send_ready():
                return 0
            try:
                return int(self._chan.send(data))
            except TimeoutError:
                return 0

    def end(self) -> None:
        """No more data from us (the guest reads its end)."""
        with _as_link_error():
            self._chan.shutdown_write()

    def close(self) -> None:
        with contextlib.suppress(Exception):  # paramiko's, on a link already gone: nothing left to close
            self._chan.close()

    def refuse(self, data: bytes) -> None:
        """Send what the window takes of `data` (an answer that says why), then close: never waits."""
        with contextlib.suppress(LinkError):
            self.write(data)
        self.close()


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


def connect(
    endpoint: Endpoint,
    *,
    user: str | None = None,
    timeout: float = 15,
    keys: Keys | None = None,
    sock: socket.socket | None = None,
) -> Link:
    """A link with the pinned host key and the session key (read now, or `keys` read before); unknown keys are
    rejected. On `sock` (a connection to the endpoint whose banner came: ssh.banner_socket) if given."""
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
            sock=sock,
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
