"""`vmsandbox serve` driven by E2B's own SDK (the `e2b` package, unchanged) on real sessions: a sandbox made,
commands run (output, exit codes, streaming), files written and read, listed, a process kept across a pause, a
snapshot forked, killed. And a session on a project through the extension: its changes as a frozen review, one
hunk of it applied, what the guest changed after the review not applied, a review spent once.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from vmsandbox.session.record import Record, domain_name
from vmsandbox.vm.virt import Hypervisor

from .conftest import URI, Cli, assert_gone, keep_console

e2b = pytest.importorskip("e2b", reason="the e2b SDK (a dev dependency) is not installed")

A_PY = "def f():\n    return 1\n\n\n\n\n\n\n\ndef g():\n    return 2\n"


@dataclass
class Served:
    url: str
    key: str
    child: subprocess.Popen[bytes]

    def call(self, method: str, path: str, body: object = None) -> tuple[int, Any]:
        """The extension, as any HTTP client calls it."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"X-API-Key": self.key, "Content-Type": "application/json"}
        url = f"{self.url}/vmsandbox/v1{path}"  # (http://127.0.0.1:PORT, as serve printed it)
        request = urllib.request.Request(url, data, headers, method=method)  # noqa: S310
        try:
            with urllib.request.urlopen(request, timeout=600) as answer:  # noqa: S310 - a loopback address only
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())


def _settings(child: subprocess.Popen[bytes], timeout: float = 60) -> dict[str, str]:
    """The three lines `serve` prints on stdout once it listens (read from the descriptor: a buffered reader
    would hold lines that select no longer sees)."""
    assert child.stdout is not None
    fd = child.stdout.fileno()
    seen = b""
    deadline = time.monotonic() + timeout
    while seen.count(b"\n") < 3:
        ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0))
        got = os.read(fd, 4096) if ready else b""
        if not got:
            if child.poll() is None:
                child.send_signal(signal.SIGINT)
            child.wait(timeout=60)
            err = child.stderr.read().decode() if child.stderr else ""
            pytest.fail(f"`vmsandbox serve` printed no settings ({seen!r}): {err}")
        seen += got
    return dict(line.partition("=")[::2] for line in seen.decode().splitlines()[:3])


@pytest.fixture(scope="module")
def served(cli: Cli) -> Iterator[Served]:
    child = cli.popen("serve")
    try:
        settings = _settings(child)
        assert settings["E2B_API_URL"] == settings["E2B_SANDBOX_URL"]
        assert settings["E2B_API_URL"].startswith("http://127.0.0.1:")
        with pytest.MonkeyPatch.context() as env:
            for key, value in settings.items():
                env.setenv(key, value)
            env.delenv("E2B_DEBUG", raising=False)
            env.delenv("E2B_DOMAIN", raising=False)
            yield Served(settings["E2B_API_URL"], settings["E2B_API_KEY"], child)
    finally:
        child.send_signal(signal.SIGINT)
        try:
            child.wait(timeout=60)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


@contextlib.contextmanager
def ended(cli: Cli, request: pytest.FixtureRequest, *names: str) -> Iterator[list[str]]:
    """Sessions a test made, removed whatever happens (the serial log kept when it failed)."""
    made = list(names)
    try:
        yield made
    finally:
        failed = bool(request.session.testsfailed)
        for name in made:
            keep_console(request.node.name, name, failed=failed)
            cli.run("rm", "--discard", name, timeout=300)  # (gone already, when the test went through)


def test_e2b_sdk_drives_a_sandbox_from_create_to_kill(served: Served, cli: Cli, request: pytest.FixtureRequest) -> None:
    """The SDK's own calls, each answered by a real guest: output and exit codes, a stream, files, the list, a
    background process that lives through a pause and a connect, a snapshot forked into a second sandbox, kill."""
    from e2b import CommandExitException, Sandbox

    sbx = Sandbox.create("base", timeout=900)
    with ended(cli, request, sbx.sandbox_id) as made:
        r = sbx.commands.run('echo out; echo err >&2; printf "%s" "$GREETING"', envs={"GREETING": "hi"})
        assert (r.stdout, r.stderr, r.exit_code) == ("out\nhi", "err\n", 0)
        seen: list[str] = []
        sbx.commands.run("for i in 1 2 3; do echo $i; done", on_stdout=seen.append)
        assert "".join(seen) == "1\n2\n3\n"
        with pytest.raises(CommandExitException) as failed:
            sbx.commands.run("echo no >&2; exit 3")
        assert failed.value.exit_code == 3 and failed.value.stderr == "no\n"

        sbx.files.write("dir/notes.txt", "hello")
        assert sbx.files.read("dir/notes.txt") == "hello"
        assert [e.name for e in sbx.files.list("dir")] == ["notes.txt"]
        blob = bytes(range(256)) * 64
        sbx.files.write("dir/blob.bin", blob)
        assert bytes(sbx.files.read("dir/blob.bin", format="bytes")) == blob
        sbx.files.rename("dir/notes.txt", "dir/moved.txt")
        assert not sbx.files.exists("dir/notes.txt") and sbx.files.exists("dir/moved.txt")
        sbx.files.remove("dir/moved.txt")
        assert sbx.commands.run("ls dir").stdout == "blob.bin\n"

        listed = {s.sandbox_id: s for s in Sandbox.list().next_items()}
        assert listed[sbx.sandbox_id].state.value == "running"

        kept = sbx.commands.run("sleep 900", background=True, timeout=0)
        sbx.pause()
        assert {s.sandbox_id: s for s in Sandbox.list().next_items()}[sbx.sandbox_id].state.value == "paused"
        sbx = Sandbox.connect(sbx.sandbox_id)
        assert kept.pid in [p.pid for p in sbx.commands.list()]
        assert sbx.commands.run(f"kill -0 {kept.pid} && echo alive").stdout == "alive\n"  # the same process
        assert sbx.commands.kill(kept.pid)

        sbx.files.write("before.txt", "from the parent")
        snap = sbx.create_snapshot()
        child = Sandbox.create(snap.snapshot_id, timeout=900)
        made.append(child.sandbox_id)
        assert child.files.read("before.txt") == "from the parent"
        child.kill()
        sbx.kill()
        for name in made:
            assert_gone(name)
        assert not {sbx.sandbox_id, child.sandbox_id} & {s.sandbox_id for s in Sandbox.list().next_items()}


