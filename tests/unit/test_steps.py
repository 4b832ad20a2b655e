"""A session's steps as the host keeps them (sync.provenance.steps) and how a command is started as one."""

from __future__ import annotations

import json
import os
import shlex
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from vmsandbox import paths
from vmsandbox.core import views
from vmsandbox.core.sandbox.model import ProcessSpec
from vmsandbox.core.sandbox.processes import _typed
from vmsandbox.guest.commands import STEP, remote_command
from vmsandbox.sync.provenance import steps
from vmsandbox.sync.provenance.model import Step


def test_a_step_is_kept_with_its_command_times_and_exit(tmp_path: Path) -> None:
    files = paths.SessionPaths(tmp_path)
    code = steps.run(files, ["sed", "-i", "2s/.*/two/", "a b.txt"], "exec", lambda step: 3 if step.isalnum() else 0)
    assert code == 3
    (found,) = steps.read(files)
    assert found.command == "sed -i '2s/.*/two/' 'a b.txt'" and found.exit == 3 and found.how == "exec"
    assert found.ended is not None and found.started <= found.ended


def test_a_step_that_raised_is_kept_without_an_exit(tmp_path: Path) -> None:
    files = paths.SessionPaths(tmp_path)

    def fails(step: str) -> int:
        raise RuntimeError("the connection went")

    with pytest.raises(RuntimeError):
        steps.run(files, None, "shell", fails)
    (found,) = steps.read(files)
    assert found.command == "shell" and found.exit is None and found.ended is not None


def test_steps_read_back_in_the_order_they_started_and_damaged_ones_are_skipped(tmp_path: Path) -> None:
    files = paths.SessionPaths(tmp_path)
    first = steps.begin(files, "one", "exec")
    second = steps.begin(files, "two", "api")
    (files.steps / "zz.json").write_text("{not json")
    assert [s.command for s in steps.read(files)] == ["one", "two"]
    assert {first.id, second.id} == {s.id for s in steps.read(files)}


def test_each_step_gets_the_egress_logged_while_it_ran(tmp_path: Path) -> None:
    files = paths.SessionPaths(tmp_path)
    step = steps.begin(files, "npm install", "exec")
    time.sleep(0.01)
    steps.finish(files, step, 0)
    (done,) = steps.read(files)
    lines = [
        {
            "ts": done.started + 0.001,
            "decision": "allow",
            "method": "CONNECT",
            "host": "registry.npmjs.org",
            "port": 443,
        },
        {"ts": done.started - 100, "decision": "deny", "method": "GET", "target": "http://before/"},
        {"ts": done.started + 0.002, "decision": "policy", "reason": "allow x"},
        "not json",
    ]
    files.proxy_log.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    (found,) = views._with_egress(steps.read(files), files.proxy_log)
    assert found.egress == ("allow CONNECT registry.npmjs.org:443",)


def test_a_command_runs_under_the_step_wrapper_and_without_it_on_an_older_image() -> None:
    line = remote_command("/w/p", ["make", "test"], {"A": "1"}, step="abc123")
    assert line == (
        f"cd -- /w/p && export A=1 && {{ [ -x {STEP} ] && exec {STEP} abc123 -- make test; exec make test; }}"
    )
    shell = remote_command("/w", None, step="s1")
    assert shell.endswith(f'exec {STEP} s1 -- "${{SHELL:-/bin/bash}}" -l; exec "${{SHELL:-/bin/bash}}" -l; }}')
    assert shlex.split(line)[-1] == "}"
    for bad in ("a;b", "x y", "", "a" * 33, "ä"):
        with pytest.raises(ValueError):
            remote_command("/w", ["true"], step=bad)


def test_an_api_process_is_named_by_the_command_its_client_typed() -> None:
    assert _typed(ProcessSpec("/bin/bash", ("-l", "-c", "npm install && npm test"))) == "npm install && npm test"
    assert _typed(ProcessSpec("python3", ("-c", "print(1)"))) == "python3 -c 'print(1)'"
    assert _typed(ProcessSpec("/bin/bash", ("-x", "-c", "true"))) == "/bin/bash -x -c true"


def test_inspect_says_what_the_journal_holds_against_its_bounds(tmp_path: Path) -> None:
    from vmsandbox.core import listing
    from vmsandbox.sync.provenance import store
    from vmsandbox.sync.provenance.model import Provenance

    assert listing._journal_use(tmp_path) == "not asked yet (a review asks)"
    store.save(tmp_path, Provenance((), {}, {}, usage=(1024, 7, 3, 40)), [])
    said = listing._journal_use(tmp_path)
    assert said.startswith("1,024 of 33,554,432 versions bytes, 7 of 200,000 paths, 3 of 100,000 writers"), said
    (tmp_path / store.USAGE_NAME).write_text("{damaged")
    assert listing._journal_use(tmp_path) == "not asked yet (a review asks)"


