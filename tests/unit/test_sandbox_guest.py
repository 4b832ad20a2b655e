"""What the API's host side takes from a hostile guest (core/sandbox/processes.py, files.py): the guest is root,
so it answers every `follow`, `ls` and `cat` as it likes. Its output records are held to the framing its runner
writes, memory and readers stay bounded, a process that is not there is said so, a silent guest is not waited
on for good, and its words reach a client as their characters are. No VM: the guest's answers are made here."""

from __future__ import annotations

import io
import json
import os
import struct
import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from vmsandbox import proc
from vmsandbox.core import views
from vmsandbox.core.sandbox import files, processes
from vmsandbox.core.sandbox.interface import NotFoundError, RefusedError
from vmsandbox.core.sandbox.model import Entry, EntryType
from vmsandbox.core.sandbox.names import GuestPath
from vmsandbox.sync.review.plan import Item
from vmsandbox.sync.review.threeway import Change, Status

HEAD = struct.Struct(">BI")
ENDED = json.dumps({"code": 0, "status": "exit status 0"}).encode()


def record(kind: int, data: bytes) -> bytes:
    return HEAD.pack(kind, len(data)) + data


class Endpoint:
    def ssh_argv(self, *args: str, user: str) -> list[str]:
        return ["ssh", *args, f"{user}@guest"]


class Child:
    """What proc.start returns: the guest's answer on stdout, the ssh's exit code."""

    def __init__(self, stdout: Any, code: int = 0) -> None:
        self.stdout, self.code, self.returncode = stdout, code, None
        self.killed = False

    def kill(self) -> None:
        self.killed = True

    def wait(self, timeout: float | None = None) -> int:
        return self.code


def guest(monkeypatch: pytest.MonkeyPatch, answer: bytes, code: int = 0) -> list[Child]:
    """Every ssh the host starts meets this answer."""
    started: list[Child] = []

    def start(argv: list[str], **_: Any) -> Child:
        started.append(Child(io.BytesIO(answer), code))
        return started[-1]

    monkeypatch.setattr(proc, "start", start)
    return started


def follow(answer: bytes) -> processes._Follow:
    f = processes._Follow(Endpoint(), 7, 0)  # type: ignore[arg-type]
    f._take(io.BytesIO(answer))
    return f


@pytest.mark.parametrize(
    "answer",
    [
        record(1, b""),  # an empty record: 5 guest bytes that would cost the host a held object each
        HEAD.pack(1, processes.RECORD + 1) + b"x" * 16,  # longer than the runner ever writes
        HEAD.pack(1, 0xFFFFFFFF),  # 4 GiB declared
        record(9, b"x"),  # no such kind
        record(0, b"not json"),
        record(0, json.dumps({"code": "0", "status": "ok"}).encode()),
        record(0, json.dumps({"code": 999, "status": "ok"}).encode()),
        HEAD.pack(0, processes.EXIT_RECORD + 1) + b"{" * 8,
    ],
)
def test_a_stream_that_breaks_the_runners_framing_ends_the_output_and_is_not_read_again(answer: bytes) -> None:
    f = follow(record(1, b"before\n") + answer + record(1, b"after\n"))
    assert f.exit is not None and f.exit.code == -1 and f.exit.error == processes.MALFORMED
    assert [c.data for _, c in f.records] == [b"before\n"]  # nothing after the break is taken
    f.ensure()
    assert not f.alive()  # and no reader is started again


def test_nothing_after_the_exit_is_taken_and_the_exit_is_shown_as_its_characters_are() -> None:
    said = json.dumps({"code": 3, "status": "exit \x1b]52;c;ZXZpbA==\x07\u202etxt"}).encode()
    f = follow(record(1, b"out") + record(0, said) + record(1, b"after the end") + record(0, ENDED))
    assert f.exit is not None and f.exit.code == 3 and "\x1b" not in f.exit.status and "\u202e" not in f.exit.status
    assert [c.data for _, c in f.records] == [b"out"]


def test_what_is_held_of_a_process_is_bounded_and_trimmed_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(processes, "KEPT", 10 * processes.RECORD)
    f = follow(b"".join(record(1, bytes([n % 256]) * processes.RECORD) for n in range(100)))
    assert f.held <= processes.KEPT and len(f.records) == 10
    assert f.records[0][1].data[:1] == bytes([90]) and f.base == 90 * (HEAD.size + processes.RECORD)


def test_a_pid_the_guest_does_not_have_is_not_found_and_not_followed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    started = guest(monkeypatch, b"", code=processes.MISSING)
    guest_processes = processes.GuestProcesses(Endpoint(), "user", {})  # type: ignore[arg-type]
    with pytest.raises(NotFoundError):
        guest_processes.output(4242, None, 2.0)
    with pytest.raises(NotFoundError):
        guest_processes.output(4242, 0, 2.0)
    assert len(started) == 1  # one look, then known missing


