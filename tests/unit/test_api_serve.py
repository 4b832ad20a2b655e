"""`vmsandbox serve`: the settings it prints (`export` lines a shell evaluates), one server per account (the second
says where the first is), `serve --env` reading the running one's 0600 env file, a key kept across restarts only
with --keep-key, the Unix socket (0600, only this account), never as root; the domain it answers, where E2B's SDK
goes when E2B_SANDBOX_URL (or E2B_API_URL) is missing (nowhere: a `.invalid` name); and the command refusing
options that do not go together."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import socket
import stat
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import uvicorn

from tests.unit.apiserver import served, wait_until
from tests.unit.fakebackend import FakeBackend
from tests.unit.test_cli import run_cli
from vmsandbox import pids
from vmsandbox.api import running, servefiles, server
from vmsandbox.api.plane.controlwire import SANDBOX_DOMAIN
from vmsandbox.errors import VmsandboxError

KEY = "vmsb_" + "k" * 43
SETTINGS = running.Settings("http://127.0.0.1:1234", KEY, Path("/run/x.sock"))


def test_the_command_serves_the_cores_sessions_and_refuses_what_does_not_go_together(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from vmsandbox.cli import serve
    from vmsandbox.core.sandbox.backend import SessionBackend

    served_with: list[tuple[object, dict[str, Any]]] = []
    monkeypatch.setattr(server, "serve", lambda backend, **kw: served_with.append((backend, kw)))
    assert run_cli(["serve", "--keep-key"]) == 0
    [(backend, kw)] = served_with
    assert isinstance(backend, SessionBackend) and kw["keep_key"] is True and kw["port"] == 0
    assert isinstance(serve.core_backend(), SessionBackend)
    assert run_cli(["serve", "--port", "70000"]) == 2
    for wrong in (["--env", "--stop"], ["--env", "--port", "1"], ["--stop", "--detach"], ["--env", "--keep-key"]):
        capsys.readouterr()
        assert run_cli(["serve", *wrong]) == 2, wrong
        assert "--env and --stop go alone" in capsys.readouterr().err
    assert len(served_with) == 1


def test_the_settings_are_shell_lines_e2bs_sdk_reads() -> None:
    assert SETTINGS.variables() == {
        "E2B_API_URL": "http://127.0.0.1:1234",
        "E2B_SANDBOX_URL": "http://127.0.0.1:1234",
        "E2B_API_KEY": KEY,
        "E2B_DOMAIN": running.API_DOMAIN,
    }
    parsed = [shlex.split(line) for line in SETTINGS.exports()]  # as `eval` reads them
    assert parsed == [["export", f"{k}={v}"] for k, v in SETTINGS.variables().items()]
    odd = running.Settings("http://127.0.0.1:1/a b'c", KEY)  # (never made: a value is quoted whatever it holds)
    assert shlex.split(odd.exports()[0]) == ["export", "E2B_API_URL=http://127.0.0.1:1/a b'c"]


def test_a_running_serve_leaves_its_settings_for_serve_env_and_a_second_serve_says_where_it_is(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run_cli(["serve", "--env"]) == 1
    err = capsys.readouterr().err
    assert "no `vmsandbox serve` runs" in err and "vmsandbox serve --detach" in err
    with running.announced(SETTINGS):
        where, env_file = servefiles.serve_file(), servefiles.serve_env_file()
        for made in (where, env_file):
            assert stat.S_IMODE(made.stat().st_mode) == 0o600
        assert KEY not in where.read_text()
        assert f"E2B_API_KEY={KEY}\n" in env_file.read_text()  # a dotenv file: `set -a; . FILE` reads it too
        with pytest.raises(VmsandboxError, match=r"already runs .* at http://127.0.0.1:1234 and /run/x.sock") as exc:
            server.refuse_second()
        assert "vmsandbox serve --env" in (exc.value.hint or "") and "--stop" in (exc.value.hint or "")
        assert running.current() == SETTINGS
        capsys.readouterr()
        assert run_cli(["serve", "--env"]) == 0
        assert capsys.readouterr().out.splitlines() == SETTINGS.exports()
    assert not where.exists() and not env_file.exists()
    where.write_text(json.dumps({"pid": os.getpid(), "start": "not-its-start", "url": "http://old"}))
    server.refuse_second()  # a file a dead serve left: no longer true, not in the way
    with pytest.raises(VmsandboxError, match="no `vmsandbox serve` runs"):
        running.current()


def test_serve_env_trusts_no_env_file_but_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """An env file another account could have written, or that names another server, is not printed for eval."""
    with running.announced(SETTINGS):
        env_file = servefiles.serve_env_file()
        env_file.chmod(0o644)
        with pytest.raises(VmsandboxError, match="not this account's alone") as exc:
            running.current()
        assert f"rm {env_file}" in (exc.value.hint or "")
        env_file.chmod(0o600)
        env_file.write_text(env_file.read_text().replace("127.0.0.1:1234", "127.0.0.1:9"))
        with pytest.raises(VmsandboxError, match="does not match the serve that runs"):
            running.current()
        env_file.unlink()
        env_file.symlink_to(servefiles.serve_file())
        with pytest.raises(VmsandboxError, match="cannot read"):
            running.current()


def test_a_key_is_kept_across_starts_only_while_the_person_asks() -> None:
    first, note = running.api_key(keep=False)
    assert note is None and running.KEY.fullmatch(first) and not servefiles.serve_key_file().exists()
    assert running.api_key(keep=False)[0] != first  # new at each start

    kept, note = running.api_key(keep=True)
    key_file = servefiles.serve_key_file()
    assert "kept in" in (note or "") and stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert key_file.read_text() == kept + "\n"
    assert running.api_key(keep=True) == (kept, None)  # the next start with --keep-key: the same key

    fresh, note = running.api_key(keep=False)  # a start without it: a new key, and the kept one gone
    assert fresh != kept and "is removed" in (note or "") and not key_file.exists()

    key_file.write_text("not a key\n")
    key_file.chmod(0o600)
    replaced, note = running.api_key(keep=True)  # (a file that holds no key of ours: a new one kept)
    assert running.KEY.fullmatch(replaced) and key_file.read_text() == replaced + "\n"
    key_file.chmod(0o640)
    with pytest.raises(VmsandboxError, match="not this account's alone"):
        running.api_key(keep=True)


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
    monkeypatch.setattr(server, "refuse_root", lambda: None)  # (these tests may run as root; the rule: below)
    backend = FakeBackend(tmp_path / "guests")
    ready: list[running.Settings] = []
    sock = tmp_path / "api.sock"
    kwargs: dict[str, Any] = {"port": 0, "unix": sock, "ready": lambda s, _note, _warnings: ready.append(s)}
    thread = threading.Thread(target=server.serve, args=(backend,), kwargs=kwargs, daemon=True)
    thread.start()
    wait_until(lambda: bool(ready and made), "serve is ready")
    settings = ready[0]
    assert running.KEY.fullmatch(settings.api_key) and settings.url.startswith("http://127.0.0.1:")
    headers = {"X-API-Key": settings.api_key}
    assert httpx.get(f"{settings.url}/v2/sandboxes", headers=headers).json() == []
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock))) as local:
        assert local.get("http://localhost/v2/sandboxes", headers=headers).json() == []
        assert local.get("http://localhost/v2/sandboxes").status_code == 401
    assert json.loads(servefiles.serve_file().read_text())["pid"] == os.getpid()
    assert pids.alive(os.getpid(), pids.process_start(os.getpid()))
    assert running.current() == settings
    made[0].should_exit = True
    thread.join(30)
    assert not thread.is_alive() and not servefiles.serve_file().exists() and not sock.exists()
    assert not servefiles.serve_env_file().exists()  # the key is on disk while it serves, and then only with --keep-key


def test_the_sdk_missing_e2b_sandbox_url_or_e2b_api_url_is_sent_nowhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """E2B's SDK builds a sandbox's envd URL from the domain the server answers when E2B_SANDBOX_URL is not set (with
    no domain, `https://sandbox.e2b.app`: E2B's cloud would get the commands, files and envd token); and the control
    plane's from E2B_DOMAIN when E2B_API_URL is not set (`https://api.e2b.app`, for the key). Both are `.invalid`
    names here: they resolve nowhere and no public CA certifies one. (What the SDK then does with them, in a network
    namespace of its own: tests/integration/test_api.py.)"""
    from e2b import ConnectionConfig, Sandbox

    with served(tmp_path / "guests") as api:
        for name in ("E2B_SANDBOX_URL", "E2B_DOMAIN", "E2B_DEBUG", "E2B_ACCESS_TOKEN"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("E2B_API_URL", api.url)
        monkeypatch.setenv("E2B_API_KEY", api.key)
        sbx = Sandbox.create("base")
        assert sbx.sandbox_domain == SANDBOX_DOMAIN
        assert Sandbox.connect(sbx.sandbox_id).sandbox_domain == SANDBOX_DOMAIN  # (connect answers it too)
        for url in (sbx.envd_api_url, sbx.envd_direct_url):
            parts = urlsplit(url)
            assert parts.scheme == "https" and parts.hostname == f"49983-{sbx.sandbox_id}.{SANDBOX_DOMAIN}"
            assert parts.hostname.endswith(".invalid")
        assert "e2b.app" not in sbx.envd_api_url

    for name, value in running.Settings("http://127.0.0.1:1", KEY).variables().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("E2B_API_URL")  # the settings with E2B_API_URL lost on the way
    api_host = urlsplit(ConnectionConfig().api_url).hostname or ""
    assert api_host == f"api.{running.API_DOMAIN}" and api_host.endswith(".invalid")
    assert ConnectionConfig().get_sandbox_url("s", "").startswith("http://127.0.0.1:1")  # (E2B_SANDBOX_URL still set)


def test_serve_refuses_root_and_sudo(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Root's key would drive sessions as root, and the kernel's socket table names root for connections no
    process holds (another account passes for root); under sudo, the file work done as the invoking user switches
    the whole process's identity. It runs as the account it serves, and says how."""
    import pwd

    monkeypatch.setattr(server, "sudo_invoker", lambda: None)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    with pytest.raises(VmsandboxError, match="does not run as root") as exc:
        server.refuse_root()
    assert "your own account" in (exc.value.hint or "") and "vmsandbox host setup" in (exc.value.hint or "")
    ready: list[object] = []
    with pytest.raises(VmsandboxError, match="does not run as root"):
        server.serve(FakeBackend(tmp_path / "guests"), port=0, unix=None, ready=lambda *a: ready.append(a))
    assert ready == [] and not servefiles.serve_file().exists() and not servefiles.serve_env_file().exists()

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    server.refuse_root()
    monkeypatch.setattr(server, "sudo_invoker", lambda: pwd.getpwuid(os.getuid()))
    with pytest.raises(VmsandboxError, match="not under sudo") as exc:
        server.refuse_root()
    assert "run `vmsandbox serve` as yourself" in (exc.value.hint or "")


def test_a_session_the_api_did_not_make_has_no_end_and_is_never_reaped(tmp_path: Path) -> None:
    """A person's session (made at the terminal, no end kept for it) is listed with no end: `connect` to it
    gives it none, `set_timeout` is refused with what to do, and the reaper of a `serve` running beside it never
    ends it, however late it is. A paused API sandbox has no end either: resumed by a person, it is theirs."""
    from datetime import UTC, datetime, timedelta

    from vmsandbox.api.plane.control import sweep
    from vmsandbox.core.sandbox import backend
    from vmsandbox.core.sandbox.names import SessionName

    assert backend._when(None) == backend.NO_END and backend._when("not a time") == backend.NO_END
    assert backend._when("2026-12-05T10:00:00+00:00") == datetime(2026, 12, 5, 10, tzinfo=UTC)
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


def _left_by_a_killed_serve(url: str = "http://127.0.0.1:4321") -> None:
    """serve.json and serve.env as a serve killed with SIGKILL leaves them (its process gone, its key on disk)."""
    servefiles.serve_file().parent.mkdir(parents=True, exist_ok=True)
    servefiles.serve_file().write_text(json.dumps({"pid": os.getpid(), "start": "a dead one's", "url": url}))
    env = "".join(f"{k}={v}\n" for k, v in running.Settings(url, KEY).variables().items())
    servefiles.serve_env_file().write_text(env)
    servefiles.serve_env_file().chmod(0o600)


def test_settings_no_live_serve_backs_are_removed_by_the_next_env_stop_or_start(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A serve killed with SIGKILL (or a crash, a power cut) cannot remove its env file, key included: the account's
    next `serve --env`, `serve --stop` or serve removes it, and says which URL shells may still point at."""
    for command in (["serve", "--env"], ["serve", "--stop"]):
        _left_by_a_killed_serve()
        capsys.readouterr()
        assert run_cli(command) == 1
        err = capsys.readouterr().err
        assert "no `vmsandbox serve` runs" in err and "ended without stopping" in err and "127.0.0.1:4321" in err
        assert not servefiles.serve_env_file().exists() and not servefiles.serve_file().exists()
    _left_by_a_killed_serve()
    with running.announced(SETTINGS):  # a start: the new serve's own settings, none of the old
        assert servefiles.serve_env_file().read_text().count("E2B_API_URL=") == 1 and running.current() == SETTINGS
    assert running.forget_stale() is None  # nothing left to remove


def test_a_running_serve_holds_its_settings_against_a_sweep_and_a_second_serve() -> None:
    """serve.port is locked while a serve runs: no sweep takes its files, no second serve announces itself (two
    started at once); it says the serve's port for the next start, and stays when the serve has stopped."""
    with running.announced(SETTINGS):
        assert running.forget_stale() is None and servefiles.serve_env_file().exists()
        with pytest.raises(VmsandboxError, match="already runs"), running.announced(SETTINGS):
            pass
        assert running.current() == SETTINGS  # (the second one's failure removed nothing)
    assert running.last_port() == 1234 and not servefiles.serve_env_file().exists()
    servefiles.serve_port_file().write_text("not a port\n")
    assert running.last_port() == 0


def test_stop_prints_unset_lines_and_says_where_old_shells_point(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`eval "$(vmsandbox serve --stop)"` clears the settings in that shell (and in any other, whether a serve still
    runs or not); stderr says that shells which keep them point at a port any account may take."""
    assert [shlex.split(line) for line in running.unsets()] == [["unset", name] for name in running.NAMES]
    monkeypatch.setattr(running, "stop", lambda: (4242, "http://127.0.0.1:4321"))
    capsys.readouterr()
    assert run_cli(["serve", "--stop"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == running.unsets()
    assert "(pid 4242) stopped" in err and "http://127.0.0.1:4321" in err and "any account" in err
    assert 'eval "$(vmsandbox serve --stop)"' in err
    assert run_cli(["serve", "--env", "--stop"]) == 2  # (it still goes alone)


def test_a_serve_takes_its_last_port_back_or_says_another_program_holds_it() -> None:
    """Shells set up for the last serve point at its port: the next one listens there while it is free (whatever
    --port is not given), else on a free one, saying that the old port is someone else's now."""
    with contextlib.closing(socket.socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        last = probe.getsockname()[1]
    servefiles.serve_port_file().parent.mkdir(parents=True, exist_ok=True)
    servefiles.serve_port_file().write_text(f"{last}\n")
    servefiles.serve_port_file().chmod(0o600)
    socks, notes = server.listen_again(0)
    assert socks[0].getsockname()[1] == last and notes == []
    try:
        moved, notes = server.listen_again(0)  # (held now: by that first socket, as by another account's)
        assert moved[0].getsockname()[1] != last and len(notes) == 1
        assert f"127.0.0.1:{last}" in notes[0] and "taken by another program" in notes[0]
        for sock in moved:
            sock.close()
        with pytest.raises(VmsandboxError, match=f"cannot listen on 127.0.0.1:{last}"):
            server.listen_again(last)  # a port asked for is that port or nothing
    finally:
        for sock in socks:
            sock.close()