def _event(ts: float, host: str = "h") -> str:
    return json.dumps({"ts": ts, "decision": "allow", "method": "CONNECT", "host": host, "port": 443}) + "\n"


def test_egress_is_found_in_one_pass_and_never_for_a_step_only_the_guest_registered(tmp_path: Path) -> None:
    """H1: a step only the guest registered has no time: it gets no egress (it would match every line), at most
    MAX_GUEST_STEPS of them are kept; each host step gets the lines of its time, at most MAX_EGRESS."""
    files = paths.SessionPaths(tmp_path)
    files.proxy_log.parent.mkdir(parents=True, exist_ok=True)
    files.proxy_log.write_text(_event(5.0) + "".join(_event(10.0 + n / 1000) for n in range(300)) + _event(50.0))
    guest = tuple(Step(f"g{n}", "(registered in the guest)", 0.0, how="guest") for n in range(150))
    host = (Step("a", "one", 1.0, 6.0, 0), Step("b", "two", 10.0, 20.0, 0), Step("c", "open", 49.0))
    found = views._with_egress((*guest, *host), files.proxy_log)
    by_id = {s.id: s for s in found}
    assert [s.id for s in found] == ["a", "b", "c", *(f"g{n}" for n in range(views.MAX_GUEST_STEPS))]
    assert all(s.egress == () for s in found if s.how == "guest")
    assert by_id["a"].egress == ("allow CONNECT h:443",) and len(by_id["b"].egress) == views.MAX_EGRESS
    assert by_id["c"].egress == ("allow CONNECT h:443",)  # (not ended: up to now)


def test_the_proxy_logs_are_read_bounded_and_never_through_a_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """H1: each of the two log files is read up to a byte bound (rotation keeps them at 8 MiB), no link followed."""
    files = paths.SessionPaths(tmp_path)
    files.proxy_log.parent.mkdir(parents=True, exist_ok=True)
    step = (Step("a", "one", 1.0, 100.0, 0),)
    first, second = _event(2.0, "first"), _event(3.0, "second")
    files.proxy_log.write_text(first + second)
    monkeypatch.setattr(views, "LOG_READ", len(first))
    (found,) = views._with_egress(step, files.proxy_log)
    assert found.egress == ("allow CONNECT first:443",)
    elsewhere = tmp_path / "elsewhere.log"
    files.proxy_log.rename(elsewhere)
    files.proxy_log.symlink_to(elsewhere)
    (found,) = views._with_egress(step, files.proxy_log)
    assert found.egress == ()


def test_only_the_newest_steps_are_read_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """H1: a session's steps are read back bounded: the newest MAX_STEPS files, the rest not even read."""
    assert steps.MAX_STEPS == 2_000
    files = paths.SessionPaths(tmp_path)
    made = [steps.begin(files, f"c{n}", "api") for n in range(5)]
    for n, s in enumerate(made):
        os.utime(files.steps / f"{s.id}.json", ns=(n * 10**9, n * 10**9))
    monkeypatch.setattr(steps, "MAX_STEPS", 3)
    read: list[str] = []
    load = steps._load

    def counted(path: Path) -> Step | None:
        read.append(path.name)
        return load(path)

    monkeypatch.setattr(steps, "_load", counted)
    assert [s.command for s in steps.read(files)] == ["c2", "c3", "c4"]
    assert len(read) == 3


def test_a_step_that_cannot_be_kept_never_stops_its_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """L4: begin and finish are best effort; a fan-out's step is finished even when its command raised."""
    files = paths.SessionPaths(tmp_path)
    (tmp_path / "steps").write_text("not a directory")
    step = steps.begin(files, "make", "exec")
    steps.finish(files, step, 0)
    assert step.command == "make" and steps.read(files) == ()
    assert steps.run(files, ["make"], "exec", lambda _id: 3) == 3

    from vmsandbox.session.moments import fanout

    finished: list[int | None] = []
    monkeypatch.setattr("vmsandbox.sync.provenance.steps.finish", lambda _f, _s, code: finished.append(code))

    def fails(*_a: object, **_k: object) -> object:
        raise OSError("ssh went away")

    monkeypatch.setattr("vmsandbox.guest.commands.captured", fails)
    record = SimpleNamespace(endpoint=lambda: None, files=paths.SessionPaths(tmp_path / "s"), project="/p")
    with pytest.raises(OSError):
        fanout._logged(record, ["make"], tmp_path / "log", "w")  # type: ignore[arg-type]
    assert finished == [None]