def test_a_project_session_applies_what_its_frozen_review_showed_and_chosen(
    served: Served, cli: Cli, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A session on a project (the extension) driven by the SDK; its review chosen from by item and hunk: only
    the chosen hunk reaches the host, a file the guest rewrote after the review lands as the review showed it,
    a choice with another digest is refused and nothing is applied, and a review is spent by its apply."""
    from e2b import Sandbox

    project = tmp_path / "project"
    project.mkdir()
    (project / "a.py").write_text(A_PY)
    status, made = served.call("POST", "/sessions", {"project": str(project), "blueprint": "base", "timeout": 900})
    assert status == 201, made
    name = made["name"]
    with ended(cli, request, name):
        assert Record.load(name).project == str(project)
        sbx = Sandbox.connect(name)
        assert sbx.commands.run("pwd").stdout == f"{project}\n"  # where a project session's commands start
        sbx.commands.run("sed -i 's/return 1/return 10/; s/return 2/return 20/' a.py && echo new > c.txt")

        status, shown = served.call("POST", f"/sessions/{name}/reviews")
        assert status == 201, shown
        items = {i["path"]: i for i in shown["items"]}
        assert sorted(items) == ["a.py", "c.txt"]
        a_py, c_txt = items["a.py"], items["c.txt"]
        assert [h["newLines"] for h in a_py["hunks"]] == [["    return 10\n"], ["    return 20\n"]]

        wrong = {"choices": [{"item": a_py["id"], "digest": "0" * 32}]}
        status, out = served.call("POST", f"/sessions/{name}/reviews/{shown['id']}/apply", wrong)
        assert status == 200 and out["applied"] == [] and [r["item"] for r in out["refused"]] == [a_py["id"]]
        assert (project / "a.py").read_text() == A_PY and not (project / "c.txt").exists()
        status, out = served.call("POST", f"/sessions/{name}/reviews/{shown['id']}/apply", wrong)
        assert status == 409 and "ask for a new review" in out["message"]  # spent by the apply before

        status, shown = served.call("POST", f"/sessions/{name}/reviews")
        items = {i["path"]: i for i in shown["items"]}
        a_py, c_txt = items["a.py"], items["c.txt"]
        status, again = served.call("GET", f"/sessions/{name}/reviews/{shown['id']}")
        assert status == 200 and again["items"] == shown["items"]  # the review as it was shown
        sbx.commands.run("echo written after the review > c.txt")
        first = next(h["id"] for h in a_py["hunks"] if h["newLines"] == ["    return 10\n"])
        choices = [
            {"item": a_py["id"], "digest": a_py["digest"], "hunks": [first]},
            {"item": c_txt["id"], "digest": c_txt["digest"]},
        ]
        status, out = served.call("POST", f"/sessions/{name}/reviews/{shown['id']}/apply", {"choices": choices})
        assert status == 200 and sorted(out["applied"]) == sorted([a_py["id"], c_txt["id"]]), out
        assert (project / "a.py").read_text() == A_PY.replace("return 1\n", "return 10\n")
        assert (project / "c.txt").read_text() == "new\n"  # as the review showed it

        status, later = served.call("POST", f"/sessions/{name}/reviews")
        assert [(i["path"], i["hunks"][0]["newLines"]) for i in later["items"]] == [
            ("c.txt", ["written after the review\n"])
        ]
        sbx.kill()  # ended: its VM gone, what nobody took waits in its outbox
        with Hypervisor(URI) as hv:
            assert hv.info(domain_name(name)) is None
        assert [s["unsynced"] for s in cli.ls() if s["name"] == name] == [1]
        assert cli.run("rm", "--discard", name).returncode == 0
        assert_gone(name)
