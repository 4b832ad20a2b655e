"""The fault matrix: vmsandbox killed (SIGKILL, through a named fail-point) in each phase of its commands, the
VM killed under a command, libvirtd restarted, the host's disks full, commands racing on one session, and a
damaged session record. After each: nothing lost (every guest change applied whole, or in the outbox, or
still in a live VM), no half-written file in the project, and after `gc`/`destroy` no domain, daemon, port
or lock left. The "When things go wrong" table of docs/troubleshooting.md states what these tests assert.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from vmsandbox import paths
from vmsandbox.session import lock
from vmsandbox.session.record import domain_name
from vmsandbox.sync.land.write import TMP_PREFIX
from vmsandbox.vm.virt import Hypervisor

from .conftest import URI, Cli, VmFactory, assert_gone, guest_sh, processes, wait_for

BIG = "head -c 3000000 /dev/urandom > big.bin"  # three chunks: a kill at the second is mid-file


def killed_at(point: str, after: int = 0) -> dict[str, str]:
    return {"VMSANDBOX_FAILPOINTS": f"{point}=kill-after:{after}"}


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def guest_sha(cli: Cli, name: str, rel: str) -> str:
    r = cli.run("exec", name, "--", "sha256sum", rel)
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout.decode().split()[0]


def temporaries(project: Path) -> list[Path]:
    return [p for p in project.rglob("*") if p.name.startswith(TMP_PREFIX)]


def state_of(cli: Cli, name: str) -> str | None:
    rows = [row for row in cli.ls() if row["name"] == name]
    return str(rows[0]["state"]) if rows else None


def gc_line(cli: Cli, name: str) -> str:
    r = cli.run("rm", "--stale")
    assert r.returncode == 0, r.stderr.decode()
    lines = [line for line in r.stderr.decode().splitlines() if re.search(rf"\b{name}\b", line)]
    return "\n".join(lines)


# ---------------------------------------------------------------- `run` killed in each phase


@pytest.mark.parametrize("point", ["run.capture", "run.boot", "run.restore", "run.egress"])
def test_run_killed_before_the_command_leaves_nothing_after_gc(
    cli: Cli, owned_name: str, project: Path, point: str
) -> None:
    before = {p.name: sha(p) for p in project.iterdir()}
    cold = ["--cold"] if point == "run.boot" else []  # run.boot is a cold start's, run.restore a warm one's
    argv = ["run", *cold, "--name", owned_name, str(project), "--", "touch", "never"]
    r = cli.run(*argv, env=cli.env(**killed_at(point)))
    assert r.returncode == -9, r.stderr.decode()
    assert state_of(cli, owned_name) in ("orphaned", "exited")
    time.sleep(2)  # a daemon spawned just before the kill gets to write its state
    assert "removed session" in gc_line(cli, owned_name)
    assert_gone(owned_name)
    assert {p.name: sha(p) for p in project.iterdir()} == before  # the guest never ran anything


@pytest.mark.parametrize(
    ("point", "after"),
    [("run.gather", 0), ("apply.chunk", 1), ("export.item", 0)],
    ids=["gather", "apply-mid-file", "export"],
)
def test_run_killed_at_its_end_keeps_the_work(cli: Cli, owned_name: str, project: Path, point: str, after: int) -> None:
    """The command ran; vmsandbox dies while bringing its work back. The VM lives on with the work; gc keeps
    it; pull brings every file back whole."""
    script = f"{BIG}; echo 'export A=1' > .envrc; sha256sum big.bin > /tmp/want"  # .envrc: risky, so exported
    env = cli.env(**killed_at(point, after))
    r = cli.run(
        "run", "--yes", "--include-binary", "--name", owned_name, str(project), "--", "sh", "-c", script, env=env
    )
    assert r.returncode == -9, r.stderr.decode()
    want = guest_sha(cli, owned_name, "big.bin")
    assert not (project / "big.bin").exists() or sha(project / "big.bin") == want  # never a partial file
    assert state_of(cli, owned_name) == "orphaned"
    assert "kept session" in gc_line(cli, owned_name)
    assert temporaries(project) == []  # gc's look at the project swept the killed write's temporary file
    p = cli.run("pull", owned_name, "--yes", "--include-risky", "--include-binary")
    assert p.returncode == 0, p.stderr.decode()
    assert sha(project / "big.bin") == want
    assert (project / ".envrc").read_text() == "export A=1\n"
    d = cli.run("rm", owned_name)
    assert d.returncode == 0, d.stderr.decode()
    assert_gone(owned_name)


def test_run_teardown_killed_is_finished_by_gc(cli: Cli, owned_name: str, project: Path) -> None:
    """The review is done and the exit code given; the background teardown dies before destroying the VM."""
    r = cli.run(
        "run",
        "--yes",
        "--name",
        owned_name,
        str(project),
        "--",
        "touch",
        "done.txt",
        env=cli.env(**killed_at("run.teardown")),
    )
    assert r.returncode == 0, r.stderr.decode()
    assert (project / "done.txt").exists()
    wait_for(
        lambda: f"vmsandbox.session.end.teardown {owned_name}" not in processes(), 60, "the teardown process to die"
    )
    assert state_of(cli, owned_name) == "ending"
    assert f"finished the teardown of session {owned_name}" in gc_line(cli, owned_name)
    assert_gone(owned_name, within=0)


# ---------------------------------------------------------------- pull, push, destroy, recover killed


@pytest.fixture
def busy_session(vm_factory: VmFactory, project: Path) -> str:
    """A kept session whose guest wrote a file of three chunks (not pulled yet)."""
    record = vm_factory.make(project)
    assert record.start == "warm"  # restored from the template, not booted
    guest_sh(record, BIG)
    return record.name


def test_pull_push_destroy_killed_then_rerun(cli: Cli, busy_session: str, project: Path) -> None:
    name = busy_session
    want = guest_sha(cli, name, "big.bin")
    k = cli.run("pull", name, "--yes", "--include-binary", env=cli.env(**killed_at("apply.chunk", 1)))
    assert k.returncode == -9
    assert not (project / "big.bin").exists()  # killed mid-file: only a temporary file, never big.bin half
    assert len(temporaries(project)) == 1
    again = cli.run("pull", name, "--yes", "--include-binary")
    assert again.returncode == 0, again.stderr.decode()
    assert sha(project / "big.bin") == want and temporaries(project) == []

    (project / "from-host.txt").write_text("host\n")
    k = cli.run("push", name, env=cli.env(**killed_at("push.send")))
    assert k.returncode == -9
    assert cli.run("push", name).returncode == 0
    assert cli.run("exec", name, "--", "cat", "from-host.txt").stdout == b"host\n"

    k = cli.run("rm", name, env=cli.env(**killed_at("destroy.stop")))
    assert k.returncode == -9
    assert state_of(cli, name) == "running"  # its daemon was stopped, its VM and files are whole
    d = cli.run("rm", name)
    assert d.returncode == 0, d.stderr.decode()
    assert_gone(name)


def test_destroy_force_and_recover_killed_then_rerun(cli: Cli, busy_session: str, project: Path) -> None:
    name = busy_session
    want = guest_sha(cli, name, "big.bin")
    k = cli.run("rm", name, "--force", env=cli.env(**killed_at("apply.chunk", 1)))  # mid-export
    assert k.returncode == -9
    assert state_of(cli, name) == "running"  # not retired: the VM still holds the work
    d = cli.run("rm", name, "--force")
    assert d.returncode == 0 and b"kept in" in d.stderr and b"outbox" in d.stderr, d.stderr.decode()
    assert state_of(cli, name) == "exported"
    k = cli.run("pull", name, "--yes", "--include-binary", env=cli.env(**killed_at("pull.apply")))
    assert k.returncode == -9
    assert not (project / "big.bin").exists()
    r = cli.run("pull", name, "--yes", "--include-binary")
    assert r.returncode == 0, r.stderr.decode()
    assert sha(project / "big.bin") == want
    assert_gone(name)  # every change dealt with: recover removed the session


# ---------------------------------------------------------------- the VM, libvirtd


def test_vm_destroyed_under_a_command_keeps_its_work(cli: Cli, owned_name: str, project: Path) -> None:
    script = "echo saved > saved.txt; sync; touch /tmp/ready; sleep 600"
    p = cli.popen("run", "--yes", "--name", owned_name, str(project), "--", "sh", "-c", script)
    try:
        wait_for(
            lambda: cli.run("exec", owned_name, "--", "test", "-e", "/tmp/ready").returncode == 0, 300, "the command"
        )
        with Hypervisor(URI) as hv:
            hv.destroy(domain_name(owned_name))
        _out, err = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode != 0
    assert b"mounted in the reader VM" in err, err.decode()
    assert (project / "saved.txt").read_text() == "saved\n"
    assert_gone(owned_name)


# ---------------------------------------------------------------- full disks


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of 500 MiB: a disk that fills up."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=500m,mode=0755", "tmpfs", mnt], check=True)
    yield mnt
    subprocess.run(["umount", "--lazy", mnt], check=False)


@pytest.mark.root("it mounts a small filesystem to fill")
def test_full_disk_during_pull_then_room_made(cli: Cli, vm_factory: VmFactory, small_fs: Path) -> None:
    project = small_fs / "proj"
    project.mkdir()
    (project / "README").write_text("hi\n")
    record = vm_factory.make(project)
    assert record.start == "warm"  # restored from the template, not booted
    owned_name = record.name
    guest_sh(record, "head -c 20m /dev/zero | tr '\\0' x > big")
    full = small_fs / "filler"  # 500 MiB - 300 MiB leaves less than the file and the pull's reserve (256 MiB)
    subprocess.run(["dd", "if=/dev/zero", f"of={full}", "bs=1M", "count=300", "status=none"], check=True)
    p = cli.run("pull", owned_name, "--yes")
    assert p.returncode == 1, p.stderr.decode()
    err = p.stderr.decode()
    assert "need 20 MiB" in err and "nothing was applied" in err, err
    assert not (project / "big").exists() and temporaries(project) == []
    full.unlink()
    again = cli.run("pull", owned_name, "--yes")
    assert again.returncode == 0, again.stderr.decode()
    assert (project / "big").stat().st_size == 20 * 1024**2
    cli.run("rm", owned_name)
    assert_gone(owned_name)


@pytest.mark.root("it mounts a small filesystem to fill")
def test_full_disk_during_capture(cli: Cli, owned_name: str, project: Path, small_fs: Path) -> None:
    # two copies (the baseline and the workspace disk: the mirror starts with placeholders) do not fit in 500 MiB
    (project / "data.bin").write_bytes(b"\1" * 250 * 1024**2)
    state = small_fs / "state"
    state.mkdir(mode=0o711)
    r = cli.run("run", "--name", owned_name, str(project), "--", "true", env=cli.env(VMSANDBOX_STATE_DIR=str(state)))
    assert r.returncode == 125
    err = r.stderr.decode()
    assert "needs about" in err and "MiB free" in err and "VMSANDBOX_STATE_DIR" in err, err
    assert list((state / "sessions").iterdir()) == []


@pytest.mark.root("it mounts a small filesystem to fill")
def test_full_disk_during_image_build(cli: Cli, small_fs: Path) -> None:
    r = cli.run("image", "build", "--force", env=cli.env(VMSANDBOX_DATA_DIR=str(small_fs)))
    assert r.returncode == 1
    assert b"a build needs 6 GiB" in r.stderr and b"VMSANDBOX_DATA_DIR" in r.stderr, r.stderr.decode()
    assert list((small_fs / "images").glob(".tmp-*")) == []


# ---------------------------------------------------------------- races on one session, a damaged record


def test_commands_racing_on_one_session(cli: Cli, busy_session: str, project: Path) -> None:
    name = busy_session
    want = guest_sha(cli, name, "big.bin")
    files = paths.session_paths(name)
    with lock.held(files, name, "pulling"):  # another vmsandbox in the middle of a pull
        for argv in (["pull", name, "--yes", "--include-binary"], ["rm", name, "--discard"], ["push", name]):
            r = cli.run(*argv)
            assert r.returncode == 1, r.stderr.decode()
            assert f"session {name} is busy: vmsandbox (pid".encode() in r.stderr and b"pulling" in r.stderr
    procs = [cli.popen("pull", name, "--yes", "--include-binary") for _ in range(2)]  # two real pulls at once
    codes = [p.wait(timeout=300) for p in procs]
    assert sorted(codes) in ([0, 0], [0, 1]), codes
    assert sha(project / "big.bin") == want and temporaries(project) == []
    assert cli.run("rm", name).returncode == 0
    assert_gone(name)


def test_damaged_record(cli: Cli, busy_session: str) -> None:
    name = busy_session
    files = paths.session_paths(name)
    files.record.write_text(files.record.read_text()[:40])  # truncated
    assert state_of(cli, name) == "running"  # read from its copy, and mended
    assert files.record.read_text() == files.record.with_name("session.json.copy").read_text()
    files.record.write_text("{")
    files.record.with_name("session.json.copy").write_text("")
    listed = cli.run("ls")
    assert listed.returncode == 0 and b"is damaged, and so is its copy" in listed.stderr  # never hidden
    r = cli.run("pull", name)
    assert r.returncode == 1
    assert b"is damaged, and so is its copy" in r.stderr and b"--discard" in r.stderr, r.stderr.decode()
    assert "kept damaged session" in gc_line(cli, name)  # its workspace disk may hold work
    d = cli.run("rm", name, "--discard")
    assert d.returncode == 0, d.stderr.decode()
    assert_gone(name)
