"""Throwaway experiments on real VMs: checkpoints and rollback (processes included, unsynced work kept), the
overlay chain folded when checkpoints go, forks that diverge with identities of their own, and a fan-out
whose sessions are compared, one pulled, the rest destroyed as a group."""

from __future__ import annotations

import json
import os
import re
import shlex
import time
from pathlib import Path

import pytest

from tests.integration.conftest import URI, Cli, VmFactory, unique_name
from vmsandbox.image import store
from vmsandbox.session.moments import checkpoint
from vmsandbox.session.place import chain, checkpoints
from vmsandbox.session.record import Record
from vmsandbox.vm import livesave, qemuimg
from vmsandbox.vm.virt import Hypervisor

MARKER = "sleep 7777"  # a process that must survive (or come back with) the VM's memory
HOSTILE = "\\033]0;pwned\\007"  # printf's escapes: a terminal title change, as a guest would send it


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("experiments") / "exp project"
    p.mkdir()
    (p / "README").write_text("experiments\n")
    return p


@pytest.fixture(scope="module")
def source(module_vms: VmFactory, project: Path) -> str:
    record = module_vms.make(project)
    assert record.start == "warm"  # restored from the template, not booted
    return record.name


def sh(cli: Cli, name: str, script: str) -> str:
    r = cli.run("exec", name, "--", "sh", "-c", script)
    assert r.returncode == 0, f"{script}: {r.stderr.decode()}"
    return r.stdout.decode()


def ok(cli: Cli, *args: str) -> str:
    r = cli.run(*args)
    assert r.returncode == 0, f"{args}: {r.stderr.decode()}"
    return r.stdout.decode() + r.stderr.decode()


def data(cli: Cli, *args: str) -> list[dict[str, object]]:
    r = cli.run(*args)
    assert r.returncode == 0, f"{args}: {r.stderr.decode()}"
    return [json.loads(line) for line in r.stdout.splitlines()]  # --json: an object a line


def marker_running(cli: Cli, name: str) -> bool:
    return MARKER in sh(cli, name, "ps -eo args")


def test_rollback_brings_back_files_and_processes_and_keeps_unsynced_work(cli: Cli, source: str) -> None:
    sh(cli, source, f"echo kept > kept.txt; sync; nohup {MARKER} >/dev/null 2>&1 &")
    ok(cli, "checkpoint", "create", source, "c1")
    listed = data(cli, "checkpoint", "ls", source, "--json")
    assert [c["label"] for c in listed] == ["c1"] and int(str(listed[0]["bytes"])) > 0
    assert marker_running(cli, source), "the checkpoint's save and restore lost the running process"

    sh(cli, source, f"rm kept.txt; pkill -f '^{MARKER}$'; echo lost > later.txt")
    assert not marker_running(cli, source)
    out = ok(cli, "checkpoint", "restore", source, "c1")

    assert sh(cli, source, "cat kept.txt; ls") == "kept\nREADME\nkept.txt\n"
    assert marker_running(cli, source), "the rollback did not bring the process back"
    # what the rollback would have lost (later.txt, never pulled) was exported first
    boxes = list((Record.load(source).files.rolled_back).iterdir())
    assert len(boxes) == 1 and str(boxes[0]) in out
    assert (boxes[0] / "files" / "later.txt").read_text() == "lost\n"
    assert "+lost" in (boxes[0] / "changes.patch").read_text()
    # and a pull after the rollback reads the guest's tree as it is now (the journal went back in time)
    diff = ok(cli, "diff", source, "--stat")
    assert "kept.txt" in diff and "later.txt" not in diff


def test_removed_checkpoints_fold_into_a_short_chain_that_still_rolls_back(cli: Cli, source: str) -> None:
    for label, text in (("c2", "two"), ("c3", "three")):
        sh(cli, source, f"echo {text} > {label}.txt; sync")
        ok(cli, "checkpoint", "create", source, label)
    ok(cli, "checkpoint", "rm", source, "c2")
    ok(cli, "checkpoint", "rm", source, "c3")
    sh(cli, source, "echo four > c4.txt; sync")
    # taken the paused way (live, the running VM's chain is not folded): the VM is down here, and what c2 and c3
    # froze is folded away
    paused = cli.run("checkpoint", "create", source, "c4", env=cli.env(**{checkpoint.LIVE_SWITCH: "0"}))
    assert paused.returncode == 0, paused.stderr.decode()

    record = Record.load(source)
    kept = {c.label: c for c in checkpoints.listed(record.files)}
    assert sorted(kept) == ["c1", "c4"]
    assert record.overlays == [*kept["c4"].chain, record.overlays[-1]]
    assert len(record.overlays) == 3, record.overlays  # c1's overlay, c4's, the top
    assert chain.present(record.files.root) == set(record.overlays)
    if os.access(record.system_disk, os.R_OK):  # (a plain user cannot open what libvirt gave to QEMU's account)
        images = qemuimg.chain(record.system_disk)
        assert [i.path.name for i in images[:3]] == list(reversed(record.overlays))

    sh(cli, source, "rm c2.txt c3.txt c4.txt")
    ok(cli, "checkpoint", "restore", source, "c4")
    assert sh(cli, source, "cat c2.txt c3.txt c4.txt") == "two\nthree\nfour\n"
    ok(cli, "checkpoint", "restore", source, "c1")  # taken a minute or more ago: the guest's clock must not say so
    host_now = time.time()
    assert sh(cli, source, "ls") == "README\nkept.txt\n"
    assert abs(int(sh(cli, source, "date +%s")) - host_now) < 10, "the clock was not stepped after the rollback"


