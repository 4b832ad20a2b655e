"""`vmsandbox serve`: the settings it prints, one server per account (the second says where the first is), the
Unix socket (0600, only this account), the key kept out of every file; and the command refusing to start while
no backend is bound."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from tests.unit.apiserver import served, wait_until
from tests.unit.fakebackend import FakeBackend
from tests.unit.test_cli import run_cli
from vmsandbox import paths, pids
from vmsandbox.api import server
from vmsandbox.errors import VmsandboxError


def test_the_command_serves_the_cores_sessions_and_refuses_a_bad_port(monkeypatch: pytest.MonkeyPatch) -> None:
    from vmsandbox.cli import serve as command
    from vmsandbox.core.sandbox.backend import SessionBackend

    served: list[object] = []
    monkeypatch.setattr(server, "serve", lambda backend, **_: served.append(backend))
    assert run_cli(["serve"]) == 0
    assert len(served) == 1 and isinstance(served[0], SessionBackend)
    assert isinstance(command.core_backend(), SessionBackend)
    assert run_cli(["serve", "--port", "70000"]) == 2


def test_the_settings_are_what_e2bs_sdk_reads() -> None:
    settings = server.Settings("http://127.0.0.1:1234", "vmsb_k")
    assert settings.lines() == [
        "E2B_API_URL=http://127.0.0.1:1234",
        "E2B_SANDBOX_URL=http://127.0.0.1:1234",
        "E2B_API_KEY=vmsb_k",
    ]


def test_a_second_serve_says_where_the_first_is() -> None:
    with server.announced(server.Settings("http://127.0.0.1:1234", "vmsb_secret", Path("/run/x.sock"))):
        written = paths.serve_file()
        assert stat.S_IMODE(written.stat().st_mode) == 0o600
        assert "vmsb_secret" not in written.read_text()
        with pytest.raises(VmsandboxError, match=r"already runs .* at http://127.0.0.1:1234 and /run/x.sock") as exc:
            server.refuse_second()
        assert f"kill {os.getpid()}" in (exc.value.hint or "")
    assert not written.exists()
    written.write_text(json.dumps({"pid": os.getpid(), "start": "not-its-start", "url": "http://old"}))
    server.refuse_second()  # a file a dead serve left: no longer true, not in the way


def test_the_unix_socket_is_private_and_nothing_else_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "api.sock"
    with server.listen_unix(path):
        assert stat.S_ISSOCK(path.lstat().st_mode) and stat.S_IMODE(path.lstat().st_mode) == 0o600
        with pytest.raises(VmsandboxError, match="something listens"):
            server.listen_unix(path)
    server.listen_unix(path).close()  # a stale socket (nothing listening) is replaced
    (tmp_path / "file").write_text("mine")
    with pytest.raises(VmsandboxError, match="is not a socket"):
        server.listen_unix(tmp_path / "file")


def test_serve_serves_on_loopback_and_the_socket_until_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[uvicorn.Server] = []

    class Recorded(uvicorn.Server):
        def __init__(self, config: uvicorn.Config) -> None:
            super().__init__(config)
            made.append(self)

    monkeypatch.setattr(uvicorn, "Server", Recorded)
    backend = FakeBackend(tmp_path / "guests")
    ready: list[server.Settings] = []
    sock = tmp_path / "api.sock"
    kwargs: dict[str, Any] = {"port": 0, "unix": sock, "ready": ready.append}
    thread = threading.Thread(target=server.serve, args=(backend,), kwargs=kwargs, daemon=True)
    thread.start()
    wait_until(lambda: bool(ready and made), "serve is ready")
    settings = ready[0]
    assert settings.api_key.startswith("vmsb_") and settings.url.startswith("http://127.0.0.1:")
    headers = {"X-API-Key": settings.api_key}
    assert httpx.get(f"{settings.url}/v2/sandboxes", headers=headers).json() == []
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock))) as local:
        assert local.get("http://localhost/v2/sandboxes", headers=headers).json() == []
        assert local.get("http://localhost/v2/sandboxes").status_code == 401
    assert json.loads(paths.serve_file().read_text())["pid"] == os.getpid()
    assert pids.alive(os.getpid(), pids.process_start(os.getpid()))
    made[0].should_exit = True
    thread.join(30)
    assert not thread.is_alive() and not paths.serve_file().exists() and not sock.exists()


def test_a_session_the_api_did_not_make_has_no_end_and_is_never_reaped(tmp_path: Path) -> None:
    """A person's session (made at the terminal, no end kept for it) is listed with no end: `connect` to it
    gives it none, `set_timeout` is refused with what to do, and the reaper of a `serve` running beside it never
    ends it, however late it is. A paused API sandbox has no end either: resumed by a person, it is theirs."""
    from datetime import UTC, datetime, timedelta

    from vmsandbox.api.plane.control import sweep
    from vmsandbox.core.sandbox import backend as core
    from vmsandbox.core.sandbox.names import SessionName

    assert core._when(None) == core.NO_END and core._when("not a time") == core.NO_END
    assert core._when("2026-12-05T10:00:00+00:00") == datetime(2026, 12, 5, 10, tzinfo=UTC)
    later = datetime.now(UTC) + timedelta(days=365 * 100)
    with served(tmp_path / "guests") as api:
        api.backend.adopt(SessionName("mine"))
        api.backend.pause(SessionName("mine"))
        assert httpx.post(f"{api.url}/v2/sandboxes/mine/connect", headers=api.headers, json={}).status_code == 201
        answer = httpx.post(f"{api.url}/sandboxes/mine/timeout", headers=api.headers, json={"timeout": 1})
        assert answer.status_code == 409 and "vmsandbox rm mine" in answer.json()["message"]
        made = httpx.post(f"{api.url}/v2/sandboxes", headers=api.headers, json={"templateID": "base", "timeout": 60})
        name = SessionName(made.json()["sandboxID"])
        assert httpx.post(f"{api.url}/sandboxes/{name}/pause", headers=api.headers).status_code == 204
        api.backend.resume(name)  # a person's `vmsandbox start`, a day later
        assert sweep(api.backend, later) == []
        assert httpx.post(f"{api.url}/sandboxes/{name}/timeout", headers=api.headers, json={"timeout": 1}).is_success
        assert sweep(api.backend, later) == [name]  # the API's own, given an end again: ended at it


def test_serve_refuses_to_run_under_sudo(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under sudo, the file work done as the invoking user switches the whole process's identity: a threaded
    server would serve, for that moment, as the other account. It runs as the account it serves instead."""
    import pwd

    monkeypatch.setattr(server, "sudo_invoker", lambda: pwd.getpwuid(os.getuid()))
    with pytest.raises(VmsandboxError, match="not under sudo") as exc:
        server.refuse_sudo()
    assert "run `vmsandbox serve` as yourself" in (exc.value.hint or "")
