"""Loopback stand-ins for the egress tests: HTTP and HTTPS upstreams on 127.0.0.1 (with a test CA), and a
listener that records any connection reaching it. Nothing here listens on or connects to anything else."""

from __future__ import annotations

import contextlib
import http.server
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from vmsandbox.egress.relay.certs import Issuer, create_ca

LOOPBACK = "127.0.0.1"
STANDIN_DOMAIN = "up.example.com"  # the names of the stand-ins: never looked up, the test resolver maps them
BIG = 8 * 1024**2  # the size of a stand-in's answer to /big


def standin(name: str) -> str:
    return f"{name}.{STANDIN_DOMAIN}"


@dataclass
class Upstream:
    name: str
    port: int
    requests: list[dict[str, str]] = field(default_factory=list)  # headers of each request seen

    @property
    def mapping(self) -> str:
        """NAME=PORT, as the stand-in daemon takes it."""
        return f"{self.name}={self.port}"


def _handler(upstream: Upstream) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _reply(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body_in = self.rfile.read(length) if length else b""
            upstream.requests.append({k.lower(): v for k, v in self.headers.items()} | {":path": self.path})
            body = f"hello from {upstream.name} {self.command} {self.path} {len(body_in)}\n".encode()
            if self.path == "/big":  # an answer more than a guest's buffers take, for one that reads nothing
                body = b"x" * BIG
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            with contextlib.suppress(ConnectionError):  # (a guest that reads nothing: the proxy dropped it)
                self.wfile.write(body)

        do_GET = _reply  # noqa: N815 - http.server's names
        do_POST = _reply  # noqa: N815

        def log_message(self, format: str, *args: object) -> None:
            return

    return Handler


@contextmanager
def http_upstream(name: str, tls: ssl.SSLContext | None = None) -> Iterator[Upstream]:
    server = http.server.ThreadingHTTPServer((LOOPBACK, 0), http.server.BaseHTTPRequestHandler)
    upstream = Upstream(name, server.server_address[1])
    server.RequestHandlerClass = _handler(upstream)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield upstream
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class UpstreamCA:
    cert: Path
    key: Path

    def server_context(self, host: str) -> ssl.SSLContext:
        return Issuer(self.cert, self.key).context(host)


def make_ca(directory: Path, label: str, hosts: list[str]) -> UpstreamCA:
    directory.mkdir(parents=True, exist_ok=True)
    ca = UpstreamCA(directory / f"{label}.pem", directory / f"{label}.key")
    create_ca(ca.cert, ca.key, session=label, hosts=hosts)
    return ca


class Recorder:
    """Accepts on 127.0.0.1 and records every connection: proof that a refused request leaked, if it did."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind((LOOPBACK, 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.hits = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.hits += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def use_standin_daemon(
    session: str,
    files_root: Path,
    upstreams: list[Upstream],
    ca: Path,
    env: dict[str, str],
    limits: dict[str, float] | None = None,
) -> int:
    """Replace a session's egress daemon by the stand-in one (standin_daemon.py, with `limits`: fields of
    egress.rules.limits.Limits); wait until the guest's door is open again. Its pid."""
    import subprocess
    import sys
    import time

    from vmsandbox import paths
    from vmsandbox.egress import control
    from vmsandbox.egress.control import Door

    files = paths.SessionPaths(files_root)
    control.stop(files)
    files.egress_state.unlink(missing_ok=True)
    table = ",".join(u.mapping for u in upstreams)
    repo = Path(__file__).resolve().parents[2]
    argv = [sys.executable, "-m", "tests.integration.standin_daemon", session, table, str(ca)]
    with files.egress_log.open("ab") as log:
        child = subprocess.Popen(
            [*argv, json.dumps(limits or {})],
            cwd=repo,
            env=env,
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    assert child.stdin is not None
    with child.stdin:  # as the product's: its uid and its session's secrets, nothing else
        child.stdin.write(control.handover(files))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = control.daemon_state(files)
        if state is not None and state.pid == child.pid and state.forward is Door.UP:
            return child.pid
        if child.poll() is not None:
            break
        time.sleep(0.1)
    raise AssertionError(f"the stand-in egress daemon did not open the door: {files.egress_log.read_text()[-2000:]}")
