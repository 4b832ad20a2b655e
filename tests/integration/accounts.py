"""Another account than the tests' (a fresh member of the libvirt group when the suite runs as root; the suite's
own account, in a state directory of its own, when it does not): whom `vmsandbox serve` and `vmsandbox mcp --http`
serve, as they never serve root. Shared by test_api.py and test_mcp.py."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from vmsandbox.confine import access
from vmsandbox.session.record import DOMAIN_PREFIX
from vmsandbox.vm.virt import Hypervisor

from .conftest import LOG_KEEP_DIR, URI

VENV_BIN = str(Path(sys.executable).parent)


@dataclass
class Account:
    """Whom `serve` serves: as root, a fresh member of the libvirt group (its own home and state); as a plain user,
    that user, in the run's state directory."""

    name: str
    uid: int
    home: Path
    state: Path
    env: dict[str, str]
    other: bool  # another account than the test's: reached through runuser
    logs: list[Path] = field(default_factory=list)

    def run(
        self, *argv: str, extra: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        env = {**self.env, **(extra or {})}
        if self.other:  # (runuser is found on the test's PATH; the account's environment is `env -i`'s)
            argv = ("runuser", "-u", self.name, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv)
        return subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd or self.home,
            env=None if self.other else env,
            check=False,
        )

    def vmsandbox(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return self.run(sys.executable, "-m", "vmsandbox", *args, timeout=timeout)

    def sessions(self) -> list[dict[str, Any]]:
        listed = self.vmsandbox("ls", "--json")
        assert listed.returncode == 0, listed.stderr
        if listed.stdout.lstrip().startswith("["):  # (an array, or an object a line: either is read)
            whole: list[dict[str, Any]] = json.loads(listed.stdout)
            return whole
        return [json.loads(line) for line in listed.stdout.splitlines() if line.strip()]

    def domain(self, name: str) -> str:
        return f"{DOMAIN_PREFIX}u{self.uid}-{name}"


def _base_env(home: Path) -> dict[str, str]:
    env = {"PATH": f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8"}
    env["TMPDIR"] = str(home)  # (what the docs' example makes in a temporary directory goes with the account)
    for passed in ("VMSANDBOX_DATA_DIR", "VMSANDBOX_CPUS", "VMSANDBOX_LIBVIRT_URI"):
        if passed in os.environ:
            env[passed] = os.environ[passed]
    return env


@contextlib.contextmanager
def an_account(request: pytest.FixtureRequest) -> Iterator[Account]:
    if os.geteuid() != 0:
        me = pwd.getpwuid(os.geteuid())
        state = Path(os.environ["VMSANDBOX_STATE_DIR"]) / f"serve-{secrets.token_hex(3)}"
        state.mkdir(mode=0o700)
        home = state / "home"
        home.mkdir(mode=0o700)
        env = {**_base_env(home), "VMSANDBOX_STATE_DIR": str(state)}
        account = Account(me.pw_name, me.pw_uid, home, state, env, other=False)
    else:
        name = f"vmsbx{secrets.token_hex(3)}"
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", "-G", access.GROUP, name], check=True)
        pw = pwd.getpwnam(name)
        home = Path(pw.pw_dir)
        home.chmod(0o700)  # (QEMU's account gets through it all the same)
        account = Account(name, pw.pw_uid, home, home / ".local/state/vmsandbox", _base_env(home), other=True)
    try:
        ran = account.vmsandbox("--version")
        assert ran.returncode == 0, f"{sys.executable} cannot be run by {account.name}: {ran.stderr}"
        yield account
    finally:
        _clean_up(account, failed=bool(request.session.testsfailed))


def _clean_up(account: Account, *, failed: bool) -> None:
    """Whatever the account left: its serve, its sessions (their consoles kept when a test failed), the account
    (removed whatever went wrong before)."""
    try:
        _stop_and_remove_sessions(account, failed=failed)
    finally:
        if account.other:
            subprocess.run(["userdel", "--remove", account.name], check=False, capture_output=True)
        else:
            shutil.rmtree(account.state, ignore_errors=True)


def _stop_and_remove_sessions(account: Account, *, failed: bool) -> None:
    account.vmsandbox("serve", "--stop")
    for log_file in (account.state / "sessions").glob("*/console.log") if failed else ():
        LOG_KEEP_DIR.mkdir(parents=True, exist_ok=True)
        kept = LOG_KEEP_DIR / f"api-{log_file.parent.name}.console.log"
        shutil.copyfile(log_file, kept)
        print(f"\nserial console of {log_file.parent.name} kept at {kept}")
    with contextlib.suppress(AssertionError, json.JSONDecodeError):
        for s in account.sessions():
            account.vmsandbox("rm", "--discard", "--force", s["name"], timeout=300)
    with Hypervisor(URI) as hv:
        for info in list(hv.domains(f"{DOMAIN_PREFIX}u{account.uid}-")):
            if account.other:
                hv.destroy(info.name)
