"""Provenance on a real VM: each hunk of the review traced to the step (a command the session ran) and the
process that wrote it — the issue's scenario (two steps editing one file, a background process a step left
behind, an npm package's install script), the same answers in `diff --json`, `diff --by step`, the page's
review and the API's; and a guest that floods, kills or forges its journal still gets its review, provenance
marked incomplete.

One session of the claude blueprint (it has node and npm; its layer is built once, like test_blueprints.py's),
used in order by the module's tests."""

from __future__ import annotations

import io
import json
import shlex
import tarfile
from collections.abc import Iterator
from typing import Any

import pytest

from vmsandbox.core import reviews, views
from vmsandbox.core.sandbox import backend
from vmsandbox.core.sandbox.model import ProcessSpec
from vmsandbox.core.sandbox.names import SessionName
from vmsandbox.image import blueprint, store
from vmsandbox.session.record import Record
from vmsandbox.session.start import layer

from .conftest import CLI_POLL, Cli, guest_sh, keep_console, unique_name, wait_for

BACKGROUND = "sed -i '2s/.*/two/' a.txt; (sleep 3; echo later >> b.txt) >/dev/null 2>&1 &"
POSTINSTALL = "node -e \"require('fs').writeFileSync(process.env.INIT_CWD + '/installed.txt', 'from a script\\n')\""


def _package() -> bytes:
    """A local npm package whose postinstall script writes a file where npm was run (no network needed)."""
    manifest = {"name": "pkg", "version": "1.0.0", "scripts": {"postinstall": POSTINSTALL}}
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        body = json.dumps(manifest).encode()
        info = tarfile.TarInfo("package/package.json")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    return data.getvalue()


