"""libvirtd restarted under running and stopped sessions (as a package upgrade does). The one test here takes the
host alone (`exclusive`: no other test may talk to libvirt meanwhile), so it sits in a module of its own that the
workers reach last."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from vmsandbox.vm import hostsetup

from .conftest import CLI_POLL, Cli, VmFactory, assert_gone, guest_sh, stop_libvirtd, wait_for

pytestmark = pytest.mark.root("it stops and starts the host's libvirtd")


def _parent_comm(pid: int) -> str:
    status = Path(f"/proc/{pid}/status").read_text()
    parent = next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:"))
    return Path(f"/proc/{parent}/comm").read_text().strip()


def _state(cli: Cli, name: str) -> str | None:
    rows = [row for row in cli.ls() if row["name"] == name]
    return str(rows[0]["state"]) if rows else None


@pytest.mark.exclusive
def test_libvirtd_restarted_while_one_session_runs_and_another_is_stopped(
    cli: Cli, vm_factory: VmFactory, project: Path
) -> None:
    """libvirtd stops and comes back (as in a package upgrade): the running session's guest answers all the
    while and `ls` says why it cannot tell its state; the stopped one is not garbage to gc afterwards and starts
    with its processes and unsynced work. One restart serves both: the test takes the host alone."""
    name = vm_factory.make(project).name
    paused = vm_factory.make(project)
    guest_sh(paused, "nohup sleep 7777 >/dev/null 2>&1 & echo $! > /tmp/sleeper; echo unsynced > stopped-work.txt")
    pid = cli.run("exec", paused.name, "--", "cat", "/tmp/sleeper").stdout.strip().decode()
    s = cli.run("stop", paused.name)
    assert s.returncode == 0, s.stderr.decode()
    try:
        stop_libvirtd()
        r = cli.run("exec", name, "--", "true")  # QEMU runs on without libvirtd: the guest still answers
        assert r.returncode == 0 and b"trying session" in r.stderr, r.stderr.decode()
        down = cli.run("ls", "--json")  # what the records say, with the reason once
        assert down.returncode == 0 and b"cannot connect to libvirt" in down.stderr, down.stderr.decode()
        assert [s["state"] for s in map(json.loads, down.stdout.splitlines()) if s["name"] == name] == ["unknown"]
    finally:
        setup = cli.run("host", "setup")  # the rest of the suite needs libvirtd back, whatever happened here
    assert setup.returncode == 0, setup.stderr.decode()
    wait_for(lambda: _state(cli, name) == "running", 60, "ls to show the session again", every=CLI_POLL)
    r = cli.run("exec", name, "--", "cat", "/etc/hostname")
    assert r.returncode == 0 and r.stdout == f"vmsandbox-{name}\n".encode()
    g = cli.run("rm", "--stale")
    assert g.returncode == 0 and paused.name.encode() not in g.stdout + g.stderr  # a stopped session is kept
    assert _state(cli, paused.name) == "stopped"
    before = time.time()
    st = cli.run("start", paused.name)
    assert st.returncode == 0, st.stderr.decode()
    probe = cli.run("exec", paused.name, "--", "sh", "-c", f"kill -0 {pid} && cat stopped-work.txt; date +%s")
    assert probe.returncode == 0, probe.stderr.decode()
    work, clock = probe.stdout.decode().split()
    assert work == "unsynced" and abs(int(clock) - before) < 30
    if not hostsetup.SERVICE_MANAGER.is_dir():  # host setup brought libvirtd back as the child of its reaper,
        assert b"under tini" in setup.stdout + setup.stderr  # whose QEMUs are reaped the moment they exit
        qemu = int(Path(f"/run/libvirt/qemu/{paused.domain}.pid").read_text())
        assert _parent_comm(qemu) == hostsetup.REAPER
    for gone in (name, paused.name):
        d = cli.run("rm", gone, "--discard")
        assert d.returncode == 0, d.stderr.decode()
        assert_gone(gone)
