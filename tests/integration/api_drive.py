"""E2B's SDK (and plain HTTP for the extension) driving `vmsandbox serve`, run as a program by
tests/integration/test_api.py: as the account that runs `serve` (it answers no other, and never runs as root),
configured only by the environment `serve` printed. Each part asserts what it sees and prints, as its last line,
a JSON object of what the test then checks on the host.

    python api_drive.py create-to-kill
    python api_drive.py project-review PROJECT
    python api_drive.py offline          (in a network namespace of its own: the unit tests' API stand-in)
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

A_PY = "def f():\n    return 1\n\n\n\n\n\n\n\ndef g():\n    return 2\n"
SLOW = 600  # seconds a control-plane call may take (the SDK's default is 60): a boot, a save or a restore under TCG,
# on a host other tests keep busy


def create_to_kill() -> dict[str, Any]:
    """The SDK's own calls, each answered by a real guest: output and exit codes, a stream, files, the list, a
    background process that lives through a pause and a connect, a snapshot forked into a second sandbox, kill."""
    from e2b import CommandExitException, Sandbox

    sbx = Sandbox.create("base", timeout=900, request_timeout=SLOW)
    made = [sbx.sandbox_id]
    print(json.dumps({"made": made}), flush=True)  # (for the test's cleanup, should what follows fail)
    r = sbx.commands.run('echo out; echo err >&2; printf "%s" "$GREETING"', envs={"GREETING": "hi"})
    assert (r.stdout, r.stderr, r.exit_code) == ("out\nhi", "err\n", 0), r
    seen: list[str] = []
    sbx.commands.run("for i in 1 2 3; do echo $i; done", on_stdout=seen.append)
    assert "".join(seen) == "1\n2\n3\n", seen
    try:
        sbx.commands.run("echo no >&2; exit 3")
        raise AssertionError("exit 3 was not raised")
    except CommandExitException as failed:
        assert failed.exit_code == 3 and failed.stderr == "no\n", failed

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
    sbx = Sandbox.connect(sbx.sandbox_id, request_timeout=SLOW)
    assert kept.pid in [p.pid for p in sbx.commands.list()]
    assert sbx.commands.run(f"kill -0 {kept.pid} && echo alive").stdout == "alive\n"  # the same process
    assert sbx.commands.kill(kept.pid)

    sbx.files.write("before.txt", "from the parent")
    snap = sbx.create_snapshot()
    child = Sandbox.create(snap.snapshot_id, timeout=900, request_timeout=SLOW)
    made.append(child.sandbox_id)
    print(json.dumps({"made": made}), flush=True)
    assert child.files.read("before.txt") == "from the parent"
    child.kill()
    sbx.kill()
    assert not set(made) & {s.sandbox_id for s in Sandbox.list().next_items()}
    return {"made": made}


def project_review(project: Path) -> dict[str, Any]:
    """A session on a project (the extension) driven by the SDK; its review chosen from by item and hunk: only the
    chosen hunk reaches the host, a file the guest rewrote after the review lands as the review showed it, a
    choice with another digest is refused and nothing is applied, and a review is spent by its apply."""
    import httpx
    from e2b import Sandbox

    api = httpx.Client(
        base_url=os.environ["E2B_API_URL"] + "/vmsandbox/v1",
        headers={"X-API-Key": os.environ["E2B_API_KEY"]},
        timeout=900,
    )
    (project / "a.py").write_text(A_PY)
    made = api.post("/sessions", json={"project": str(project), "blueprint": "base", "timeout": 900})
    assert made.status_code == 201, made.text
    name = made.json()["name"]
    print(json.dumps({"name": name}), flush=True)
    assert api.get(f"/sessions/{name}").json()["project"] == str(project)
    sbx = Sandbox.connect(name, request_timeout=SLOW)
    assert sbx.commands.run("pwd").stdout == f"{project}\n"  # where a project session's commands start
    sbx.commands.run("sed -i 's/return 1/return 10/; s/return 2/return 20/' a.py && echo new > c.txt")

    shown = api.post(f"/sessions/{name}/reviews").json()
    items = {i["path"]: i for i in shown["items"]}
    assert sorted(items) == ["a.py", "c.txt"], shown
    a_py = items["a.py"]
    assert [h["newLines"] for h in a_py["hunks"]] == [["    return 10\n"], ["    return 20\n"]], a_py

    wrong = {"choices": [{"item": a_py["id"], "digest": "0" * 32}]}
    out = api.post(f"/sessions/{name}/reviews/{shown['id']}/apply", json=wrong)
    assert out.status_code == 200 and out.json()["applied"] == [], out.text
    assert [r["item"] for r in out.json()["refused"]] == [a_py["id"]], out.text
    assert (project / "a.py").read_text() == A_PY and not (project / "c.txt").exists()
    again = api.post(f"/sessions/{name}/reviews/{shown['id']}/apply", json=wrong)
    assert again.status_code == 409 and "ask for a new review" in again.json()["message"]  # spent by the apply

    shown = api.post(f"/sessions/{name}/reviews").json()
    items = {i["path"]: i for i in shown["items"]}
    a_py, c_txt = items["a.py"], items["c.txt"]
    assert api.get(f"/sessions/{name}/reviews/{shown['id']}").json()["items"] == shown["items"]  # as it was shown
    sbx.commands.run("echo written after the review > c.txt")
    first = next(h["id"] for h in a_py["hunks"] if h["newLines"] == ["    return 10\n"])
    choices = [
        {"item": a_py["id"], "digest": a_py["digest"], "hunks": [first]},
        {"item": c_txt["id"], "digest": c_txt["digest"]},
    ]
    out = api.post(f"/sessions/{name}/reviews/{shown['id']}/apply", json={"choices": choices})
    assert out.status_code == 200 and sorted(out.json()["applied"]) == sorted([a_py["id"], c_txt["id"]]), out.text
    assert (project / "a.py").read_text() == A_PY.replace("return 1\n", "return 10\n")
    assert (project / "c.txt").read_text() == "new\n"  # as the review showed it

    later = api.post(f"/sessions/{name}/reviews").json()
    assert [(i["path"], i["hunks"][0]["newLines"]) for i in later["items"]] == [
        ("c.txt", ["written after the review\n"])
    ], later
    sbx.kill()  # ended: its VM gone, what nobody took waits in its outbox
    return {"name": name}


def _failure(call: Callable[[], object]) -> str:
    """What the SDK raised for `call` (that it raises is the point)."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - whatever the SDK raises for a name that resolves nowhere
        return f"{type(exc).__name__}: {exc}"
    raise AssertionError("the SDK reached a sandbox (or the control plane) it had no URL for")


