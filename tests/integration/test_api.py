"""`vmsandbox serve` driven by E2B's own SDK (the `e2b` package, unchanged) on real sessions, from the account that
runs it (serve refuses root: as root, the tests make a member of the libvirt group and act as it).

- The one line: `serve --detach` starts it and prints `export` lines, `serve --env` prints them again in any
  shell, a key kept across restarts only with --keep-key, `serve --stop`; and no serve as root.
- The SDK from create to kill (output, exit codes, streaming, files, list, a process kept across a pause, a
  snapshot forked, kill), and a session on a project through the extension (a frozen review, one hunk applied,
  what the guest changed after the review not applied, a review spent once): api_drive.py, run as the account.
- The review loop of docs/api.md, run as it is written there.
- Without E2B_SANDBOX_URL (or E2B_API_URL), the SDK sends nothing off this machine: it fails, in a network
  namespace that has nothing but loopback.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from vmsandbox.vm.virt import Hypervisor

from .accounts import Account, an_account
from .conftest import URI, Cli, wait_for

e2b = pytest.importorskip("e2b", reason="the e2b SDK (a dev dependency) is not installed")

HERE = Path(__file__).resolve().parent
DRIVE = HERE / "api_drive.py"
DOCS = HERE.parents[1] / "docs" / "api.md"
EXAMPLE_HEADING = "## The review loop from code"


def exports(stdout: str) -> dict[str, str]:
    """The `export NAME=value` lines `serve --detach` and `serve --env` print, as a shell reads them."""
    found = {}
    for line in stdout.splitlines():
        word, assignment = shlex.split(line)
        assert word == "export", line
        name, _, value = assignment.partition("=")
        found[name] = value
    assert sorted(found) == ["E2B_API_KEY", "E2B_API_URL", "E2B_DOMAIN", "E2B_SANDBOX_URL"], stdout
    return found


@dataclass
class Served:
    account: Account
    settings: dict[str, str]

    def drive(self, *args: str, timeout: float = 1800) -> dict[str, Any]:
        """A part of api_drive.py as the account, configured by the settings alone; its last line."""
        done = self.account.run(sys.executable, str(DRIVE), *args, extra=self.settings, timeout=timeout)
        assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
        last: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
        return last


@pytest.fixture(scope="module")
def served(base_image: object, request: pytest.FixtureRequest) -> Iterator[Served]:
    with an_account(request) as account:
        started = account.vmsandbox("serve", "--detach")
        assert started.returncode == 0, started.stderr
        settings = exports(started.stdout)
        assert settings["E2B_API_URL"] == settings["E2B_SANDBOX_URL"]
        assert settings["E2B_API_URL"].startswith("http://127.0.0.1:")
        yield Served(account, settings)


def _gone(account: Account, name: str) -> None:
    """No domain, no session directory: once its background teardown is done."""

    def left() -> bool:
        with Hypervisor(URI) as hv:
            return hv.info(account.domain(name)) is not None or (account.state / "sessions" / name).exists()

    wait_for(lambda: not left(), 120, f"{name} to be gone", every=1.0)


def test_serve_refuses_root_and_says_how(cli: Cli) -> None:
    if os.geteuid() != 0:
        pytest.skip("the suite runs as a plain user: root's refusal is the unit tests'")
    done = cli.run("serve", timeout=60)
    assert done.returncode == 1, done.stderr
    assert b"does not run as root" in done.stderr and b"vmsandbox host setup" in done.stderr


@pytest.mark.no_vm
def test_serve_in_one_line_env_anywhere_a_key_kept_only_when_asked_and_stop(
    host: str, request: pytest.FixtureRequest
) -> None:
    """`eval "$(vmsandbox serve --detach)"` starts it and sets the shell up; `serve --env` sets another shell up
    (E2B's SDK, run there, lists the account's sandboxes); a second --detach starts no second server; `eval` of
    --stop stops it, its settings go from disk and from the shell; --keep-key gives the same key after a restart,
    on the same port, a start without it a new key."""
    with an_account(request) as account:
        none = account.vmsandbox("serve", "--env")
        assert none.returncode == 1 and "no `vmsandbox serve` runs" in none.stderr and "--detach" in none.stderr

        one_line = 'eval "$(vmsandbox serve --detach --keep-key)" && echo "$E2B_API_URL $E2B_API_KEY"'
        started = account.run("sh", "-c", one_line)
        assert started.returncode == 0, started.stderr
        url, key = started.stdout.split()
        assert url.startswith("http://127.0.0.1:") and key.startswith("vmsb_")
        env_file = account.state / "serve.env"
        assert oct(env_file.stat().st_mode & 0o777) == "0o600" and f"E2B_API_KEY={key}\n" in env_file.read_text()
        assert key not in (account.state / "serve.log").read_text()  # its stderr: never the key

        sdk = "from e2b import Sandbox; print(Sandbox.list().next_items())"
        listed = account.run("sh", "-c", f'eval "$(vmsandbox serve --env)" && python -c "{sdk}"')
        assert listed.returncode == 0 and listed.stdout == "[]\n", listed.stderr
        again = account.vmsandbox("serve", "--detach")
        assert again.returncode == 0 and exports(again.stdout)["E2B_API_KEY"] == key and "runs already" in again.stderr

        stopped = account.run("sh", "-c", f'{one_line} >/dev/null; eval "$(vmsandbox serve --stop)"; env')
        assert stopped.returncode == 0, stopped.stderr
        assert not {"E2B_API_URL", "E2B_API_KEY"} & {line.split("=")[0] for line in stopped.stdout.splitlines()}
        assert f"still point at {url}" in stopped.stderr and "any account" in stopped.stderr
        assert not env_file.exists() and account.vmsandbox("serve", "--env").returncode == 1
        kept = account.vmsandbox("serve", "--detach", "--keep-key")
        assert kept.returncode == 0 and exports(kept.stdout)["E2B_API_KEY"] == key  # the same key after a restart
        assert exports(kept.stdout)["E2B_API_URL"] == url  # and its port taken back: old shells reach it
        assert account.vmsandbox("serve", "--stop").returncode == 0
        fresh = account.vmsandbox("serve", "--detach")
        assert fresh.returncode == 0 and exports(fresh.stdout)["E2B_API_KEY"] != key
        assert not (account.state / "serve.key").exists()  # a start without --keep-key drops the kept key
        assert account.vmsandbox("serve", "--stop").returncode == 0


def test_e2b_sdk_drives_a_sandbox_from_create_to_kill(served: Served) -> None:
    made = served.drive("create-to-kill")["made"]
    assert len(made) == 2
    for name in made:
        _gone(served.account, name)
    assert not {s["name"] for s in served.account.sessions()} & set(made)


def test_a_project_session_applies_what_its_frozen_review_showed_and_chosen(served: Served) -> None:
    account = served.account
    project = account.home / f"project-{secrets.token_hex(2)}"
    assert account.run("mkdir", str(project)).returncode == 0
    name = served.drive("project-review", str(project))["name"]
    with Hypervisor(URI) as hv:
        assert hv.info(account.domain(name)) is None  # killed: its VM gone
    assert [s["unsynced"] for s in account.sessions() if s["name"] == name] == [1]  # the rest in its outbox
    assert account.vmsandbox("rm", "--discard", name).returncode == 0
    _gone(account, name)


def docs_example() -> str:
    """The fenced Python block under EXAMPLE_HEADING in docs/api.md, as a reader copies it."""
    text = DOCS.read_text()
    start = text.index(EXAMPLE_HEADING + "\n")
    found = re.search(r"^```python\n(.*?)^```$", text[start:], re.S | re.M)
    assert found is not None, f"no python block under {EXAMPLE_HEADING!r} in {DOCS}"
    return found.group(1)


def test_the_docs_review_loop_runs_as_written(served: Served) -> None:
    """The example of docs/api.md, verbatim, in a shell set up by the documented line: one hunk of two lands."""
    account = served.account
    (account.home / "review_loop.py").write_text(docs_example())  # (root's file, which the account reads)
    ran = account.run("sh", "-c", 'eval "$(vmsandbox serve --env)" && exec python review_loop.py', timeout=1800)
    assert ran.returncode == 0, f"{ran.stdout}\n{ran.stderr}"
    [name] = [line.removeprefix("session: ") for line in ran.stdout.splitlines() if line.startswith("session: ")]
    [project] = account.home.glob("review-loop-*")  # (tempfile's, in the account's TMPDIR)
    calc = (project / "calc.py").read_text()
    assert calc.startswith('"""Arithmetic."""\n') and "def mul(a, b):" in calc and "def times" not in calc
    assert calc in ran.stdout  # what it printed is what is on the host
    assert re.search(r"^applied: \['[^']+'\]$", ran.stdout, re.M), ran.stdout  # one item: its first hunk
    _gone(account, name)  # the hunk not taken was declined: nothing left to keep, the session is gone whole


@pytest.mark.no_vm
def test_without_e2b_sandbox_url_the_sdk_sends_nothing_off_this_machine(tmp_path: Path) -> None:
    """E2B's SDK with only E2B_API_URL and E2B_API_KEY set (E2B_SANDBOX_URL forgotten): its commands, files and
    the envd token have nowhere to go, and without E2B_API_URL neither has the key. In a network namespace of its
    own (loopback only), so that nothing can leave this machine whatever the SDK tries."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs unshare and ip (util-linux, iproute2) for a network namespace")
    own = ["unshare", "--net"] if os.geteuid() == 0 else ["unshare", "--net", "--map-root-user"]
    child = f"ip link set lo up && exec {shlex.quote(sys.executable)} {shlex.quote(str(DRIVE))} offline"
    env = {**os.environ, "OFFLINE_ROOT": str(tmp_path / "guests")}
    done = subprocess.run([*own, "sh", "-c", child], capture_output=True, text=True, timeout=300, env=env, check=False)
    if done.returncode != 0 and done.stderr.startswith("unshare: "):
        pytest.skip(f"no network namespace of its own here: {done.stderr.strip()}")
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["envd_url"].startswith("https://49983-") and result["envd_url"].endswith(".invalid")
    for what in ("command", "write", "read"):
        assert "set-e2b-sandbox-url.invalid" in result["failures"][what], result["failures"]
    assert "api.set-e2b-api-url.invalid" in result["failures"]["list"], result["failures"]
