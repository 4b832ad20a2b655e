"""Root never waits on what another account hands it (docs/security.md): a process of QEMU's account with a FUSE
file whose close by root is never answered (tests/integration/fuse_standin.py) at the number root looks at — a
holder's (as one traced by a QEMU of its account would have), or a QEMU's own, raced against root's look. The
memory guard's round, gc, `doctor` and `host ls` go on within their deadline and say what they skipped; root's own
process never holds the file; what a look helper took in a lost race its keeper holds, one keeper for every
offender, and a genuine holder is looked at still however many raced; what root cannot see it reserves at its
worst. No VM: the holder and the QEMU are stand-ins, named where root reads them (its holders' records, libvirt's
pid files), each in a directory of the test's own."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from tests.integration.conftest import URI, unique_name, wait_for
from tests.integration.foreign_files import (
    NUMBER,
    ended,
    never_closing,
    own_children,
    qemu_account,
    qemu_account_process,
    racing,
    state_of,
)
from vmsandbox.session.host import doctor, hosts, memoryguard
from vmsandbox.session.place import choose
from vmsandbox.session.place.local import sharing
from vmsandbox.vm.memory import foreign, sealed, usage

pytestmark = [pytest.mark.no_vm, pytest.mark.root("plays QEMU's account, mounts a FUSE stand-in, reads root's holders")]
T = TypeVar("T")
DEADLINE = 4 * foreign.LOOK_DEADLINE  # one round of looks, at most (each look has its own deadline)
RACE_LOOKS = 5000  # a racer (racing) wins in 10 looks (median) here, at most 222 in 100 races beside busy loops


def looker() -> int:
    """The pid of root's look helper, started if it is not running."""
    usage.memory_files(os.getpid())  # (a look at this process: it holds no memory file of ours)
    child = foreign._HELPER.child
    assert child is not None and child.poll() is None, f"root's look helper is not running: {foreign.notes()}"
    return child.pid


def within(call: Callable[[], T], deadline: float = DEADLINE) -> T:
    """What call() returns, by `deadline` seconds (a root that hung would never return: the test fails instead)."""
    got: list[T] = []
    thread = threading.Thread(target=lambda: got.append(call()), daemon=True)
    thread.start()
    thread.join(deadline)
    assert got, f"{getattr(call, '__name__', call)} did not return within {deadline:.0f} s: root hangs"
    return got[0]


@pytest.fixture
def own_looks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Root's holders' records and libvirt's pid files read from the test's own directories; this process's looks
    start afresh (nothing shunned, nothing said, no helper)."""
    runtime, pid_files = tmp_path / "runtime", tmp_path / "pids"
    runtime.mkdir(mode=0o700)
    pid_files.mkdir()
    monkeypatch.setenv("VMSANDBOX_RUNTIME_DIR", str(runtime))
    monkeypatch.setattr(usage, "LIBVIRT_PIDS", pid_files)
    monkeypatch.setattr(foreign, "_SHUNNED", set())
    monkeypatch.setattr(foreign, "_NOTES", {})
    helper = foreign._Helper()
    monkeypatch.setattr(foreign, "_HELPER", helper)
    monkeypatch.setattr(foreign, "_asked", helper.ask)
    yield tmp_path
    helper._leave(kill=False)  # its stdin closed: it ends, and its keeper after it (the FUSE file system is gone)
    wait_for(lambda: foreign.left() == 0, 30, "the look helper and its keepers to end")


@contextlib.contextmanager
def genuine_holder(runtime: Path, name: str) -> Iterator[tuple[sealed.Held, int]]:
    """A holder of root's, as a warm start starts one (QEMU's account, a sealed memory file of 8 MiB, all holes),
    and its record where root's looks read it; the MiB of holes its file holds."""
    fd = sealed.create("vmsandbox-genuine", 8 << 20)
    try:
        sealed.seal(fd)
        held, child = sealed.hold(fd, qemu_account(), detached=False)
    finally:
        os.close(fd)
    entry = runtime / "memory" / f"{name}.json"
    entry.parent.mkdir(mode=0o700, exist_ok=True)
    entry.write_text(json.dumps({**held.as_dict(), "template": f"/{name}"}))
    try:
        yield held, 8
    finally:
        entry.unlink()
        assert sealed.end(child, 5.0)


