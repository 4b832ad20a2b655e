"""E2B's own SDK (the `e2b` package from PyPI, unchanged) drives `vmsandbox serve`'s API, here over the fake
backend: create, commands (streamed output, exit codes, background, stdin, kill), files, list, pause and connect
with a process kept, timeouts, snapshots, kill; and each refusal as the SDK's own exception, naming the fix."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from tests.unit.apiserver import Served, point_sdk, served, wait_until
from vmsandbox.api.envd.connect import Call
from vmsandbox.api.envd.process import follow
from vmsandbox.api.envd.wire import Message
from vmsandbox.api.plane.control import sweep
from vmsandbox.core.sandbox.model import Chunk, Exit, Output, Stream
from vmsandbox.core.sandbox.names import SessionName

e2b = pytest.importorskip("e2b", reason="E2B's SDK is a dev dependency (pip install -e '.[dev]')")
from e2b import (  # noqa: E402
    AuthenticationException,
    CommandExitException,
    FileNotFoundException,
    InvalidArgumentException,
    NotFoundException,
    Sandbox,
    SandboxException,
    SandboxNotFoundException,
    SandboxQuery,
    SandboxState,
)
from e2b.exceptions import SandboxNotRunningException, TimeoutException  # noqa: E402


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    with served(tmp_path / "guests") as s:
        point_sdk(monkeypatch, s)
        yield s


@pytest.fixture
def sbx(api: Served) -> Sandbox:
    return Sandbox.create("base")


def test_a_command_streams_its_output_in_order_and_gives_its_exit_code(sbx: Sandbox) -> None:
    out: list[str] = []
    err: list[str] = []
    result = sbx.commands.run(
        "for i in 1 2 3; do echo line$i; done; echo oops >&2", on_stdout=out.append, on_stderr=err.append
    )
    assert result.exit_code == 0
    assert result.stdout == "line1\nline2\nline3\n" == "".join(out)
    assert result.stderr == "oops\n" == "".join(err)


def test_a_non_zero_exit_is_raised_as_the_sdk_raises_it(sbx: Sandbox) -> None:
    with pytest.raises(CommandExitException) as failed:
        sbx.commands.run("echo partial; echo broken >&2; exit 3")
    assert failed.value.exit_code == 3
    assert failed.value.stdout == "partial\n" and failed.value.stderr == "broken\n"


def test_environment_cwd_and_a_large_output(sbx: Sandbox) -> None:
    sbx.files.make_dir("work")
    result = sbx.commands.run('echo "$GREETING"; pwd', envs={"GREETING": "hello"}, cwd="/home/user/work")
    assert result.stdout.splitlines()[0] == "hello"
    assert result.stdout.strip().endswith("/home/user/work")
    big = sbx.commands.run("head -c 3000000 /dev/zero | tr '\\0' x")
    assert big.stdout == "x" * 3_000_000


def test_a_background_command_takes_stdin_and_is_killed(sbx: Sandbox) -> None:
    handle = sbx.commands.run("cat", background=True, stdin=True)
    assert handle.pid in [p.pid for p in sbx.commands.list()]
    handle.send_stdin("hello\n")
    seen = ""
    for stdout, _stderr, _pty in handle:
        seen += stdout or ""
        if "hello" in seen:
            break
    assert handle.kill() is True
    with pytest.raises(CommandExitException) as ended:
        handle.wait()
    assert ended.value.exit_code == -1
    wait_until(lambda: handle.pid not in [p.pid for p in sbx.commands.list()], "the killed command is gone")
    assert sbx.commands.kill(handle.pid) is False  # not found: the SDK's False


def test_closing_stdin_ends_a_command_that_reads_to_the_end(sbx: Sandbox) -> None:
    handle = sbx.commands.run("wc -c", background=True, stdin=True)
    handle.send_stdin(b"12345")
    sbx.commands.stream_input(handle.pid, [b"678", "90"])  # one input stream (client streaming)
    handle.close_stdin()
    assert handle.wait().stdout.strip() == "10"


def test_a_command_outlives_the_client_that_started_it(sbx: Sandbox) -> None:
    handle = sbx.commands.run("cat", background=True, stdin=True)
    handle.disconnect()  # the stream goes; the process does not
    assert handle.pid in [p.pid for p in sbx.commands.list()]
    again = sbx.commands.connect(handle.pid)
    sbx.commands.send_stdin(handle.pid, "still here\n")
    for stdout, _stderr, _pty in again:
        if stdout and "still here" in stdout:
            break
    sbx.commands.close_stdin(handle.pid)
    assert again.wait().exit_code == 0


def test_a_command_past_its_timeout_is_killed(sbx: Sandbox) -> None:
    handle = sbx.commands.run("cat", background=True, stdin=True, timeout=1)
    with pytest.raises((TimeoutException, CommandExitException)):
        handle.wait()  # the deadline ends the stream (the SDK's own deadline or ours)
    wait_until(lambda: handle.pid not in [p.pid for p in sbx.commands.list()], "the command is killed at its timeout")


def test_files_written_read_listed_moved_and_removed(sbx: Sandbox) -> None:
    info = sbx.files.write("notes/a.txt", "alpha\n")
    assert info.path == "/home/user/notes/a.txt"
    assert sbx.files.read("/home/user/notes/a.txt") == "alpha\n"
    assert sbx.commands.run("cat notes/a.txt").stdout == "alpha\n"  # the same file the commands see
    sbx.files.write("notes/b.bin", io.BytesIO(b"\x00\x01binary"))  # a stream: application/octet-stream
    sbx.files.write("notes/c.txt", "zipped", gzip=True)
    assert sbx.files.read("notes/b.bin", format="bytes") == bytearray(b"\x00\x01binary")
    assert sbx.files.read("notes/c.txt") == "zipped"
    assert sorted(e.name for e in sbx.files.list("notes")) == ["a.txt", "b.bin", "c.txt"]
    assert sbx.files.make_dir("notes/sub") is True
    assert sbx.files.make_dir("notes/sub") is False  # exists
    assert [e.name for e in sbx.files.list("notes", depth=2) if e.path.endswith("sub")] == ["sub"]
    moved = sbx.files.rename("notes/a.txt", "notes/sub/a.txt")
    assert moved.path == "/home/user/notes/sub/a.txt"
    assert sbx.files.exists("notes/sub/a.txt") and not sbx.files.exists("notes/a.txt")
    sbx.files.remove("notes/sub")
    assert not sbx.files.exists("notes/sub/a.txt")
    with pytest.raises(FileNotFoundException):
        sbx.files.read("notes/sub/a.txt")


def test_list_pause_and_connect_keep_a_background_process(sbx: Sandbox) -> None:
    assert [s.sandbox_id for s in Sandbox.list().next_items()] == [sbx.sandbox_id]
    tagged = Sandbox.create("base", metadata={"team": "a b&c"})
    found = Sandbox.list(query=SandboxQuery(metadata={"team": "a b&c"})).next_items()
    assert [(s.sandbox_id, s.metadata) for s in found] == [(tagged.sandbox_id, {"team": "a b&c"})]
    tagged.kill()
    handle = sbx.commands.run("cat", background=True, stdin=True)
    handle.disconnect()
    sbx.pause()
    paused = Sandbox.list().next_items()
    assert [s.state for s in paused] == [SandboxState.PAUSED]
    with pytest.raises(SandboxNotRunningException, match="was not found running"):
        sbx.commands.run("true")
    again = Sandbox.connect(sbx.sandbox_id)
    assert again.get_info().state is SandboxState.RUNNING
    assert handle.pid in [p.pid for p in again.commands.list()]  # the process came back with the session
    assert again.commands.kill(handle.pid) is True


def test_set_timeout_moves_the_end_and_the_reaper_ends_it(api: Served, sbx: Sandbox) -> None:
    before = sbx.get_info().end_at
    sbx.set_timeout(3600)
    later = sbx.get_info().end_at
    assert later > before
    assert sweep(api.backend, datetime.now(UTC)) == []  # not yet
    assert sweep(api.backend, later + timedelta(seconds=1)) == [SessionName(sbx.sandbox_id)]
    assert api.backend.ended == [sbx.sandbox_id]
    assert not sbx.is_running()


def test_snapshots_are_checkpoints_and_a_sandbox_made_from_one_is_a_fork(sbx: Sandbox) -> None:
    sbx.files.write("kept.txt", "from the checkpoint")
    snapshot = sbx.create_snapshot("before")
    assert snapshot.snapshot_id == f"{sbx.sandbox_id}:before" and snapshot.names == ["before"]
    listed = sbx.list_snapshots().next_items()  # type: ignore[misc]  # (the SDK types its dual method for the class)
    assert [s.snapshot_id for s in listed] == [snapshot.snapshot_id]
    sbx.files.write("kept.txt", "changed after")
    forked = Sandbox.create(snapshot.snapshot_id)
    assert forked.sandbox_id != sbx.sandbox_id
    assert forked.files.read("kept.txt") == "from the checkpoint"


def test_kill_ends_it_and_it_is_gone(sbx: Sandbox) -> None:
    assert sbx.kill() is True
    assert Sandbox.list().next_items() == []
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sbx.sandbox_id)
    assert Sandbox.kill(sbx.sandbox_id) is False
    with pytest.raises(SandboxNotRunningException):
        sbx.commands.run("true")


def test_refusals_are_the_sdks_exceptions_naming_the_fix(api: Served, sbx: Sandbox) -> None:
    with pytest.raises(AuthenticationException, match="E2B_API_KEY"):
        Sandbox.list(api_key="not-the-key").next_items()
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect("no-such-session")
    with pytest.raises(SandboxException, match="not a session name") as bad:
        Sandbox.get_info("Not_A_Name!")
    assert "lowercase" in str(bad.value)  # the rule, with the fix
    with pytest.raises(SandboxException, match="not a blueprint name"):
        Sandbox.create("Base Image")
    with pytest.raises(InvalidArgumentException, match=r"\.\."):
        sbx.files.read("../etc/passwd")
    with pytest.raises(InvalidArgumentException, match=r"\.\."):
        sbx.files.list("/home/../etc")
    sbx.commands.run("ln -s / escape")  # a symlink out of the guest: a path the backend refuses
    with pytest.raises(InvalidArgumentException, match="outside what the guest can name"):
        sbx.files.read("escape/etc/passwd")
    with pytest.raises(InvalidArgumentException, match="no account"):
        sbx.commands.run("true", user="nobody")
    with pytest.raises(SandboxException, match="network settings"):
        Sandbox.create("base", allow_internet_access=False)


def test_without_a_key_the_sdk_refuses_and_the_server_too(api: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("E2B_API_KEY")
    with pytest.raises(AuthenticationException):
        Sandbox.list().next_items()  # the SDK's own refusal, before it sends anything
    answer = httpx.get(f"{api.url}/v2/sandboxes")
    assert answer.status_code == 401
    assert answer.json()["message"].startswith("no API key") and "E2B_API_KEY" in answer.json()["hint"]


def test_envd_side_needs_the_sandboxs_access_token(api: Served, sbx: Sandbox) -> None:
    url = f"{api.url}/process.Process/List"
    headers = {"Content-Type": "application/json", "E2b-Sandbox-Id": sbx.sandbox_id}
    answer = httpx.post(url, content=b"{}", headers=headers)
    assert answer.status_code == 401 and answer.json()["code"] == "unauthenticated"
    answer = httpx.post(url, content=b"{}", headers=headers | {"X-Access-Token": "guess"})
    assert answer.status_code == 401 and "Sandbox.connect" in answer.json()["message"]
    with pytest.raises(NotFoundException):
        sbx.commands.connect(999_999_999)


def test_the_async_sdk_drives_it_too(api: Served) -> None:
    from e2b import AsyncSandbox

    async def flow() -> tuple[str, str]:
        sandbox = await AsyncSandbox.create("base")
        await sandbox.files.write("a.txt", "async")
        result = await sandbox.commands.run("cat a.txt")
        text = await sandbox.files.read("a.txt")
        await sandbox.kill()
        return result.stdout, text

    assert asyncio.run(flow()) == ("async", "async")


def test_a_quiet_stream_gets_keepalives_and_ends_with_the_exit() -> None:
    class Quiet:
        calls = 0

        def output(self, pid: int, cursor: int | None, wait: float) -> Output:
            self.calls += 1
            if self.calls < 3:
                return Output((), 0)
            return Output((Chunk(Stream.STDOUT, b"late"),), 1, Exit(0, "exit status 0"))

    call = Call(SessionName("s"), None, None, keepalive=0.0)

    async def events() -> list[Message]:
        return [e async for e in follow(Quiet(), 7, 0, call)]  # type: ignore[arg-type]

    assert asyncio.run(events()) == [
        {"event": {"start": {"pid": 7}}},
        {"event": {"keepalive": {}}},
        {"event": {"keepalive": {}}},
        {"event": {"data": {"stdout": "bGF0ZQ=="}}},
        {"event": {"end": {"exitCode": 0, "exited": True, "status": "exit status 0"}}},
    ]