def test_a_reader_that_ends_without_the_exit_is_started_again_less_and_less_often(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started = guest(monkeypatch, b"")  # a guest that answers nothing and hangs up, again and again
    guest_processes = processes.GuestProcesses(Endpoint(), "user", {})  # type: ignore[arg-type]
    out = guest_processes.output(5, 0, 3.5)
    assert out.chunks == () and out.exit is None
    assert 2 <= len(started) <= 4  # (at 0, 1 and 3 s: never one a second for as long as a client waits)


def test_a_client_behind_what_is_held_gets_one_read_of_the_log_never_another_reader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    guest_processes = processes.GuestProcesses(Endpoint(), "user", {})  # type: ignore[arg-type]
    held = guest_processes._follows[3] = follow(record(1, b"new"))
    held.base = 1000  # (what came before was trimmed)
    held._next = time.monotonic() + 60  # (its own reader is not what is counted here)
    started = guest(monkeypatch, record(1, b"old") + record(1, b"er"))
    out = guest_processes.output(3, 0, 0.0)
    assert [c.data for c in out.chunks] == [b"old", b"er"] and out.cursor == 2 * HEAD.size + 5
    assert len(started) == 1 and guest_processes._follows[3] is held  # the reader stays the one there is


def test_a_one_off_read_that_sends_more_than_it_was_asked_for_is_malformed(monkeypatch: pytest.MonkeyPatch) -> None:
    guest_processes = processes.GuestProcesses(Endpoint(), "user", {})  # type: ignore[arg-type]
    held = guest_processes._follows[3] = follow(b"")
    held.base = 10**9
    guest(monkeypatch, record(1, b"z" * processes.RECORD) * (processes.BATCH // processes.RECORD + 4))
    out = guest_processes.output(3, 0, 0.0)
    assert out.exit is not None and out.exit.error == processes.MALFORMED
    assert sum(len(c.data) for c in out.chunks) <= processes.BATCH + processes.RECORD


def test_followed_processes_are_bounded_per_sandbox_ended_ones_go_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(processes, "FOLLOWED", 3)
    guest_processes = processes.GuestProcesses(Endpoint(), "user", {})  # type: ignore[arg-type]
    guest_processes._follows[1] = follow(record(0, ENDED))  # ended
    for pid in (2, 3):
        guest_processes._follows[pid] = processes._Follow(Endpoint(), pid, 0)  # type: ignore[arg-type]
        guest_processes._follows[pid]._next = time.monotonic() + 60  # (no reader started here)
    guest(monkeypatch, b"")
    guest_processes.output(4, 0, 0.0)
    assert sorted(guest_processes._follows) == [2, 3, 4]
    with pytest.raises(RefusedError, match="followed already"):
        guest_processes.output(5, 0, 0.0)


def test_the_guests_list_and_entries_are_refused_when_they_are_not_what_they_say(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for said in ('{"not": "a list"}', '[{"pid": 1}]', '[{"pid": "x", "spec": {"cmd": "a", "user": "u"}}]'):
        monkeypatch.setattr(processes, "guest_call", lambda *a, said=said, **k: proc.Result(("ssh",), 0, said, ""))
        with pytest.raises(RefusedError, match="not a list of its processes"):
            processes.GuestProcesses(Endpoint(), "user", {}).running()  # type: ignore[arg-type]
    for said in ('{"name": 1}', "[1, 2]", '"x"'):
        monkeypatch.setattr(files, "guest_call", lambda *a, said=said, **k: proc.Result(("ssh",), 0, said, ""))
        guest_files = files.GuestFiles(Endpoint(), "user")  # type: ignore[arg-type]
        with pytest.raises(RefusedError):
            guest_files.stat(GuestPath("/x"), None)
        with pytest.raises(RefusedError):
            guest_files.list_dir(GuestPath("/x"), 1, None)


def test_a_guests_message_reaches_a_client_as_its_characters_are(monkeypatch: pytest.MonkeyPatch) -> None:
    said = json.dumps({"error": "not_found", "message": "\x1b]52;c;ZXZpbA==\x07\x1b[2J\u202etxt.exe"})
    monkeypatch.setattr(files, "guest_call", lambda *a, **k: proc.Result(("ssh",), 3, said, ""))
    with pytest.raises(NotFoundError) as caught:
        files.GuestFiles(Endpoint(), "user").stat(GuestPath("/x"), None)  # type: ignore[arg-type]
    assert "\x1b" not in caught.value.message and "\u202e" not in caught.value.message
    assert "\\u202e" in caught.value.message


def test_a_download_from_a_silent_guest_ends_and_can_be_closed_from_another_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    r, w = os.pipe()

    class Silent(Child):
        closed = False

        def kill(self) -> None:  # as killing the ssh does: its end of the pipe closes
            super().kill()
            if not self.closed:
                self.closed = True
                os.close(w)

    child = Silent(os.fdopen(r, "rb"))
    monkeypatch.setattr(proc, "start", lambda argv, **_: child)
    guest_files = files.GuestFiles(Endpoint(), "user")  # type: ignore[arg-type]
    monkeypatch.setattr(guest_files, "stat", lambda path, user: Entry(
        "x", EntryType.FILE, "/x", 0, 0o644, "-rw-r--r--", "u", "u", datetime.now(tz=UTC)))  # fmt: skip
    chunks = guest_files.read(GuestPath("/x"), None)
    got: list[object] = []
    worker = threading.Thread(target=lambda: got.append(next(chunks, None)), daemon=True)
    worker.start()
    time.sleep(0.2)
    chunks.close()  # type: ignore[attr-defined]  # (what the edge does when its client goes)
    worker.join(5)
    assert child.killed and not worker.is_alive() and got == [None]
    monkeypatch.setattr(files, "IDLE", 0.2)
    r2, w2 = os.pipe()
    quiet = Child(os.fdopen(r2, "rb"))
    monkeypatch.setattr(proc, "start", lambda argv, **_: quiet)
    with pytest.raises(RefusedError, match="sent nothing"):
        next(guest_files.read(GuestPath("/x"), None))
    assert quiet.killed
    os.close(w2)


def test_an_upload_is_streamed_from_its_file_never_read_whole(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    seen: list[object] = []
    entry = {"name": "x", "type": "file", "path": "/x", "size": 0, "mode": 420, "permissions": "-rw-r--r--",
             "owner": "u", "group": "u", "modified": 0, "target": None}  # fmt: skip

    def call(endpoint: Any, args: Any, *, input: object = None, as_user: str | None = None, script: str) -> proc.Result:
        assert script == files.GUEST_SIDE  # the files' own guest side, not the processes'
        seen.append(input)
        return proc.Result(("ssh",), 0, json.dumps(entry), "")

    monkeypatch.setattr(files, "guest_call", call)
    guest_files = files.GuestFiles(Endpoint(), "user")  # type: ignore[arg-type]
    with (tmp_path / "big").open("w+b") as big:
        big.write(b"z" * 1024)
        big.seek(0)
        guest_files.write(GuestPath("/x"), None, big)
        assert seen == [big]  # the file itself, its descriptor handed to ssh
    guest_files.write(GuestPath("/x"), None, io.BytesIO(b"small"))
    assert seen[-1] == b"small"


def _item(path: str, *, binary: bool = False) -> Item:
    return Item(path, (Change(path, None, None, None, Status.APPLY, binary=binary),))


def test_hunks_chosen_on_an_item_without_them_or_not_in_it_are_refused_with_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    blob, text = _item("logo.png", binary=True), _item("a.txt")
    monkeypatch.setattr(views, "texts", lambda plan, c: None if c.binary else (b"one\n", b"two\n"))
    plan: Any = type("Plan", (), {"todo": [blob, text], "gathered": type("G", (), {"refs_changed": False})})
    chosen = views.decide(plan, [views.Choice(0, views.fingerprint(blob), hunks=[5])])
    assert chosen.decisions.accept == () and chosen.refused_items == [0] and "choose it whole" in chosen.refused[0]
    chosen = views.decide(plan, [views.Choice(1, views.fingerprint(text), hunks=[0, 99])])
    assert chosen.decisions.accept == () and chosen.refused_items == [1] and "no hunk h99" in chosen.refused[0]
    chosen = views.decide(plan, [views.Choice(1, views.fingerprint(text), hunks=[0])])
    assert chosen.decisions.accept == (text,) and chosen.refused == []


def test_a_guests_bytes_in_a_logged_error_reach_the_log_as_escapes() -> None:
    """The reaper logs what ending a session raised, whole; a core error carries the tail of ssh or rsync's
    stderr (the guest's words). Every handler of the CLI's log formats through ui.EscapingFormatter."""
    import logging

    from vmsandbox import ui

    error = proc.CommandError(proc.Result(("rsync",), 12, "", "rsync: \x1b]52;c;ZXZpbA==\x07\x1b[2J \u202eowned"))
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "ending %s failed", ("s1",), exc_info=None)
    record.exc_info = (type(error), error, None)
    shown = ui.EscapingFormatter("%(message)s").format(record)
    assert "\x1b" not in shown and "\u202e" not in shown and "\\x1b]52" in shown and "CommandError" in shown