def offline() -> dict[str, Any]:
    """With only E2B_API_URL and E2B_API_KEY set, the SDK reaches the control plane here, then tries the sandbox's
    envd at the domain the server answered (a `.invalid` name) and fails without a byte sent anywhere; without
    E2B_API_URL either, it fails on `api.set-e2b-api-url.invalid`. Run in a network namespace with nothing but
    loopback, so that nothing could leave whatever the SDK did; the server is the unit tests' (the real app over
    the stand-in backend)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from e2b import Sandbox

    from tests.unit.apiserver import served
    from vmsandbox.api import running
    from vmsandbox.api.plane.controlwire import SANDBOX_DOMAIN

    failures: dict[str, str] = {}
    with served(Path(os.environ["OFFLINE_ROOT"])) as api:
        for name in [k for k in os.environ if k.startswith("E2B_")]:
            del os.environ[name]
        os.environ.update({"E2B_API_URL": api.url, "E2B_API_KEY": api.key})
        sbx = Sandbox.create("base")  # the control plane: E2B_API_URL, this machine
        assert sbx.sandbox_domain == SANDBOX_DOMAIN, sbx.sandbox_domain
        failures["command"] = _failure(lambda: sbx.commands.run("echo secret-command"))
        failures["write"] = _failure(lambda: sbx.files.write("f.txt", "secret-file"))
        failures["read"] = _failure(lambda: sbx.files.read("f.txt"))
        os.environ.update({"E2B_DOMAIN": running.API_DOMAIN})
        del os.environ["E2B_API_URL"]
        failures["list"] = _failure(lambda: Sandbox.list().next_items())
    return {"failures": failures, "envd_url": sbx.envd_api_url}


if __name__ == "__main__":
    part = sys.argv[1]
    if part == "create-to-kill":
        result = create_to_kill()
    elif part == "project-review":
        result = project_review(Path(sys.argv[2]))
    elif part == "offline":
        result = offline()
    else:
        raise SystemExit(f"no part {part!r}")
    print(json.dumps(result), flush=True)