@pytest.fixture(scope="module")
def traced(
    request: pytest.FixtureRequest, cli: Cli, base_image: store.Image, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    layer.build_layer(blueprint.load("claude"))
    project = tmp_path_factory.mktemp("provenance") / "project"
    project.mkdir()
    (project / "a.txt").write_text("".join(f"{n}\n" for n in range(1, 21)))
    (project / "pkg-1.0.0.tgz").write_bytes(_package())
    # npm runs a dependency's install scripts only where the project allows them (as `npm install-scripts
    # approve` writes it)
    allowed = {"allowScripts": {f"file:{project}/pkg-1.0.0.tgz": True}}
    (project / "package.json").write_text(json.dumps(allowed))
    name = unique_name()
    r = cli.run("run", "--blueprint", "claude", "--keep", "--name", name, str(project), "--", "true")
    assert r.returncode == 0, r.stderr.decode()
    failed = request.session.testsfailed
    yield name
    keep_console(request.node.name, name, failed=request.session.testsfailed > failed)
    cli.run("rm", "--discard", name)


def _exec(cli: Cli, name: str, *argv: str) -> None:
    r = cli.run("exec", name, "--", *argv)
    assert r.returncode == 0, r.stderr.decode()


def _diff(cli: Cli, name: str, *more: str) -> Any:
    r = cli.run("diff", name, "--json", *more)
    assert r.returncode == 0, r.stderr.decode()
    return json.loads(r.stdout)


def _file(d: Any, path: str) -> Any:
    return next(f for f in d["files"] if f["path"] == path)


def test_each_hunk_names_the_step_and_the_process_that_wrote_it(cli: Cli, traced: str) -> None:
    name = traced
    record = Record.load(name)
    _exec(cli, name, "sh", "-c", BACKGROUND)
    # (looked at over ssh, not `exec`: each exec is a step of its own)
    wait_for(lambda: guest_sh(record, "test -s b.txt && echo yes || true").strip() == "yes", 60, "b.txt")
    _exec(cli, name, "sed", "-i", "18s/.*/eighteen/", "a.txt")
    _exec(cli, name, "npm", "install", "--no-audit", "--no-fund", "--offline", "./pkg-1.0.0.tgz")
    # a command of the API (as E2B's SDK sends one) is a step too, started by the guest's process supervisor
    processes = backend.SessionBackend().processes(SessionName(name))
    pid = processes.start(ProcessSpec("/bin/bash", ("-l", "-c", "echo api > api.txt")))
    wait_for(lambda: processes.output(pid, None, 5.0).exit is not None, 60, "the API's command to end")

    d = _diff(cli, name)
    steps = d["steps"]
    commands = [s["command"] for s in steps]
    assert commands[-4:] == [
        shlex.join(["sh", "-c", BACKGROUND]),
        "sed -i '18s/.*/eighteen/' a.txt",
        "npm install --no-audit --no-fund --offline ./pkg-1.0.0.tgz",
        "echo api > api.txt",
    ]
    first, second, install, api = steps[-4:]
    assert api["how"] == "api" and api["exit"] == 0
    (by_api,) = _file(d, "api.txt")["hunks"][0]["made_by"]
    assert by_api["step"] == api["step"]
    for s in (first, second, install):
        assert {"step", "command", "started", "ended", "exit", "egress"} <= set(s) and s["ended"] >= s["started"]

    a = _file(d, "a.txt")
    assert len(a["hunks"]) == 2
    (h0,), (h1,) = (h["made_by"] for h in a["hunks"])
    assert h0["step"] == first["step"] and h0["argv"][:3] == ["sed", "-i", "2s/.*/two/"]
    assert h1["step"] == second["step"] and h1["argv"][:3] == ["sed", "-i", "18s/.*/eighteen/"]

    (later,) = _file(d, "b.txt")["hunks"][0]["made_by"]
    assert later["step"] == first["step"]  # by ancestry: the step had ended when it wrote
    assert later["argv"] == ["sh", "-c", BACKGROUND]

    makers = [m for h in _file(d, "installed.txt")["hunks"] for m in h["made_by"]]
    assert makers and all(m["step"] == install["step"] for m in makers)
    assert any("install script" in m["badges"] and m["argv"][0] == "node" for m in makers), makers

    by_step = cli.run("diff", name, "--by", "step")
    assert by_step.returncode == 0, by_step.stderr.decode()
    text = by_step.stdout.decode()
    assert text.index("eighteen") > text.index("sleep 3") and "install script" in text

    # the page's review and the API's say the same (the core's one answer, views.made_by)
    plan = reviews.review(name, freeze=False)
    change = next(c for c in plan.shown if c.path == "a.txt")
    both = views.texts(plan, change)
    assert both is not None
    page = [views.made_by(plan, change, h)[0].step for h in views.hunks_of(*both)]
    assert page == [first["step"], second["step"]]
    review = backend.SessionBackend().review(SessionName(name), freeze=False)
    item = next(i for i in review.items if i.path == "a.txt")
    assert [h.made_by[0].step for h in item.hunks or ()] == [first["step"], second["step"]]


def test_a_guest_that_floods_kills_or_forges_its_journal_still_gets_its_review(cli: Cli, traced: str) -> None:
    name = traced
    _exec(cli, name, "dd", "if=/dev/zero", "of=flood.bin", "bs=1", "count=1000000", "status=none")
    d = _diff(cli, name)
    assert {"a.txt", "b.txt", "installed.txt", "flood.bin"} <= {f["path"] for f in d["files"]}
    assert d["provenance"]["incomplete"] is None

    _exec(cli, name, "sudo", "pkill", "-KILL", "-x", "journal")  # systemd starts it again
    wait_for(lambda: cli.run("exec", name, "--", "test", "-S", "/run/vmsandbox/steps.sock").returncode == 0, 60,
             "the journal started again", every=CLI_POLL)  # fmt: skip
    _exec(cli, name, "sh", "-c", "echo after >> a.txt")
    d = _diff(cli, name)
    assert "a.txt" in {f["path"] for f in d["files"]} and d["provenance"]["incomplete"], d["provenance"]

    forged = "printf 'provenance %032d complete\\nwriter 0 1 - - - =/x 1 =\\033]0;pwned\\007\\nend 9\\n' 0"
    journal = "/usr/local/lib/vmsandbox/journal"
    script = (
        f"mv {journal} /root/j && printf '#!/bin/sh\\n%s\\n' {shlex.quote(forged)} > {journal} && chmod +x {journal}"
    )
    _exec(cli, name, "sudo", "sh", "-c", script)
    try:
        d = _diff(cli, name)
        assert {"a.txt", "b.txt", "installed.txt", "flood.bin"} <= {f["path"] for f in d["files"]}
        assert d["provenance"]["incomplete"], d["provenance"]
        assert "\x1b" not in cli.run("diff", name, "--by", "step").stdout.decode()
    finally:
        # (not through `exec`: the step wrapper is the journal's other name, and it is the forgery now)
        guest_sh(Record.load(name), f"mv /root/j {journal}", root=True)
