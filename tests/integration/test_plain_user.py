"""vmsandbox without sudo: a plain user in the libvirt group runs, pulls (from a live VM and from a dead one's
disk) and destroys a session of their own,
under their own XDG state directory (below a home that is 0700, as Ubuntu makes it); a user outside the group
is told which group is missing; root's `ls` and `gc` leave the user's session alone."""

from __future__ import annotations

import json
import os
import pwd
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from vmsandbox import paths
from vmsandbox.confine import access
from vmsandbox.session.place import pins
from vmsandbox.session.record import DOMAIN_PREFIX
from vmsandbox.vm.virt import Hypervisor

from .conftest import URI, Cli

pytestmark = pytest.mark.root("it makes local accounts")


@dataclass
class User:
    name: str
    uid: int
    gid: int
    home: Path

    def run(self, *args: str, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """vmsandbox as this user, as their login would run it: no sudo, their HOME, our data directory."""
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(self.home), "LANG": "C.UTF-8"}
        if "VMSANDBOX_DATA_DIR" in os.environ:
            env["VMSANDBOX_DATA_DIR"] = os.environ["VMSANDBOX_DATA_DIR"]
        argv = ["runuser", "-u", self.name, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items())]
        return subprocess.run(
            [*argv, sys.executable, "-m", "vmsandbox", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd or self.home,
            check=False,
        )


def _make_user(groups: list[str]) -> User:
    name = f"vmsbx{secrets.token_hex(3)}"
    subprocess.run(
        ["useradd", "--create-home", "--shell", "/bin/sh", *(["-G", ",".join(groups)] if groups else []), name],
        check=True,
    )
    pw = pwd.getpwnam(name)
    home = Path(pw.pw_dir)
    home.chmod(0o700)  # QEMU's account must get through it all the same
    return User(name, pw.pw_uid, pw.pw_gid, home)


def _remove_user(user: User) -> None:
    with Hypervisor(URI) as hv:  # whatever the test left of theirs
        for info in list(hv.domains(f"{DOMAIN_PREFIX}u{user.uid}-")):
            hv.destroy(info.name)
    for pin in (paths.images_dir() / pins.DIR).glob(f"{user.uid}.*"):
        pin.unlink()
    subprocess.run(["userdel", "--remove", user.name], check=False, capture_output=True)


@pytest.fixture
def member() -> Iterator[User]:
    user = _make_user([access.GROUP])
    can_run = user.run("--version")
    if can_run.returncode != 0:
        _remove_user(user)
        pytest.fail(
            f"{sys.executable} cannot be run by another account ({can_run.stderr.strip()}): make the venv from "
            "the system's Python (`make setup` does)"
        )
    yield user
    _remove_user(user)


@pytest.fixture
def stranger() -> Iterator[User]:
    user = _make_user([])
    yield user
    _remove_user(user)


def test_a_member_needs_nothing_of_roots_shared_memory(member: User) -> None:
    """Root's sessions share memory here: the directory their holders write in is root's alone (as a warm start of
    root's leaves it, /run/vmsandbox 0700); the member's `doctor`, `host ls` and `rm --stale` read none of it, and
    fail on none of it (seen: "permission denied: /run/vmsandbox/memory", by test order only)."""
    holders = paths.memory_holders_dir()
    for d in (holders.parent, holders):
        d.mkdir(mode=0o700, exist_ok=True)
    for step in (("doctor",), ("host", "ls"), ("rm", "--stale", "--dry-run")):
        done = member.run(*step)
        assert done.returncode == 0, f"{step}: {done.stderr}"
    assert "each session loads a copy" in member.run("doctor").stdout  # (only root hands QEMU a sealed file)


def test_a_member_of_the_libvirt_group_runs_pulls_and_destroys_without_sudo(member: User, cli: Cli) -> None:
    project = member.home / "proj"
    assert member.run("--version").returncode == 0
    subprocess.run(["runuser", "-u", member.name, "--", "mkdir", str(project)], check=True)
    (project / "kept.txt").write_text("from the host\n")
    os.chown(project / "kept.txt", member.uid, member.gid)

    doctor = member.run("doctor")
    assert "libvirt group: you are in libvirt" in doctor.stdout, (doctor.stdout, doctor.stderr)

    r = member.run(
        "run", "--keep", "--name", "mine", str(project), "--", "sh", "-c", "id -un > who.txt; echo hi > new.txt"
    )
    assert r.returncode == 0, r.stderr
    domain = f"{DOMAIN_PREFIX}u{member.uid}-mine"
    with Hypervisor(URI) as hv:
        assert hv.info(domain) is not None  # the uid keeps two accounts' "mine" apart

    state = member.home / ".local" / "state" / "vmsandbox" / "sessions" / "mine"
    listed = [json.loads(line) for line in member.run("ls", "--json").stdout.splitlines()]
    assert [s["name"] for s in listed] == ["mine"]
    assert all(s["name"] != "mine" for s in cli.ls())  # root's sessions are another account's: not listed
    root_gc = cli.run("rm", "--stale")
    assert root_gc.returncode == 0, root_gc.stderr.decode()
    with Hypervisor(URI) as hv:
        assert hv.info(domain) is not None, root_gc.stderr.decode()  # root's gc does not take it for an orphan

    logs = member.run("logs", "mine")
    assert logs.returncode == 0 and logs.stdout, logs.stderr  # the console is the user's to read

    pull = member.run("pull", "mine", "--yes")
    assert pull.returncode == 0, pull.stderr
    for name, text in (("new.txt", "hi\n"), ("who.txt", f"{member.name}\n")):
        st = (project / name).stat()
        assert (project / name).read_text() == text
        assert (st.st_uid, st.st_gid) == (member.uid, member.gid)  # theirs: nothing root's in their tree
    owned_by_others = [
        p for p in state.rglob("*") if not p.is_symlink() and p.stat().st_uid not in (member.uid, access_uid())
    ]
    assert owned_by_others == []

    # checkpoints and forks: libvirt hands a frozen overlay (a backing image now) to QEMU's account for good
    for step in (
        ("checkpoint", "create", "mine", "c1"),
        ("exec", "mine", "--", "rm", "new.txt"),
        ("checkpoint", "restore", "mine", "c1"),
        ("create", "--from", "mine", "--name", "mine-b"),
    ):
        done = member.run(*step)
        assert done.returncode == 0, f"{step}: {done.stderr}"
    for name in ("mine", "mine-b"):
        assert member.run("exec", name, "--", "cat", "new.txt").stdout == "hi\n"
    assert member.run("rm", "mine-b", "--discard").returncode == 0

    # its VM dies: the workspace disk is read by a reader VM of the user's own (no root anywhere)
    assert member.run("exec", "mine", "--", "sh", "-c", "echo late > late.txt; sync").returncode == 0
    with Hypervisor(URI) as hv:
        hv.destroy(domain)
    late = member.run("pull", "mine", "--yes")
    assert late.returncode == 0, late.stderr
    assert "mounted in the reader VM" in late.stderr, late.stderr
    assert (project / "late.txt").read_text() == "late\n"
    assert (project / "late.txt").stat().st_uid == member.uid
    assert list(state.parent.glob(".reader-*")) == []
    with Hypervisor(URI) as hv:
        assert list(hv.domains(f"{DOMAIN_PREFIX}u{member.uid}-.reader-")) == []

    gone = member.run("rm", "mine")
    assert gone.returncode == 0, gone.stderr
    with Hypervisor(URI) as hv:
        assert hv.info(domain) is None
    assert not state.exists()


def access_uid() -> int:
    """libvirt's QEMU account: it owns the disks of a running VM (libvirt hands them over and back)."""
    from vmsandbox.confine import accounts

    uid = accounts.qemu_uid()
    assert uid is not None
    return uid


def test_a_user_outside_the_group_is_told_which_group_is_missing(stranger: User) -> None:
    doctor = stranger.run("doctor")
    assert doctor.returncode != 0
    assert f"not in the group {access.GROUP}" in doctor.stdout, doctor.stdout
    assert f"host setup --user {stranger.name}" in doctor.stdout
    subprocess.run(["runuser", "-u", stranger.name, "--", "mkdir", str(stranger.home / "proj")], check=True)
    run = stranger.run("run", str(stranger.home / "proj"), "--", "true")
    assert run.returncode != 0
    assert "libvirt group" in run.stderr and "Traceback" not in run.stderr, run.stderr