def test_a_fork_copies_state_then_diverges_with_an_identity_of_its_own(cli: Cli, source: str) -> None:
    sh(cli, source, "echo before > shared.txt; sync")
    fork = unique_name()
    try:
        ok(cli, "create", "--from", source, "--name", fork)
        record, theirs = Record.load(fork), Record.load(source)
        assert record.forked_from == source and record.group is None
        assert sh(cli, fork, "cat shared.txt") == "before\n"
        assert marker_running(cli, fork), "the fork did not keep the source's running processes"
        # its own identity
        assert sh(cli, fork, "hostname").strip() == f"vmsandbox-{fork}"
        key = sh(cli, fork, "sudo ssh-keygen -y -f /etc/ssh/ssh_host_ed25519_key").split()[:2]
        assert key == record.files.host_key.with_suffix(".pub").read_text().split()[:2]
        assert key != theirs.files.host_key.with_suffix(".pub").read_text().split()[:2]
        assert record.files.client_key.read_bytes() != theirs.files.client_key.read_bytes()
        # diverging: a file written in one is absent in the other
        sh(cli, fork, "echo fork > only-fork.txt")
        sh(cli, source, "echo source > only-source.txt")
        assert sh(cli, source, "ls only-fork.txt 2>&1 || true").startswith("ls: cannot access")
        assert sh(cli, fork, "ls only-source.txt 2>&1 || true").startswith("ls: cannot access")
        # its own egress: its daemon, its log
        sh(cli, fork, "curl -s -o /dev/null https://fork-only.invalid/ || true")
        assert "fork-only.invalid" in record.files.proxy_log.read_text()
        assert not theirs.files.proxy_log.exists() or "fork-only.invalid" not in theirs.files.proxy_log.read_text()
        # the same baseline: its review sees its own change only
        assert "only-fork.txt" in ok(cli, "diff", fork, "--stat")
        assert "only-fork.txt" not in ok(cli, "diff", source, "--stat")
    finally:
        cli.run("rm", fork, "--discard")
    from_checkpoint = unique_name()
    try:
        ok(cli, "create", "--from", f"{source}:c1", "--name", from_checkpoint)
        assert sh(cli, from_checkpoint, "ls") == "README\nkept.txt\n"
        assert Record.load(from_checkpoint).forked_from == f"{source}@c1"
    finally:
        cli.run("rm", from_checkpoint, "--discard")


def test_a_session_forked_by_its_port_then_by_a_login_gives_each_fork_its_state(
    cli: Cli, vm_factory: VmFactory, project: Path
) -> None:
    # the second fork's checkpoint folds the overlay the first one froze (no checkpoint needs it any more): the
    # fork is copied from the chain as folded, not as it was before its checkpoint was taken
    source = vm_factory.make(project)
    assert source.identity_port  # a warm start's guest keeps its `identity` on the port for forks
    first, second = unique_name(), unique_name()
    sh(cli, source.name, "echo one > one.txt; sync")
    said = ok(cli, "create", "--from", source.name, "--name", first)
    with Hypervisor(URI) as hv:  # passes while the guest runs only where QEMU sees its writes (vm.livesave)
        sound = livesave.passes_are_sound(source.accel, hv.qemu_version(), "/usr/bin/qemu-system-x86_64")
    flat = " ".join(said.split())  # (the terminal's width may wrap a line)
    assert "its guest paused" in flat and ("paused for it: QEMU" in flat) is not sound, said
    try:
        # handed its identity on its port, by its source's `identity` restored with the memory: no login
        assert "with a login instead" not in said and Record.load(first).identity_port
        assert "fork's identity taken" in Record.load(first).files.console_log.read_text(errors="replace")
        # the source's root ends what listens there: the next fork is handed its identity with a login
        sh(cli, source.name, "echo two > two.txt; sync; sudo pkill -x identity")
        said = ok(cli, "create", "--from", source.name, "--name", second)
        assert "with a login instead" in said and not Record.load(second).identity_port
        for fork in (first, second):
            assert sh(cli, fork, "hostname").strip() == f"vmsandbox-{fork}"
        assert sh(cli, first, "ls") == "README\none.txt\n"
        assert sh(cli, second, "ls") == "README\none.txt\ntwo.txt\n"
        record = Record.load(source.name)
        assert chain.present(record.files.root) == set(record.overlays)
        assert sh(cli, source.name, "cat one.txt two.txt") == "one\ntwo\n"
    finally:
        for fork in (first, second):
            cli.run("rm", fork, "--discard")


