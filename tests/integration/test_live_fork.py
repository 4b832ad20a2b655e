"""A fork taken while its source runs on, on real VMs: the source keeps its QEMU (saved live, its guest paused for
the save's last pass only), its workspace frozen only while its disk is copied; the fork finds the workspace as the
source's memory knew it, thaws it by itself, and ends the source's SSH sessions it was restored with (its own
egress link takes the guest's proxy port at once); a guest that cannot freeze its workspace is forked the paused way.

Without VMs: the guest's freeze script (guest.freeze.SCRIPT) run with stand-ins for fsfreeze and findmnt, and a
fork's system disk copied from a chain whose top header a session's QEMU rewrote to name a file of the host's."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import VmFactory, guest_sh, unique_name
from tests.integration.test_shared_memory import qemu_pid
from vmsandbox import paths, proc
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest import freeze
from vmsandbox.session.end import lifecycle
from vmsandbox.session.moments import checkpoint, fork
from vmsandbox.session.place import chain, checkpoints
from vmsandbox.session.place.local import disks
from vmsandbox.session.record import Record
from vmsandbox.vm import qemuimg

pytestmark = pytest.mark.root("a live fork needs the source's own QEMU account (root's sessions have one)")

STALE_SSHD = "pgrep -P \"$(cat /run/sshd.pid)\" -x sshd | sort -n | tr '\\n' ' '"


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("live") / "live project"
    p.mkdir()
    (p / "README").write_text("live hello\n")
    return p


@pytest.fixture(scope="module")
def source(module_vms: VmFactory, project: Path) -> Record:
    return module_vms.make(project)


def test_a_live_fork_keeps_its_source_running_and_the_fork_thaws_its_workspace(
    module_vms: VmFactory, source: Record, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(checkpoint.LIVE_SWITCH, raising=False)
    source = Record.load(source.name)
    guest_sh(source, "echo before > marker; (while :; do date +%s.%N >> ticks; sleep 0.05; done) >/dev/null 2>&1 &")
    pid, overlays = qemu_pid(source), len(source.overlays)
    sessions = guest_sh(source, STALE_SSHD, root=True).split()
    new = unique_name()
    module_vms.made.append(new)
    made = fork.fork(source.name, new)
    try:
        forked, source = Record.load(made.name), Record.load(source.name)
        assert qemu_pid(source) == pid, "the source was restored: it did not run on"
        assert len(source.overlays) == overlays + 1  # its disk switched to a new top in the save's pause
        assert forked.memory is not None, forked.memory_note  # the fork maps the sealed copy of the live save
        # both workspaces take writes again (frozen, a write would wait: the guest_sh timeout would fail the test)
        guest_sh(source, "echo after > marker && sync", timeout=60)
        assert guest_sh(forked, "cat marker; echo fork > forked && sync", timeout=60).strip() == "before"
        assert guest_sh(source, "cat marker; ls").split()[0] == "after"
        assert "forked" not in guest_sh(source, "ls").split()
        ticks = guest_sh(forked, "wc -l < ticks; sleep 0.5; wc -l < ticks").split()  # its copy of the writer runs
        assert int(ticks[1]) > int(ticks[0])
        # the source's SSH sessions (the egress link's among them) are gone in the fork; its own link is up
        still = set(guest_sh(forked, STALE_SSHD, root=True).split()) & set(sessions)
        assert not still, f"the fork kept its source's sshd sessions {still}"
        assert "freeze" not in guest_sh(forked, "ps -eo args", root=True)
        assert "freeze" not in guest_sh(source, "ps -eo args", root=True)
    finally:
        lifecycle.remove(Record.load(made.name))


def test_a_fork_reads_on_its_disk_what_its_source_wrote_before_an_earlier_checkpoint(
    module_vms: VmFactory, source: Record
) -> None:
    """The fork's system disk holds every overlay of its source's chain (not only the top's clusters): read with
    the guest's page cache dropped, what was written before a checkpoint is there."""
    source = Record.load(source.name)
    guest_sh(
        source, "head -c 4M /dev/urandom > /root/early && sha256sum /root/early > /root/early.sum && sync", root=True
    )
    checkpoint.take(source.name, "early")
    guest_sh(Record.load(source.name), "echo late > /root/late && sync", root=True)
    new = unique_name()
    module_vms.made.append(new)
    made = fork.fork(source.name, new)
    try:
        said = guest_sh(
            made, "sync; echo 3 > /proc/sys/vm/drop_caches; sha256sum -c /root/early.sum; cat /root/late", root=True
        )
        assert said.split() == ["/root/early:", "OK", "late"]
    finally:
        lifecycle.remove(Record.load(made.name))


def test_a_checkpoint_is_taken_live_and_a_rollback_to_it_thaws_and_ends_what_it_was_restored_with(
    source: Record, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`checkpoint create` keeps the VM running (its QEMU, its processes); a rollback restores the memory saved
    with the workspace frozen, thaws it, and ends the SSH sessions the memory held (the egress link's among them:
    the new one holds the guest's proxy port)."""
    monkeypatch.delenv(checkpoint.LIVE_SWITCH, raising=False)
    source = Record.load(source.name)
    guest_sh(source, "echo one > state && sync")
    pid, sessions = qemu_pid(source), guest_sh(source, STALE_SSHD, root=True).split()
    cp = checkpoint.take(source.name, "held")
    source = Record.load(source.name)
    assert cp.live and qemu_pid(source) == pid, "the checkpoint saved and restored the VM"
    assert "held" in [c.label for c in checkpoints.listed(source.files) if c.live]
    guest_sh(source, "echo two > state && sync", timeout=60)  # thawed in the running VM
    assert "freeze" not in guest_sh(source, "ps -eo args", root=True)

    logged = source.files.egress_log.stat().st_size if source.files.egress_log.exists() else 0
    checkpoint.rollback(source.name, "held", limit=64 << 20)
    source = Record.load(source.name)
    # the write would wait on a workspace still frozen (guest_sh's timeout would fail the test)
    assert guest_sh(source, "cat state; echo three > state && sync", timeout=60).strip() == "one"
    assert "freeze" not in guest_sh(source, "ps -eo args", root=True)
    assert guest_sh(source, f"ls -A {freeze.HELD}", root=True).strip() == ""
    still = set(guest_sh(source, STALE_SSHD, root=True).split()) & set(sessions)
    assert not still, f"the rollback kept the sshd sessions {still} its memory held"
    guest_sh(source, "curl -s -o /dev/null https://held.invalid/ || true")  # through the egress proxy, if it is up
    assert "held.invalid" in source.files.proxy_log.read_text(), "the egress proxy did not answer after the rollback"
    with source.files.egress_log.open("rb") as log:  # its link took the guest's proxy port at the first try
        log.seek(logged)
        assert b"forward down" not in log.read()
    checkpoint.remove(source.name, "held")


def test_a_guest_that_cannot_freeze_its_workspace_is_forked_paused(
    module_vms: VmFactory, source: Record, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(checkpoint.LIVE_SWITCH, raising=False)
    source = Record.load(source.name)
    guest_sh(source, "chmod -x /usr/sbin/fsfreeze", root=True)
    pid = qemu_pid(source)
    new = unique_name()
    module_vms.made.append(new)
    try:
        made = fork.fork(source.name, new)
        source = Record.load(source.name)
        assert qemu_pid(source) != pid  # saved and restored: the way a guest without fsfreeze is forked
        assert guest_sh(made, "cat README").strip() == "live hello"
        lifecycle.remove(Record.load(made.name))
    finally:
        guest_sh(Record.load(source.name), "chmod +x /usr/sbin/fsfreeze", root=True)


def test_a_source_deep_in_overlays_has_them_folded_while_it_runs_and_is_forked_live(
    module_vms: VmFactory, source: Record, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At LIVE_CHAIN overlays the run below the top that no checkpoint needs is folded into the top by QEMU while
    the guest runs (not saved and restored): those overlays are deleted, what they held is read in the source (its
    page cache dropped), in the fork and after a rollback to a checkpoint under them, which still reads as it did."""
    monkeypatch.delenv(checkpoint.LIVE_SWITCH, raising=False)
    name = source.name
    write = "head -c 2M /dev/urandom > /root/deep{0} && sha256sum /root/deep{0} > /root/deep{0}.sum && sync"
    guest_sh(Record.load(name), write.format(0), root=True)
    checkpoint.take(name, "deep-kept")
    for i in (1, 2):  # two overlays that no checkpoint names once these are removed
        guest_sh(Record.load(name), write.format(i), root=True)
        checkpoint.take(name, f"deep-gone{i}")
    for i in (1, 2):
        checkpoint.remove(name, f"deep-gone{i}")
    before = Record.load(name)
    folded = before.overlays[-3:-1]  # the two frozen for deep-gone1 and 2, right below the top
    monkeypatch.setattr(disks, "LIVE_CHAIN", len(before.overlays))
    pid = qemu_pid(before)
    new = unique_name()
    module_vms.made.append(new)
    made = fork.fork(name, new)
    try:
        after = Record.load(name)
        assert qemu_pid(after) == pid, "the source was saved and restored to fold its chain"
        assert not set(folded) & set(after.overlays)
        assert len(after.overlays) == len(before.overlays) - 1  # two folded, one more for the fork's save
        assert not any((after.files.root / o).exists() for o in folded)
        check = "sync; echo 3 > /proc/sys/vm/drop_caches; cat /root/deep?.sum | sha256sum -c --quiet && echo same"
        assert guest_sh(after, check, root=True).strip() == "same"
        assert guest_sh(made, check, root=True).strip() == "same"
    finally:
        lifecycle.remove(Record.load(made.name))
    checkpoint.rollback(name, "deep-kept", limit=64 << 20)
    said = guest_sh(Record.load(name), f"{check}; ls /root/deep?.sum", root=True).split()
    assert said == ["same", "/root/deep0.sum"]  # the checkpoint under the fold reads as it did
    checkpoint.remove(name, "deep-kept")


# a root process of the source's that crashes its kernel once its hostname changes: what happens only in a fork
CRASH_IN_A_FORK = (
    'nohup sh -c \'h=$(cat /proc/sys/kernel/hostname); while [ "$(cat /proc/sys/kernel/hostname)" = "$h" ]; '
    "do sleep 0.05; done; echo c > /proc/sysrq-trigger' >/dev/null 2>&1 &"
)


def test_a_fork_whose_kernel_panics_fails_with_its_console_and_leaves_nothing(
    module_vms: VmFactory, source: Record
) -> None:
    """Fault injection: the fork's kernel panics while it takes its identity. The fork fails at the next look at
    its console (not after the identity's 120 s), with the console's panic lines in the error and the console kept;
    nothing of the fork is left, and the source runs on."""
    source = Record.load(source.name)
    guest_sh(source, CRASH_IN_A_FORK, root=True)
    new = unique_name()
    module_vms.made.append(new)
    try:
        with pytest.raises(VmsandboxError) as raised:
            fork.fork(source.name, new)
        said = raised.value
        assert "its kernel panicked" in said.message and "Kernel panic - not syncing" in said.message, said.message
        kept = Path(said.hint.split("kept at ", 1)[1].split(";", 1)[0])  # type: ignore[union-attr]
        assert kept.is_file() and b"sysrq" in kept.read_bytes()
        assert not paths.session_paths(new).root.exists()
        assert guest_sh(Record.load(source.name), "echo runs on").strip() == "runs on"
    finally:
        guest_sh(Record.load(source.name), "pkill -f 'sysrq[-]trigger' || true", root=True)


# -- the guest's script, with stand-ins ---------------------------------------------------------------------------


@pytest.fixture
def guest(tmp_path: Path) -> dict[str, Path]:
    """A directory of stand-ins for the guest's tools (fsfreeze logs its calls; findmnt names a mount), its
    hostname file, and a pid file of an sshd listener with one session (a copy of sleep named sshd)."""
    tools = tmp_path / "bin"
    tools.mkdir()
    log = tmp_path / "calls"
    (tools / "fsfreeze").write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    (tools / "findmnt").write_text('#!/bin/sh\necho "${MOUNT:-/work}"\n')
    (tools / "sync").write_text("#!/bin/sh\n")
    for tool in tools.iterdir():
        tool.chmod(0o755)
    hostname = tmp_path / "hostname"
    hostname.write_text("vmsandbox-source\n")
    return {"tools": tools, "log": log, "hostname": hostname, "root": tmp_path}


def script(guest: dict[str, Path], mount: str = "/work") -> subprocess.Popen[bytes]:
    env = {**os.environ, "PATH": f"{guest['tools']}:{os.environ['PATH']}", "MOUNT": mount}
    held = str(guest["root"] / "held")
    argv = ["bash", "-c", freeze.SCRIPT, "freeze", "/work/p", str(guest["hostname"]), "30", "0.05", "2", held]
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def restored(guest: dict[str, Path]) -> subprocess.CompletedProcess[bytes]:
    """guest.freeze.RESTORED, as a rollback runs it, with the same stand-ins."""
    env = {**os.environ, "PATH": f"{guest['tools']}:{os.environ['PATH']}", "MOUNT": "/work"}
    argv = ["bash", "-c", freeze.RESTORED, "restored", str(guest["root"] / "held"), "/work/p", "0.05", "200"]
    return subprocess.run(argv, capture_output=True, env=env, timeout=30, check=False)


@contextlib.contextmanager
def sshd_with_a_session(guest: dict[str, Path]) -> Iterator[int]:
    """A stand-in sshd listener (its pid in /run/sshd.pid) with one session (a copy of sleep named sshd): the
    session's pid."""
    fake = guest["root"] / "sshd"
    shutil.copy("/bin/sleep", fake)
    listener = subprocess.Popen(["sh", "-c", f"{fake} 60 & echo $!; wait"], stdout=subprocess.PIPE)
    try:
        assert listener.stdout is not None
        session = int(listener.stdout.readline())
        run = Path("/run/sshd.pid")
        if run.exists():
            pytest.skip("this machine runs an sshd of its own: the script would read its pid file")
        run.write_text(f"{listener.pid}\n")
        try:
            yield session
        finally:
            run.unlink()
    finally:
        listener.kill()
        listener.wait()


def ended(pid: int) -> bool:
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not Path(f"/proc/{pid}/cmdline").exists() or not Path(f"/proc/{pid}/cmdline").read_bytes()


def test_the_script_thaws_at_the_hosts_word_and_at_the_end_of_its_input(guest: dict[str, Path]) -> None:
    for word in (b"thaw\n", b""):
        guest["log"].unlink(missing_ok=True)
        child = script(guest)
        assert child.stdout is not None and child.stdout.readline() == freeze.FROZEN
        assert guest["log"].read_text().split("\n")[0] == "-f /work"
        assert (guest["root"] / "held" / str(child.pid)).read_text() == f"{child.pid}\n"
        out, _ = child.communicate(word, timeout=20)
        assert child.returncode == 0 and b"thawed" in out
        # thawed once: its exit does not thaw again (a later freeze is another script's)
        assert guest["log"].read_text().split("\n")[1:] == ["-u /work", ""]
        assert not (guest["root"] / "held" / str(child.pid)).exists()


def test_the_script_in_a_fork_thaws_and_ends_its_sources_ssh_sessions(guest: dict[str, Path]) -> None:
    with sshd_with_a_session(guest) as session:
        child = script(guest)
        assert child.stdout is not None and child.stdout.readline() == freeze.FROZEN
        guest["hostname"].write_text("vmsandbox-fork\n")  # the fork's identity sets its hostname first
        child.wait(timeout=20)  # no word from the host: its input stays open
        assert child.stdout is not None and child.stdin is not None
        out = child.stdout.read()
        child.stdin.close()
    assert child.returncode == 0 and b"thawed" in out
    assert "-u /work" in guest["log"].read_text()
    assert ended(session)


def test_a_script_restored_by_a_rollback_is_told_so_thaws_and_ends_its_sessions(guest: dict[str, Path]) -> None:
    """A rollback to a checkpoint taken live: the same hostname, the host's connection gone without an end of input
    (its input stays open here); RESTORED tells the script, waits for it, and thaws the workspace besides."""
    with sshd_with_a_session(guest) as session:
        child = script(guest)
        assert child.stdout is not None and child.stdout.readline() == freeze.FROZEN
        other = subprocess.Popen(["sleep", "60"])  # a pid file naming no script: left alone, the file dropped
        (guest["root"] / "held" / str(other.pid)).write_text(f"{other.pid}\n")
        try:
            done = restored(guest)
            assert done.returncode == 0, done.stderr
            assert child.wait(timeout=5) == 0  # ended before RESTORED returned
            assert other.poll() is None
        finally:
            other.kill()
            other.wait()
        assert child.stdin is not None
        child.stdin.close()
    assert ended(session)
    assert guest["log"].read_text().split("\n")[1:] == ["-u /work", "-u /work", ""]  # the script's, RESTORED's
    assert list((guest["root"] / "held").iterdir()) == []


def test_restored_kills_a_script_that_does_not_end_when_told(guest: dict[str, Path]) -> None:
    """A script that ignores SIGUSR1 (a bash of the guest's own under that pid file): killed after its time, said
    by RESTORED's exit, and the workspace thawed all the same."""
    held = guest["root"] / "held"
    held.mkdir()
    deaf = subprocess.Popen(
        ["bash", "-c", "trap '' USR1; echo ready; while :; do sleep 0.05; done"], stdout=subprocess.PIPE
    )
    assert deaf.stdout is not None and deaf.stdout.readline() == b"ready\n"  # (told only once it ignores it)
    (held / str(deaf.pid)).write_text(f"{deaf.pid}\n")
    env = {**os.environ, "PATH": f"{guest['tools']}:{os.environ['PATH']}", "MOUNT": "/work"}
    argv = ["bash", "-c", freeze.RESTORED, "restored", str(held), "/work/p", "0.05", "10"]
    try:
        assert subprocess.run(argv, env=env, timeout=30, check=False).returncode == freeze.FORCED
        assert deaf.wait(timeout=5) == -signal.SIGKILL
    finally:
        deaf.kill()
        deaf.wait()
    assert guest["log"].read_text() == "-u /work\n" and list(held.iterdir()) == []


def test_the_script_thaws_by_its_bound_with_its_input_open(guest: dict[str, Path]) -> None:
    """No word, no end of input, no fork: the bound (1 s here, counted in uptime) thaws it."""
    env = {**os.environ, "PATH": f"{guest['tools']}:{os.environ['PATH']}", "MOUNT": "/work"}
    held = str(guest["root"] / "held")
    argv = ["bash", "-c", freeze.SCRIPT, "freeze", "/work/p", str(guest["hostname"]), "1", "0.05", "0", held]
    child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    assert child.stdout is not None and child.stdout.readline() == freeze.FROZEN
    assert child.wait(timeout=10) == 0  # its input still open: the bound ended it
    assert child.stdin is not None
    child.stdin.close()
    assert "-u /work" in guest["log"].read_text()


def test_the_script_will_not_freeze_the_root_file_system(guest: dict[str, Path]) -> None:
    child = script(guest, mount="/")
    out, _ = child.communicate(b"", timeout=20)
    assert child.returncode == freeze.CANNOT and out == b""
    assert not guest["log"].exists()


# -- the fork's system disk ---------------------------------------------------------------------------------------


def test_a_forks_disk_never_reads_a_host_file_a_rewritten_header_names(tmp_path: Path) -> None:
    secret = tmp_path / "host-secret"
    secret.write_bytes(b"HOST-SECRET-" * 100_000)
    base, middle, top, dest = (tmp_path / n for n in ("base.qcow2", "middle.qcow2", "top.qcow2", "fork.qcow2"))
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", base, "4M"], check=True)
    for upper, lower in ((middle, base), (top, middle)):
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", lower, "-F", "qcow2", upper], check=True)
    subprocess.run(["qemu-io", "-c", "write -P 0x4d 0 64k", middle], check=True, capture_output=True)
    # the session's QEMU rewrites its top overlay's header: its backing file is now a file of the host's, raw
    subprocess.run(["qemu-img", "rebase", "-u", "-b", secret, "-F", "raw", top], check=True)
    qemuimg.copy_above([top, middle], base, dest, 4 << 20)
    raw = tmp_path / "fork.raw"
    subprocess.run(["qemu-img", "convert", "-O", "raw", dest, raw], check=True)
    data = raw.read_bytes()
    assert b"HOST-SECRET" not in data
    assert data[:65536] == b"\x4d" * 65536  # what the session wrote below its top is in the fork's disk


def test_a_forks_disk_is_not_copied_from_an_overlay_with_an_external_data_file(tmp_path: Path) -> None:
    secret = tmp_path / "host-secret"
    secret.write_bytes(b"HOST-SECRET-" * 100_000)
    base, middle, top, dest = (tmp_path / n for n in ("base.qcow2", "middle.qcow2", "top.qcow2", "fork.qcow2"))
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", base, "4M"], check=True)
    # an overlay whose header keeps its data in a file of the host's (data_file_raw: that file's bytes as they are)
    made: list[str | Path] = ["qemu-img", "create", "-q", "-f", "qcow2", "-o", f"data_file={secret},data_file_raw=on"]
    subprocess.run([*made, middle, "4M"], check=True)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", middle, "-F", "qcow2", top], check=True)
    with pytest.raises(VmsandboxError, match="external data file"):
        qemuimg.copy_above([top, middle], base, dest, 4 << 20)


def test_a_fold_reads_the_chain_the_host_recorded_not_a_rewritten_header(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "host-secret"
    secret.write_bytes(b"HOST-SECRET-" * 100_000)
    base = tmp_path / "base.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", base, "4M"], check=True)
    lower = base
    for n, name in enumerate(("overlay.qcow2", "overlay-x.qcow2", "overlay-top.qcow2")):
        made: list[str | Path] = ["qemu-img", "create", "-q", "-f", "qcow2", "-b", lower, "-F", "qcow2"]
        subprocess.run([*made, tmp_path / name], check=True)
        pattern = f"write -P {0x41 + n:#x} {n * 65536} 64k"
        subprocess.run(["qemu-io", "-c", pattern, tmp_path / name], check=True, capture_output=True)
        lower = tmp_path / name
    # the session's QEMU names a file of the host's as the backing file of the folded overlay and of the one below
    for name in ("overlay-x.qcow2", "overlay.qcow2"):
        subprocess.run(["qemu-img", "rebase", "-u", "-b", secret, "-F", "raw", tmp_path / name], check=True)
    chains = [["overlay.qcow2", "overlay-x.qcow2", "overlay-top.qcow2"]]
    p = chain.plan(chains, {"overlay.qcow2", "overlay-top.qcow2"}, chain.present(tmp_path), live=False)
    assert p.folds == [("overlay-x.qcow2", "overlay-top.qcow2")]
    opened = tmp_path / "opened"
    real = proc.run

    def traced(argv: Sequence[str | Path], **kw: Any) -> proc.Result:  # root's qemu-img never opens the file
        return real(["strace", "-f", "-e", "trace=open,openat", "-o", opened, *argv], **kw)

    monkeypatch.setattr(proc, "run", traced)
    chain.apply(tmp_path, chains, p, (base, 4 << 20))
    monkeypatch.setattr(proc, "run", real)
    assert "host-secret" not in opened.read_text()
    assert qemuimg.info(tmp_path / "overlay-top.qcow2").backing_file == str(tmp_path / "overlay.qcow2")
    assert chains == [["overlay.qcow2", "overlay-top.qcow2"]]
    raw = tmp_path / "top.raw"  # read as libvirt is told the chain (owned.chain_of): the record's, not the headers
    pinned = qemuimg.pinned([tmp_path / "overlay-top.qcow2", tmp_path / "overlay.qcow2"], base)
    subprocess.run(["qemu-img", "convert", "--image-opts", pinned, "-O", "raw", raw], check=True)
    data = raw.read_bytes()
    assert b"HOST-SECRET" not in data
    assert data[: 3 * 65536] == b"\x41" * 65536 + b"\x42" * 65536 + b"\x43" * 65536
