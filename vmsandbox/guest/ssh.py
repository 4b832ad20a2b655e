"""SSH to a session: per-session keys, a pinned host key, and one option set for ssh, rsync and paramiko
(channel.py, the only paramiko module)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from vmsandbox import filewrite, proc
from vmsandbox.errors import VmsandboxError
from vmsandbox.paths import SessionPaths

LOOPBACK = "127.0.0.1"


def generate_key(path: Path, comment: str) -> str:
    """A new ed25519 key pair at path (private, 0600) and path.pub; returns the public key line."""
    path.unlink(missing_ok=True)
    path.with_suffix(".pub").unlink(missing_ok=True)
    proc.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path])
    path.chmod(0o600)
    return path.with_suffix(".pub").read_text().strip()


def host_alias(session: str) -> str:
    return f"vmsandbox-{session}"


@dataclass(frozen=True)
class Endpoint:
    """How to reach one session's guest."""

    session: str
    port: int
    user: str
    files: SessionPaths
    forward_agent: bool = False  # --ssh-agent: the host's agent is usable in the guest (opt-in)

    @property
    def host_alias(self) -> str:
        return host_alias(self.session)

    def ssh_options(self) -> dict[str, str]:
        """The single option set every client uses. Strict host key checking against our known_hosts."""
        return {
            "HostName": LOOPBACK,
            "Port": str(self.port),
            "User": self.user,
            "IdentityFile": str(self.files.client_key),
            "IdentitiesOnly": "yes",
            "UserKnownHostsFile": str(self.files.known_hosts),
            "GlobalKnownHostsFile": "/dev/null",
            "StrictHostKeyChecking": "yes",
            "HostKeyAlgorithms": "ssh-ed25519",
            "CheckHostIP": "no",
            "PasswordAuthentication": "no",
            "KbdInteractiveAuthentication": "no",
            "ForwardAgent": "yes" if self.forward_agent else "no",
            "ForwardX11": "no",
            "ServerAliveInterval": "15",
            "ServerAliveCountMax": "4",
            "ConnectTimeout": "10",
            # The post-quantum hybrid (OpenSSH 9's default, sntrup761) costs each login ~0.1 s of a TCG guest; the
            # connection runs over the host's loopback (through an ssh tunnel of the user's own for a remote host)
            "KexAlgorithms": "curve25519-sha256,curve25519-sha256@libssh.org",
            "LogLevel": "ERROR",
            "SendEnv": "LANG LC_* COLORTERM",
            # One login (slow under TCG) serves the command, the review's rsync and later execs.
            "ControlMaster": "auto",
            "ControlPath": str(self.files.ssh_socket),
            "ControlPersist": "60",
        }

    def write_config(self) -> None:
        lines = [f"Host {host_alias(self.session)}"]
        lines += [f"    {k} {v}" for k, v in self.ssh_options().items()]
        filewrite.write_atomically(self.files.ssh_config, "\n".join(lines) + "\n")

    def ssh_argv(self, *extra: str, user: str | None = None) -> list[str]:
        argv = ["ssh", "-F", str(self.files.ssh_config)]
        if user is not None:
            argv += ["-l", user]
        return [*argv, *extra, host_alias(self.session)]

    def rsync_rsh(self) -> str:
        """The -e value for rsync: the same ssh with the same config."""
        return f"ssh -F {self.files.ssh_config}"


def write_known_hosts(files: SessionPaths, port: int, host_public_key: str) -> None:
    """Pin the guest's host key (generated on the host) for [127.0.0.1]:port."""
    key_type, key_data = host_public_key.split()[:2]
    filewrite.write_atomically(files.known_hosts, f"[{LOOPBACK}]:{port} {key_type} {key_data}\n")


def wait_for_banner(port: int, *, timeout: float, alive: Callable[[], str | None]) -> float:
    """Wait until sshd answers with its banner on 127.0.0.1:port. `alive` returns None while the VM runs, else
    why it stopped. Returns seconds waited."""
    start = time.monotonic()
    banner_socket(port, timeout=timeout, alive=alive).close()
    return time.monotonic() - start


def banner_socket(port: int, *, timeout: float, alive: Callable[[], str | None]) -> socket.socket:
    """A connection to 127.0.0.1:port on which sshd has sent its banner (peeked, not read): a client may log in
    on it. slirp accepts TCP on the forwarded port before sshd listens, so a connect alone proves nothing; and
    every connection sshd accepts costs the guest a login's start-up (a fork and a re-exec: ~0.2 s under TCG),
    so the one that answers is worth keeping. `alive` returns None while the VM runs, else why it stopped."""
    start = time.monotonic()
    while True:
        elapsed = time.monotonic() - start
        stopped = alive()
        if stopped is not None:
            raise VmsandboxError(f"the VM stopped while booting: {stopped}")
        if elapsed > timeout:
            raise VmsandboxError(f"the VM did not answer on SSH within {timeout:.0f} s")
        s = _answering(port)
        if s is not None:
            return s
        time.sleep(0.1)  # a connect to a loopback forward costs nothing: a late banner costs the user


def _answering(port: int, timeout: float = 3) -> socket.socket | None:
    """A connection on which an sshd has sent its banner within `timeout` seconds (peeked), else None."""
    try:
        s = socket.create_connection((LOOPBACK, port), timeout=2)
    except OSError:
        return None
    try:
        s.settimeout(timeout)
        if s.recv(4, socket.MSG_PEEK) == b"SSH-":
            s.settimeout(None)
            return s
    except OSError:
        pass
    s.close()
    return None


def answers(port: int, timeout: float = 3) -> bool:
    """Whether an sshd answers on 127.0.0.1:port with its banner (within `timeout` seconds)."""
    s = _answering(port, timeout)
    if s is None:
        return False
    s.close()
    return True


LOGIN_AHEAD_TIMEOUT = 30.0


@contextlib.contextmanager
def login_ahead(endpoint: Endpoint) -> Iterator[None]:
    """Open the session's shared login (its ControlMaster, kept ControlPersist seconds) in the background while
    the caller waits on something else, and wait for it at the end: a login costs ~0.8 s under TCG, and the
    command, the review's rsync and the execs that follow reuse it. A login that fails here is only not
    shared: the next client logs in itself and says why."""

    def login() -> None:
        with contextlib.suppress(VmsandboxError):
            proc.run([*endpoint.ssh_argv("-T"), "--", "true"], check=False, timeout=LOGIN_AHEAD_TIMEOUT)

    thread = threading.Thread(target=login, name=f"login-{endpoint.session}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join(LOGIN_AHEAD_TIMEOUT)
