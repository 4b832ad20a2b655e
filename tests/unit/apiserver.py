"""The API served for a test: the real app and uvicorn with the peer check, on a free port of 127.0.0.1, in a
thread, over the fake backend; and the settings E2B's SDK reads, pointed at it."""

from __future__ import annotations

import contextlib
import secrets
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import uvicorn

from tests.unit.fakebackend import FakeBackend
from vmsandbox.api import app, running, server
from vmsandbox.api.peer import PeerCheckedH11

WAIT = 30.0  # the longest a test waits for a condition


@dataclass(frozen=True)
class Served:
    url: str
    key: str
    port: int
    backend: FakeBackend

    @property
    def headers(self) -> dict[str, str]:
        return {"X-API-Key": self.key}


@contextlib.contextmanager
def served(root: Path) -> Iterator[Served]:
    backend = FakeBackend(root)
    socks = server.listen_tcp(0)  # listening before the thread starts: a client's first request queues
    port = socks[0].getsockname()[1]
    key = "test-" + secrets.token_urlsafe(16)
    asgi = app.make(backend, api_key=key, port=port, reap=False)
    config = uvicorn.Config(
        asgi, http=PeerCheckedH11, log_level="warning", access_log=False, log_config=None, timeout_graceful_shutdown=5
    )
    running = uvicorn.Server(config)
    thread = threading.Thread(target=running.run, kwargs={"sockets": socks}, daemon=True)
    thread.start()
    try:
        yield Served(f"http://127.0.0.1:{port}", key, port, backend)
    finally:
        running.should_exit = True
        thread.join(WAIT)
        backend.close()
        for sock in socks:
            sock.close()


def point_sdk(monkeypatch: pytest.MonkeyPatch, s: Served) -> None:
    """E2B's SDK, configured as `vmsandbox serve` tells a user to configure it."""
    for name, value in running.Settings(s.url, s.key).variables().items():
        monkeypatch.setenv(name, value)
    for name in ("E2B_DEBUG", "E2B_HTTP_VERSION", "E2B_ACCESS_TOKEN"):
        monkeypatch.delenv(name, raising=False)


def wait_until(condition: Callable[[], bool], what: str) -> None:
    """Wait for a condition (it is looked at again whenever a short wait passes), up to WAIT seconds."""
    pause = threading.Event()
    deadline = threading.Timer(WAIT, pause.set)
    deadline.start()
    try:
        while not condition():
            if pause.wait(0.02):
                raise AssertionError(f"not within {WAIT:g} s: {what}")
    finally:
        deadline.cancel()