def test_a_fanout_without_a_name_is_removed_by_the_group_it_prints(
    cli: Cli, project: Path, base_image: store.Image
) -> None:
    """Without --name the group is drawn from the project: the group printed is the one made, and the closing hint
    works as printed (`run --fanout 4 DIR -- true` printed X-c849 and made X-dc1a-1…4; `rm --group X-c849` then
    answered "no fan-out named")."""
    r = cli.run("run", "--fanout", "2", str(project), "--", "true")
    said = " ".join((r.stdout + r.stderr).decode().split())
    try:
        assert r.returncode == 0, said
        printed = re.search(r"Fan-out (\S+): 2 session\(s\), (\S+) … (\S+)", said)
        assert printed is not None, said
        group, names = printed[1], [printed[2], printed[3]]
        assert group.startswith("exp-project-") and names == [f"{group}-1", f"{group}-2"]
        assert {row["name"]: row["group"] for row in cli.ls() if row["name"] in names} == dict.fromkeys(names, group)
        hint = re.search(r"`(vmsandbox rm --group [^`]+)`", said)
        assert hint is not None and hint[1] == f"vmsandbox rm --group {group}", said
        removed = cli.run(*shlex.split(hint[1])[1:])  # as printed
        assert removed.returncode == 0, removed.stderr.decode()
        assert not any(row["name"] in names for row in cli.ls())
    finally:
        for row in cli.ls():  # (what a failure left of it)
            if str(row["group"] or "").startswith("exp-project-") and row["project"] == str(project):
                cli.run("rm", "--discard", str(row["name"]))


def test_fanout_compare_pull_one_destroy_the_group(cli: Cli, project: Path, base_image: store.Image) -> None:
    group = unique_name()
    names = [f"{group}-{i}" for i in (1, 2, 3)]
    try:
        # each guest also writes terminal escapes to its output and into a file's name: the worst it has for
        # the fan-out's summary and for `compare`
        r = cli.run(
            "run", "--fanout", "3", str(project), "--name", group, "--check", "test -s n.txt",
            "--", "sh", "-c", f"echo $VMSANDBOX_INDEX > n.txt; printf '{HOSTILE}'; : > \"$(printf 'e{HOSTILE}')\"",
        )  # fmt: skip
        assert r.returncode == 0, r.stderr.decode()
        assert b"\x1b" not in r.stdout + r.stderr and b"\x07" not in r.stdout + r.stderr  # the guest's output stays in
        table = r.stdout.decode() + r.stderr.decode()
        for name in names:
            assert Record.load(name).group == group
            assert any(line.split()[:2] == [name, "0"] and line.split()[-1] == "pass" for line in table.splitlines())
            assert "\x1b]0;pwned\x07" in (Record.load(name).files.root / "fanout.log").read_text()  # kept as sent
        rows = data(cli, "diff", names[0], *(w for n in names[1:] for w in ("--against", n)), "--stat", "--json")
        n_txt = next(row for row in rows if row["path"] == "n.txt")
        assert n_txt["sessions"] == dict.fromkeys(names, "added") and n_txt["agree"] is False
        shown = cli.run("diff", names[0], *(w for n in names[1:] for w in ("--against", n)))
        assert shown.returncode == 0 and b"\x1b" not in shown.stdout and b"\\x1b]0;pwned" in shown.stdout
        assert "-1\n+2\n" in ok(cli, "diff", names[1], "--against", names[0])

        ok(cli, "pull", names[1], "--yes")
        assert (project / "n.txt").read_text() == "2\n"
        refused = cli.run("rm", "--group", group)
        assert refused.returncode != 0 and b"were kept" in refused.stderr  # the others hold unsynced work
        ok(cli, "rm", "--group", group, "--discard")
        assert not any(row["name"] in names for row in cli.ls())
    finally:
        for made in project.iterdir():
            if made.name != "README":
                made.unlink()
        cli.run("rm", "--group", group, "--discard")
