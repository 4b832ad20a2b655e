"""Warm starts on real VMs: sessions restored from one template are each their own machine (hostname, user,
host key, entropy, clock, workspace), `--cold` boots, and a template build that dies is cleaned up by gc.
(Every other integration test runs on warm sessions too: warm is the default.)"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import (
    CLI_POLL,
    Cli,
    VmFactory,
    assert_gone,
    guest_sh,
    played_user,
    processes,
    unique_name,
    wait_for,
)
from vmsandbox import paths
from vmsandbox.image import store
from vmsandbox.session.place import templates
from vmsandbox.session.place.local import template
from vmsandbox.session.record import Record

PROBE = (
    "hostname; id -u; id -g; cat /proc/sys/kernel/random/uuid; openssl rand -hex 16; date +%s; "
    'sudo ssh-keygen -y -f /etc/ssh/ssh_host_ed25519_key; cat README; findmnt -n -o SOURCE --target "$PWD"'
)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("warm") / "warm project"
    p.mkdir()
    (p / "README").write_text("warm hello\n")
    return p


@pytest.fixture(scope="module")
def sessions(cli: Cli, project: Path, base_image: store.Image) -> Iterator[dict[str, str]]:
    """Two warm sessions and a cold one, kept, for the invoking user alice (uid 1234, gid 2345)."""
    names = {"warm1": unique_name(), "warm2": unique_name(), "cold": unique_name()}
    env = cli.env(SUDO_USER="alice", SUDO_UID="1234", SUDO_GID="2345")
    try:
        for kind, name in names.items():
            cold = ["--cold"] if kind == "cold" else []
            r = cli.run("run", "--keep", *cold, "--name", name, str(project), "--", "true", env=env)
            assert r.returncode == 0, r.stderr.decode()
        yield names
    finally:
        for name in names.values():
            cli.run("rm", name, "--discard")


def probe(cli: Cli, name: str) -> list[str]:
    r = cli.run("exec", name, "--", "sh", "-c", PROBE)
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout.decode().splitlines()


def test_each_warm_session_is_its_own_machine(cli: Cli, sessions: dict[str, str]) -> None:
    seen: dict[str, list[str]] = {}
    for kind, name in sessions.items():
        record = Record.load(name)
        assert record.start == ("cold" if kind == "cold" else "warm"), record.start_note
        host_now = time.time()
        out = probe(cli, name)
        hostname, uid, gid, uuid, rand, clock, host_key, readme, source = out
        assert hostname == f"vmsandbox-{name}"
        assert (uid, gid) == tuple(str(n) for n in played_user()[1:])
        assert abs(int(clock) - host_now) < 10, "the guest's clock was not stepped to the host's"
        # the key sshd presents is the one this session generated on the host and pinned
        assert host_key.split()[:2] == record.files.host_key.with_suffix(".pub").read_text().split()[:2]
        assert readme == "warm hello"
        assert source == ("/dev/vdb" if kind == "cold" else "/dev/sda")  # the hot-plugged workspace disk
        seen[kind] = [uuid, rand, host_key]
    one, two = seen["warm1"], seen["warm2"]
    # restored from one memory image, yet their random generators were reseeded apart
    assert one[0] != two[0], "two warm sessions drew the same kernel UUID"
    assert one[1] != two[1], "two warm sessions drew the same `openssl rand`"
    assert one[2] != two[2], "two sessions present the same SSH host key"


def test_a_tcg_guest_is_not_shown_the_string_flags_tcg_runs_a_byte_a_loop(cli: Cli, sessions: dict[str, str]) -> None:
    """Under TCG `rep movsb` and `rep stosb` run an element a loop: warm or cold, the guest is shown neither erms
    nor fsrm, so its kernel copies and clears memory 8 bytes an instruction."""
    for name in sessions.values():
        if Record.load(name).accel != "tcg":
            pytest.skip("the guest runs under KVM: it sees the host's flags")
        r = cli.run("exec", name, "--", "grep", "-m1", "^flags", "/proc/cpuinfo")
        flags = set(r.stdout.decode().split())
        assert "sse2" in flags, r.stderr.decode()  # (the flags were read)
        assert not {"erms", "fsrm"} & flags


def test_warm_sessions_share_one_template_and_their_overlays_are_their_own(
    sessions: dict[str, str], base_image: store.Image
) -> None:
    one, two = (Record.load(sessions[k]) for k in ("warm1", "warm2"))
    assert one.template is not None
    assert one.template == two.template
    tmpl = Path(one.template)
    assert tmpl.parent == template.root_of(base_image)
    assert one.system_disk != two.system_disk
    assert not (one.files.root / "restore.save").exists()  # the memory copy goes once restored
    meta = json.loads((tmpl / template.META).read_text())
    assert meta["key"]["image"] == base_image.version


def test_a_warm_session_ends_like_a_cold_one(cli: Cli, project: Path, base_image: store.Image) -> None:
    name = unique_name()
    r = cli.run("run", "--yes", "--name", name, str(project), "--", "sh", "-c", "echo warm > made-warm.txt")
    assert r.returncode == 0, r.stderr.decode()
    assert b"Restoring" in r.stderr, r.stderr.decode()
    assert (project / "made-warm.txt").read_text() == "warm\n"
    (project / "made-warm.txt").unlink()
    assert_gone(name)


def test_a_template_build_killed_midway_is_collected_by_gc(
    cli: Cli, project: Path, base_image: store.Image, owned_name: str
) -> None:
    """An image store of its own (the base image's files linked in), where no template exists yet: the run builds
    one and is killed as its VM starts booting; gc destroys the template's VM and removes its half-built
    directory; nothing was ever listed as usable. (A store of its own: another test's gc would collect the
    killed build first.)"""
    data = Path(tempfile.mkdtemp(prefix="vmsandbox-it-data-", dir="/var/tmp"))
    try:
        data.chmod(0o755)  # libvirt's QEMU user reads the image through it
        image = data / "images" / base_image.path.name
        image.mkdir(parents=True, mode=0o755)
        for name in (paths.IMAGE_DISK, paths.IMAGE_KERNEL, paths.IMAGE_INITRD, paths.IMAGE_MANIFEST):
            (image / name).symlink_to(base_image.path / name)
        env = cli.env(VMSANDBOX_DATA_DIR=str(data))
        killed = {**env, "VMSANDBOX_FAILPOINTS": "template.boot=kill-after:0"}
        r = cli.run("run", "--name", owned_name, str(project), "--", "true", env=killed)
        assert r.returncode == -9, r.stderr.decode()
        root = template.root_of(store.get_image_at(image))
        half = list(root.glob(".tmp-*"))
        assert len(half) == 1, "the killed build left no directory to collect"
        its_vm = f"guest={templates.DOMAIN_PREFIX}{half[0].name[len('.tmp-') :]},"
        assert its_vm in processes()
        assert not [p for p in root.iterdir() if not p.name.startswith(".")]  # nothing usable, nothing failed
        g = cli.run("rm", "--stale", env=env)
        assert g.returncode == 0, g.stderr.decode()
        assert "removed an interrupted template build" in g.stderr.decode() + g.stdout.decode()
        assert not list(root.glob(".tmp-*"))
        wait_for(lambda: its_vm not in processes(), 30, "the template's VM to go")
        assert_gone(owned_name)  # the session the killed run was creating went with the same gc
    finally:
        shutil.rmtree(data, ignore_errors=True)


def test_stop_and_start_keep_processes_and_work(cli: Cli, project: Path, vm_factory: VmFactory) -> None:
    """A stopped session holds no QEMU, is read from its disk and kept from destroy and gc; `start` brings back
    its processes and work. (Across a libvirtd restart: test_faults' restart test, which takes the host alone.)"""
    record = vm_factory.make(project)
    assert record.start == "warm"  # restored from the template, not booted
    name = record.name
    script = "nohup sleep 7777 >/dev/null 2>&1 & echo $! > /tmp/sleeper; echo unsynced > stopped-work.txt"
    guest_sh(Record.load(name), script)
    pid = cli.run("exec", name, "--", "cat", "/tmp/sleeper").stdout.strip()
    s = cli.run("stop", name)
    assert s.returncode == 0, s.stderr.decode()
    listed = next(x for x in cli.ls() if x["name"] == name)
    assert listed["state"] == "stopped"
    assert int(listed["disk_bytes"]) > 50 * 1024**2  # type: ignore[call-overload]  # its memory is on disk
    assert f"guest=vmsandbox-{name}," not in processes()  # no QEMU: no CPU, no RAM
    e = cli.run("exec", name, "--", "true")
    assert e.returncode != 0 and f"vmsandbox start {name}".encode() in e.stderr, e.stderr.decode()
    d = cli.run("diff", name)  # read from a copy of the workspace disk, the VM left as it was
    assert d.returncode == 0 and b"+unsynced" in d.stdout, d.stdout.decode() + d.stderr.decode()
    refused = cli.run("rm", name)
    assert refused.returncode != 0 and b"unsynced" in refused.stderr, refused.stderr.decode()
    g = cli.run("rm", "--stale")
    assert g.returncode == 0 and name.encode() not in g.stdout + g.stderr  # a stopped session is not garbage
    before = time.time()
    st = cli.run("start", name)
    assert st.returncode == 0, st.stderr.decode()
    probe_out = cli.run("exec", name, "--", "sh", "-c", f"kill -0 {pid.decode()} && cat stopped-work.txt; date +%s")
    assert probe_out.returncode == 0, probe_out.stderr.decode()
    work, clock = probe_out.stdout.decode().split()
    assert work == "unsynced"
    assert abs(int(clock) - before) < 30
    assert next(x for x in cli.ls() if x["name"] == name)["egress"] == "up"
    p = cli.run("pull", name, "--yes")
    assert p.returncode == 0, p.stderr.decode()
    assert (project / "stopped-work.txt").read_text() == "unsynced\n"
    (project / "stopped-work.txt").unlink()
    s = cli.run("stop", name)
    assert s.returncode == 0, s.stderr.decode()
    gone = cli.run("rm", name)  # a stopped session with nothing unsynced goes like any other
    assert gone.returncode == 0, gone.stderr.decode()
    assert_gone(name)


def test_a_warm_session_that_reboots_comes_back_as_itself(cli: Cli, project: Path, vm_factory: VmFactory) -> None:
    """The guest's memory came from a template, but its identity was kept on its own disk: a reboot applies it
    again (not a template waiting for an identity), and the hot-plugged workspace is mounted again."""
    record = vm_factory.make(project)
    owned_name = record.name
    assert record.start == "warm"
    guest_sh(record, "echo kept > rebooted.txt")
    boot_id = "/proc/sys/kernel/random/boot_id"
    before = cli.run("exec", owned_name, "--", "cat", boot_id).stdout
    assert len(before.strip()) == 36, before
    cli.run("exec", owned_name, "--", "sudo", "systemctl", "reboot")  # the connection drops: any exit code

    def back() -> bool:  # (a guest still shutting down answers too: only another boot counts)
        try:
            up = cli.run("exec", owned_name, "--", "sh", "-c", f"cat {boot_id} rebooted.txt", timeout=30)
        except subprocess.TimeoutExpired:
            return False
        return up.returncode == 0 and before not in up.stdout and b"kept" in up.stdout

    wait_for(back, 180, "the rebooted guest to answer as itself", every=CLI_POLL)
    out = cli.run("exec", owned_name, "--", "sh", "-c", 'hostname; findmnt -n -o SOURCE --target "$PWD"')
    assert out.stdout.decode().split() == [f"vmsandbox-{owned_name}", "/dev/sda"], out.stderr.decode()
    assert cli.run("rm", owned_name, "--discard").returncode == 0
