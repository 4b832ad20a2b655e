"""The jail of the processes that read guest data, tried for real (bubblewrap; no VM): a reader that escapes its
process group, writes outside its target or opens a connection gets nowhere."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from vmsandbox import confine, proc
from vmsandbox.jail import Jail

from .conftest import wait_for

pytestmark = pytest.mark.no_vm


@pytest.fixture
def place() -> Iterator[Path]:
    """A directory the guest-data account can reach (pytest's own is private to root)."""
    made = Path(tempfile.mkdtemp(prefix="vmsandbox-it-jail-", dir="/var/tmp"))
    made.chmod(0o755)
    yield made
    shutil.rmtree(made, ignore_errors=True)


@pytest.fixture
def target(place: Path) -> Path:
    d = place / "target"
    d.mkdir()
    confine.hand_over(d, confine.guest_data_account())
    return d


def jailed(script: str, target: Path) -> proc.Result:
    who = confine.guest_data_account()
    limits = confine.guest_data_limits(1024**3)
    return proc.run(["sh", "-c", script], as_user=who, limits=limits, jail=Jail((target,)), cwd=target, check=False)


def test_a_setsid_grandchild_does_not_outlive_the_reader(target: Path) -> None:
    marker = f"vmsandbox-jail-test-{os.getpid()}"
    r = jailed(f"setsid sh -c 'exec -a {marker} sleep 300' </dev/null >/dev/null 2>&1 & echo started", target)
    assert r.stdout.strip() == "started", r.stderr

    def gone() -> bool:
        found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True, check=False).stdout
        return found.strip() == ""

    wait_for(gone, 10, "the jail's last process to be killed with it")


def test_the_reader_writes_its_target_only(target: Path, place: Path) -> None:
    place.chmod(0o777)  # the account could write here, were it not for the jail
    outside = place / "outside"
    r = jailed(f"echo in > {target}/in.txt; echo out > {outside} 2>&1; echo out > /var/tmp/jail-escape", target)
    assert (target / "in.txt").read_text() == "in\n"
    assert not outside.exists() and not Path("/var/tmp/jail-escape").exists()
    assert "Read-only file system" in r.stderr, r.stderr


def test_the_reader_has_no_network(target: Path) -> None:
    """Its network namespace is empty: even this host's loopback is not there."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        r = proc.run(
            ["bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected"],
            as_user=confine.guest_data_account(), jail=Jail((target,)), cwd=target, check=False,
        )  # fmt: skip
        listener.settimeout(1)
        with pytest.raises(TimeoutError):
            listener.accept()
    assert r.returncode != 0 and "connected" not in r.stdout, r.stdout + r.stderr