def test_a_holder_with_a_fuse_file_at_its_number_is_passed_over_said_and_stopped(
    own_looks: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The file is never taken (the kernel says it is no memfd before root's look takes anything): the guard reserves
    its recorded size (all holes, at worst), gives nothing back, `doctor` and `host ls` say it, gc stops the holder
    and drops its record."""
    entry = own_looks / "runtime" / "memory" / "t.json"
    entry.parent.mkdir(mode=0o700)
    with never_closing(own_looks) as fuse, qemu_account_process("hold", fuse) as holder:
        entry.write_text(json.dumps(holder.record("/t")))
        said = f"skipped holder pid {holder.pid}: its descriptor {NUMBER} is not a memfd"
        assert within(usage.held_keys) == set()
        assert within(usage.reserved_mib) == holder.size >> 20  # never nothing: its recorded size, all holes
        # short of memory: gives back nothing, stops none
        assert within(lambda: memoryguard.relieve(floor_mib=1 << 40)) == []
        capfd.readouterr()
        within(lambda: hosts.probe(choose.spec_for(None, URI)))
        assert said in capfd.readouterr().err  # `host ls` says it
        check = within(lambda: doctor._memory(URI))
        assert said in check.detail and check.level == "warn" and check.fix == doctor.SKIPPED_FIX
        verbs: list[tuple[str, str]] = []

        def tidy(verb: str, what: str, do: Callable[[], object]) -> str:
            verbs.append((verb, what))
            do()
            return what

        within(lambda: list(sharing.sweep(None, tidy)))  # type: ignore[arg-type]  # (its first branch asks no libvirt)
        assert verbs == [("stop", f"the memory holder of /t ({said})")]
        ended(holder.pid)
        assert not entry.exists()
        assert fuse.held_flushes() == []  # root took nothing: no close of root's ever reached the file
    assert foreign.left() == 0


def test_a_qemu_that_races_its_descriptor_hangs_one_keeper_never_root_nor_its_looks(
    own_looks: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The QEMU swaps its descriptor between the kernel's word and root's take: the look helper that took the FUSE
    file hands it to a keeper (root's child, sharing the helper's descriptors) and goes on answering; root's own
    process goes on, says it, never asks about that QEMU again, and reserves at the worst what that QEMU may map
    (a genuine holder's file, all holes). Once the helper ends, the keeper's exit is the close the file system
    never answers: it hangs there, alone, until the file system goes; then it ends and is reaped."""
    domain = f"vmsandbox-{unique_name()}"
    with (
        never_closing(own_looks) as fuse,
        qemu_account_process("race", fuse, f"guest={domain},") as qemu,
        genuine_holder(own_looks / "runtime", "t") as (held, holes),
    ):
        (usage.LIBVIRT_PIDS / f"{domain}.pid").write_text(f"{qemu.pid}\n")
        # the QEMU seen, mapping no held file: nothing owed; or unseen, and owed at worst: the race won at this very
        # look, or (CI, a loaded host) the first look's new helper past its deadline, killed and reaped already
        first = within(usage.reserved_mib)
        assert first in (0, holes), first

        def race() -> int:
            with racing(qemu.pid, looker()):
                for n in range(1, RACE_LOOKS + 1):
                    usage.memory_files(qemu.pid)
                    if foreign.left():
                        return n
            return 0

        assert within(race, 120), f"the stand-in never won the race in {RACE_LOOKS} looks: nothing was tested"
        helper = foreign._HELPER
        (keeper,) = helper.kept
        assert keeper in own_children()  # (it names itself once it runs: on a loaded host, after it is said)
        wait_for(lambda: Path(f"/proc/{keeper}/comm").read_text().strip() == "vmsandbox-keep", 30, "the keeper's name")
        assert helper.child is not None and helper.child.poll() is None  # the helper goes on
        assert fuse.held_flushes() == []  # nothing closed yet: the copy is in the keeper's table
        said = f"skipped QEMU pid {qemu.pid}: its descriptor {NUMBER} was no memfd once taken"
        assert any(n.startswith(said) for n in foreign.notes())
        # the guard's round goes on (the QEMU passed over, said once), as do `doctor` and `host ls`
        monkeypatch.setattr(memoryguard, "IDLE_EXIT", 0.0)  # one round, then it ends: no session of its directory runs
        capfd.readouterr()
        within(lambda: memoryguard.watch(floor_mib=1 << 40))
        assert within(lambda: memoryguard.relieve(floor_mib=1 << 40)) == []
        assert within(usage.reserved_mib) == holes  # root cannot see what the QEMU maps: the genuine file, at worst
        assert isinstance(within(held.look), foreign.Memfd)  # a process that did not offend is looked at still
        assert within(lambda: doctor._memory(URI)).level == "warn"
        err = capfd.readouterr().err
        assert said in err and f"skipped QEMU pid {qemu.pid}: it handed root's look something else" in err
        assert usage.memory_files(qemu.pid) == [] and usage.seen_files(qemu.pid) is None
        assert foreign.left() == 1 and fuse.held_flushes() == []

        helper._leave(kill=False)  # the helper ends (as it does when its process does): its keeper closes the copy
        wait_for(fuse.held_flushes, 30, "the keeper to close the FUSE file as it ends")
        assert fuse.held_flushes() == [keeper] and state_of(keeper) in ("S", "D") and keeper in own_children()
        assert foreign.left() == 1  # the keeper, hanging; the helper has ended and is reaped
    wait_for(lambda: foreign.left() == 0, 30, "the keeper to end and be reaped once the file system is gone")
    assert state_of(keeper) is None


def test_qemus_racing_past_the_old_bound_cost_one_keeper_and_a_genuine_holder_is_looked_at_still(
    own_looks: Path,
) -> None:
    """Ten processes of QEMU's account each win a race against root's looks (the audit spent root's whole bound with
    eight): each is an offender once and never asked again, all their copies go to one keeper, and root's look at a
    genuine holder — what a warm start, gc and the guard ask — still answers. The racers run one at a time, the
    others stopped: ten spinning at once on a host of two CPUs would rarely run beside the look they race."""
    with contextlib.ExitStack() as stack:
        fuse = stack.enter_context(never_closing(own_looks))
        held, holes = stack.enter_context(genuine_holder(own_looks / "runtime", "t"))
        racers = []
        for _ in range(10):
            domain = f"vmsandbox-{unique_name()}"
            racer = stack.enter_context(qemu_account_process("race", fuse, f"guest={domain},"))
            stack.callback(os.kill, racer.pid, signal.SIGCONT)  # (before it is told to end: a stopped one cannot)
            os.kill(racer.pid, signal.SIGSTOP)
            (usage.LIBVIRT_PIDS / f"{domain}.pid").write_text(f"{racer.pid}\n")
            racers.append(racer.pid)

        def won(pid: int) -> bool:
            said = f"skipped QEMU pid {pid}: its descriptor {NUMBER} was no memfd once taken"
            return any(n.startswith(said) for n in foreign.notes())

        def race() -> list[int]:
            lost = []
            for pid in racers:
                os.kill(pid, signal.SIGCONT)
                with racing(pid, looker()):
                    for _ in range(RACE_LOOKS):
                        usage.memory_files(pid)
                        if won(pid):
                            break
                    else:
                        lost.append(pid)
                os.kill(pid, signal.SIGSTOP)
            return lost

        assert within(race, 300) == [], f"stand-ins never won their race in {RACE_LOOKS} looks: fewer offenders tested"
        assert len(foreign._HELPER.kept) == 1 and foreign.left() == 1
        assert isinstance(within(held.look), foreign.Memfd)
        assert within(usage.reserved_mib) == holes  # QEMUs root cannot see may map it: owed
        assert fuse.held_flushes() == []
