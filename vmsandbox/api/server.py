"""Serving the API: a key, 127.0.0.1 (and a 0600 Unix socket if asked), the settings a client needs, and uvicorn
until interrupted; one server per account at a time, never as root (running.py: what it leaves for the account's
other commands, the key kept where asked, the background start and the stop).

The key is never put on a command line or in a log: it is printed to the caller's stdout and kept in the 0600 env
file of the private state directory while the server runs (and in serve.key across restarts with --keep-key).
E2B's SDK reaches a self-hosted control plane by E2B_API_URL and every sandbox's envd by E2B_SANDBOX_URL (one
URL; the sandbox rides in a header), both this server; it speaks HTTP/1.1 to a plain-http URL, which uvicorn
serves. E2B_DEBUG must stay unset: with it the SDK skips kill and set_timeout.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
from collections.abc import Callable
from pathlib import Path

from vmsandbox.api import app, running
from vmsandbox.api.peer import PeerCheckedH11
from vmsandbox.api.running import Settings
from vmsandbox.core.door import gate
from vmsandbox.core.sandbox.interface import Backend
from vmsandbox.errors import VmsandboxError
from vmsandbox.sudo import invoker as sudo_invoker

LIMIT_CONNECTIONS = 256  # connections at once: more are answered 503
GRACEFUL_STOP = 10  # seconds the requests under way get to end once the server is told to stop
AS_YOURSELF = "run `vmsandbox serve` as your own account, a member of the libvirt group (`sudo vmsandbox host setup`"
AS_YOURSELF += " once adds you: log in again)"


def refuse_root() -> None:
    """`serve` runs as the account it serves, never as root, under sudo or not: a key handed out by root would drive
    sessions as root; the kernel's socket table, which says who connects on 127.0.0.1, names root for a connection
    no process holds any more (so another account could pass for root); and under sudo, the file work done as the
    invoking user switches the whole process, so a threaded server would serve for a moment as another account."""
    who = sudo_invoker()
    if who is not None:
        raise VmsandboxError(
            f"`vmsandbox serve` runs as the account it serves, not under sudo (you are {who.pw_name})",
            hint=f"run `vmsandbox serve` as yourself; {AS_YOURSELF.split(', ', 1)[1]}",
        )
    if os.geteuid() == 0:
        raise VmsandboxError("`vmsandbox serve` does not run as root: it serves one account", hint=AS_YOURSELF)


def refuse_second() -> None:
    found = running.running()
    if found is None:
        return
    where = f"{found.get('url')}" + (f" and {found['socket']}" if found.get("socket") else "")
    raise VmsandboxError(
        f"`vmsandbox serve` already runs for this account (pid {found.get('pid')}) at {where}",
        hint="use that one (`vmsandbox serve --env` prints its settings), or stop it (`vmsandbox serve --stop`)",
    )


def _bound(family: socket.AddressFamily, host: str, port: int) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def listen_tcp(port: int) -> list[socket.socket]:
    """127.0.0.1:PORT, and [::1]:PORT where the machine has IPv6's loopback: a client told `localhost` may try
    ::1 first, and no other account may hold the port's twin there to take its key. Both or neither."""
    for _attempt in range(20 if port == 0 else 1):
        try:
            four = _bound(socket.AF_INET, "127.0.0.1", port)
        except OSError as exc:
            raise VmsandboxError(
                f"cannot listen on 127.0.0.1:{port}: {exc.strerror}",
                hint="choose another port with --port, or leave it out for a free one",
            ) from None
        bound = four.getsockname()[1]
        try:
            six = _bound(socket.AF_INET6, "::1", bound)
        except OSError as exc:
            if exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                six = None  # (no IPv6 loopback here: nobody can hold it either)
            else:
                four.close()
                if port == 0:
                    continue  # its twin is taken: another free port
                raise VmsandboxError(
                    f"cannot listen on [::1]:{port}: {exc.strerror}",
                    hint="choose another port with --port (its IPv6 twin is held by another program)",
                ) from None
        socks = [four] if six is None else [four, six]
        for sock in socks:
            sock.listen(128)  # before the settings are printed: a quick client queues rather than being refused
        return socks
    raise VmsandboxError("no free port on 127.0.0.1 whose [::1] twin is free too", hint="give one with --port")


def listen_unix(path: Path) -> socket.socket:
    """A Unix socket at `path`, 0600 from the start. A stale socket there (nothing listening) is replaced;
    anything else there is refused."""
    if path.is_symlink() or (path.exists() and not stat.S_ISSOCK(path.lstat().st_mode)):
        raise VmsandboxError(f"{path} exists and is not a socket", hint="choose another --socket path")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if path.exists():
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe, contextlib.suppress(OSError):
            probe.connect(str(path))
            sock.close()
            raise VmsandboxError(f"something listens on {path}", hint="choose another --socket path")
        path.unlink()
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    except OSError as exc:
        sock.close()
        raise VmsandboxError(f"cannot listen on {path}: {exc.strerror}", hint="choose another --socket path") from None
    finally:
        os.umask(old)
    path.chmod(0o600)
    sock.listen(128)
    return sock


def listen_again(port: int) -> tuple[list[socket.socket], list[str]]:
    """127.0.0.1:PORT, or (no port given) the port this account's last serve listened on, which shells still set up
    for it point at: taken back while it is free, else a free one, and that said (another program holds it)."""
    last = 0 if port else running.last_port()
    try:
        return listen_tcp(port or last), []
    except VmsandboxError:
        if not last:
            raise
    return listen_tcp(0), [running.moved_note(last)]


def serve(
    backend: Backend,
    *,
    port: int,
    unix: Path | None,
    ready: Callable[[Settings, str | None, list[str]], None],
    keep_key: bool = False,
) -> None:
    """Serve until interrupted; `ready` gets the settings, a note on the key (if any) and warnings (settings a serve
    that did not stop left, the last serve's port taken) once the sockets listen."""
    import uvicorn

    refuse_root()
    refuse_second()
    stale = running.forget_stale()
    tcp, moved = listen_again(port)
    notes = [*([running.stale_note(stale)] if stale else []), *moved]
    sockets = [*tcp, *([listen_unix(unix)] if unix is not None else [])]
    bound = tcp[0].getsockname()[1]
    key, note = running.api_key(keep=keep_key)
    settings = Settings(f"http://127.0.0.1:{bound}", key, unix)
    try:
        with running.announced(settings):
            ready(settings, note, notes)
            asgi = app.make(backend, api_key=settings.api_key, port=bound)
            config = uvicorn.Config(
                asgi,
                http=PeerCheckedH11,
                log_level="warning",
                access_log=False,
                log_config=None,
                lifespan="on",
                limit_concurrency=LIMIT_CONNECTIONS,
                backlog=gate.room(LIMIT_CONNECTIONS),
                timeout_graceful_shutdown=GRACEFUL_STOP,
            )  # log_config=None: its errors go to our log (stderr, -v), not to a configuration of its own
            uvicorn.Server(config).run(sockets=sockets)
    finally:
        for sock in sockets:
            sock.close()
        if unix is not None:
            with contextlib.suppress(OSError):
                unix.unlink()
