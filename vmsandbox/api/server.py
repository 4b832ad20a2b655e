"""Serving the API: a fresh key, 127.0.0.1 (and a 0600 Unix socket if asked), the settings a client needs, and
uvicorn until interrupted; one server per account at a time (paths.serve_file says where it is).

The key lives in this process's memory only: it is printed once (the caller's stdout), never written to a file,
never put on a command line. E2B's SDK reaches a self-hosted control plane by E2B_API_URL and every sandbox's
envd by E2B_SANDBOX_URL (one URL; the sandbox rides in a header), both this server; it speaks HTTP/1.1 to a
plain-http URL, which uvicorn serves. E2B_DEBUG must stay unset: with it the SDK skips kill and set_timeout.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import socket
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from vmsandbox import paths, pids
from vmsandbox.api import app
from vmsandbox.api.peer import PeerCheckedH11
from vmsandbox.confine.sudo import invoker as sudo_invoker
from vmsandbox.core.sandbox.interface import Backend
from vmsandbox.errors import VmsandboxError

KEY_PREFIX = "vmsb_"
LIMIT_CONNECTIONS = 256  # connections at once: more are answered 503


@dataclass(frozen=True)
class Settings:
    url: str
    api_key: str
    socket: Path | None = None

    def lines(self) -> list[str]:
        """What a client sets: one `NAME=value` a line."""
        return [f"E2B_API_URL={self.url}", f"E2B_SANDBOX_URL={self.url}", f"E2B_API_KEY={self.api_key}"]


def running() -> dict[str, object] | None:
    """The serve that runs for this account, if one does (its pid, URL and socket; not its key)."""
    try:
        found = json.loads(paths.serve_file().read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict) or not pids.alive(found.get("pid"), found.get("start")):
        return None
    return found


def refuse_sudo() -> None:
    """`serve` runs as the account it serves, never under sudo: its threads must never take on another
    account's identity (sudo's file work switches the whole process), and a key handed out under sudo would
    drive sessions as root."""
    who = sudo_invoker()
    if who is not None:
        raise VmsandboxError(
            f"`vmsandbox serve` runs as the account it serves, not under sudo (you are {who.pw_name})",
            hint="run `vmsandbox serve` as yourself; `sudo vmsandbox host setup` once lets your account use libvirt",
        )


def refuse_second() -> None:
    found = running()
    if found is None:
        return
    where = f"{found.get('url')}" + (f" and {found['socket']}" if found.get("socket") else "")
    raise VmsandboxError(
        f"`vmsandbox serve` already runs for this account (pid {found.get('pid')}) at {where}",
        hint=f"use that one (its key is what it printed), or stop it (`kill {found.get('pid')}`) and start again",
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


@contextlib.contextmanager
def announced(settings: Settings) -> Iterator[None]:
    """The serve file, for as long as this server runs (0600; the URL and socket, never the key)."""
    target = paths.serve_file()
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    data = {"pid": os.getpid(), "start": pids.process_start(os.getpid()), "url": settings.url}
    data["socket"] = str(settings.socket) if settings.socket else None
    fresh = target.with_name(f".{target.name}.{os.getpid()}")
    fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(data, out)
    fresh.replace(target)
    try:
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            if json.loads(target.read_text()).get("pid") == os.getpid():
                target.unlink()


def serve(backend: Backend, *, port: int, unix: Path | None, ready: Callable[[Settings], None]) -> None:
    """Serve until interrupted; `ready` gets the settings once the sockets listen."""
    import uvicorn

    refuse_second()
    refuse_sudo()
    tcp = listen_tcp(port)
    sockets = [*tcp, *([listen_unix(unix)] if unix is not None else [])]
    bound = tcp[0].getsockname()[1]
    settings = Settings(f"http://127.0.0.1:{bound}", KEY_PREFIX + secrets.token_urlsafe(32), unix)
    try:
        with announced(settings):
            ready(settings)
            asgi = app.make(backend, api_key=settings.api_key, port=bound)
            config = uvicorn.Config(
                asgi,
                http=PeerCheckedH11,
                log_level="warning",
                access_log=False,
                log_config=None,
                lifespan="on",
                limit_concurrency=LIMIT_CONNECTIONS,
            )  # log_config=None: its errors go to our log (stderr, -v), not to a configuration of its own
            uvicorn.Server(config).run(sockets=sockets)
    finally:
        if unix is not None:
            with contextlib.suppress(OSError):
                unix.unlink()
