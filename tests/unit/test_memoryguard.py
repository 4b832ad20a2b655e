"""The memory guard's choices, from fakes of the machine's memory and its sessions (nothing stopped for real)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from vmsandbox import paths, pids
from vmsandbox.errors import VmsandboxError
from vmsandbox.session.host import memoryguard
from vmsandbox.session.host.memoryguard import Held
from vmsandbox.vm.memory import usage


def test_it_stops_kept_sessions_with_most_memory_of_their_own_first() -> None:
    held = [Held("idle", 120, True), Held("big", 900, True), Held("mid", 400, True), Held("run", 2000, False)]
    assert [h.name for h in memoryguard.order(held)] == ["big", "mid", "idle"]  # never an attached one, however big
    tied = [Held("b", 10, True), Held("a", 10, True)]
    assert [h.name for h in memoryguard.order(tied)] == ["a", "b"]  # ties: by name


class Machine:
    """MemAvailable, and what each stop frees of it."""

    def __init__(self, available: int, held: list[Held], *, busy: frozenset[str] = frozenset()) -> None:
        self.available, self.held, self.busy = available, held, busy
        self.stopped: list[tuple[str, str]] = []
        self.tried: list[str] = []
        self.kernel = 8192
        self.unmapped = 0  # MiB held by template copies no session maps
        self.given_back = 0

    def give_back(self) -> bool:
        self.given_back += 1
        freed, self.unmapped = self.unmapped, 0
        self.available += freed
        return freed > 0

    def stop(self, name: str, why: str) -> None:
        self.tried.append(name)
        if name in self.busy:
            raise VmsandboxError(f"session {name} is busy: vmsandbox (pid 1) is pulling it")
        if name == "broken":
            raise OSError(28, "No space left on device")
        self.stopped.append((name, why))
        gone = next(h for h in self.held if h.name == name)
        self.held.remove(gone)
        self.available += gone.own_mib


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> Machine:
    m = Machine(300, [Held("idle", 150, True), Held("big", 700, True), Held("mid", 400, True)])
    monkeypatch.setattr(memoryguard, "available_mib", lambda: m.available)
    monkeypatch.setattr(memoryguard, "running", lambda: m.held)
    monkeypatch.setattr(memoryguard, "_stop", m.stop)
    monkeypatch.setattr(memoryguard, "kernel_available_mib", lambda: m.kernel)
    monkeypatch.setattr(memoryguard, "_give_back", m.give_back)
    return m


def test_nothing_is_stopped_while_the_floor_holds(machine: Machine) -> None:
    assert memoryguard.relieve(300) == []
    assert machine.stopped == []


def test_it_stops_until_the_floor_holds_again(machine: Machine) -> None:
    assert memoryguard.relieve(512) == ["big"]
    assert memoryguard.relieve(1500) == ["mid", "idle"]  # 1000 after `big`: `mid` leaves it 100 short
    _, why = machine.stopped[0]
    assert why.startswith("stopped by the memory guard at ") and "300 MiB" in why and "floor of 512 MiB" in why


def test_a_busy_session_is_passed_over_for_the_next(machine: Machine) -> None:
    machine.busy = frozenset({"big"})
    assert memoryguard.relieve(1000) == ["mid", "idle"]  # short 700: `big` would have covered it alone


def test_one_that_could_not_be_stopped_rests_while_the_others_are(
    machine: Machine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A guest that holds its flush (or a save that fails with any error) does not get tried first every round:
    it rests REST seconds, and the rounds meanwhile go to the others."""
    machine.held.append(Held("broken", 900, True))
    machine.busy = frozenset({"big"})
    resting: dict[str, float] = {}
    assert memoryguard.relieve(600, resting=resting) == ["mid"]  # `broken` and `big` tried first, in vain
    assert machine.tried == ["broken", "big", "mid"] and set(resting) == {"broken", "big"}
    machine.available = 300
    assert memoryguard.relieve(600, resting=resting) == ["idle"]  # neither is tried again while it rests
    assert machine.tried[3:] == ["idle"]
    later = time.monotonic() + memoryguard.REST + 1
    monkeypatch.setattr(time, "monotonic", lambda: later)
    machine.available = 300
    assert memoryguard.relieve(600, resting=resting) == [] and machine.tried[4:] == ["broken", "big"]


def test_a_stop_that_would_read_in_more_holes_than_the_kernel_has_is_not_made(machine: Machine) -> None:
    """Its save would fill the shared file's holes first: with the kernel short of them, that is the OOM."""
    machine.held = [Held("holey", 900, True, holes_mib=1800), Held("whole", 300, True)]
    machine.kernel = 1500
    assert memoryguard.relieve(400) == ["whole"] and machine.tried == ["whole"]
    machine.kernel = 4096
    machine.available = 100
    assert memoryguard.relieve(400) == ["holey"]


def test_only_the_sessions_asked_for(machine: Machine) -> None:
    assert memoryguard.relieve(1000, among=["idle", "mid"]) == ["mid", "idle"]


def test_memory_the_kernel_does_not_tell_stops_nothing(machine: Machine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memoryguard, "available_mib", lambda: None)
    assert memoryguard.relieve(10**6) == []


@pytest.mark.parametrize(("kernel", "rounds"), [(550, 3), (613, 0)])
def test_the_guard_relieves_while_short_and_ends_once_no_session_runs(
    monkeypatch: pytest.MonkeyPatch, kernel: int, rounds: int
) -> None:
    """Short is the kernel's figure less what is reserved (550 - 100 < 512; 613 - 100 is not)."""
    looks = []

    def records() -> Iterator[object]:
        looks.append(1)
        return iter([object()] if len(looks) <= 3 else [])  # a session runs for three rounds, then none

    relieved: list[int] = []
    monkeypatch.setattr(memoryguard, "_records", records)
    monkeypatch.setattr(memoryguard, "IDLE_LOOK", 0.0)
    monkeypatch.setattr(memoryguard, "IDLE_EXIT", 0.0)
    monkeypatch.setattr(usage, "reserved_mib", lambda: 100)
    monkeypatch.setattr(memoryguard, "kernel_available_mib", lambda: kernel)

    def relieve(floor: int, *, resting: dict[str, float] | None = None) -> list[str]:
        assert resting is not None  # the guard's, kept from round to round
        relieved.append(floor)
        return []

    monkeypatch.setattr(memoryguard, "relieve", relieve)
    monkeypatch.setattr(time, "sleep", lambda _s: None)
    memoryguard.watch(512)
    assert relieved == [512] * rounds


class FakeRecord:
    def __init__(self, name: str, *, keep: bool, owner_alive: bool) -> None:
        self.name, self.keep, self._owner = name, keep, owner_alive
        self.domain = f"vmsandbox-{name}"

    def owner_alive(self) -> bool:
        return self._owner


def test_only_kept_sessions_no_command_is_attached_to_are_the_guards_to_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    """`run --keep`, a fan-out's workers and the API keep their sessions while their command is attached."""
    records = [
        FakeRecord("kept", keep=True, owner_alive=False),
        FakeRecord("attached", keep=True, owner_alive=True),
        FakeRecord("run", keep=False, owner_alive=True),
    ]
    monkeypatch.setattr(memoryguard, "_records", lambda: iter(records))
    monkeypatch.setattr(usage, "qemu_pid", lambda _d: 42)
    monkeypatch.setattr(usage, "of_process", lambda _pid: usage.Usage(300, 200, 100, 200, 150))
    # each maps the template's file (held by root's holder); a QEMU also holds a memfd it made up, a terabyte of
    # holes by which it would have its session passed over: only the held file's holes count
    made_up = usage.SharedFile(1, 3, 1 << 20, 1 << 20)
    monkeypatch.setattr(usage, "seen_files", lambda _pid: [made_up, usage.SharedFile(1, 2, 2048, 64)])
    monkeypatch.setattr(usage, "held_files", lambda: usage.HeldFiles({(1, 2): 64}))
    held = memoryguard.running()
    assert [(h.name, h.stoppable, h.holes_mib) for h in held] == [
        ("kept", True, 64),
        ("attached", False, 64),
        ("run", False, 64),
    ]
    assert [h.name for h in memoryguard.order(held)] == ["kept"]


def test_a_pid_file_names_a_guard_only_while_that_process_runs_the_guard(tmp_path: Path) -> None:
    """A pid reused by another program, a dead one, or a file that is not one, is no guard (a session starts one)."""
    f = tmp_path / "guard.pid"
    f.write_text(f"{os.getpid()} {pids.process_start(os.getpid())}\n")
    mine = Path(f"/proc/{os.getpid()}/cmdline").read_bytes().split(b"\0")[1].decode()  # what this process runs
    assert pids.runs(f, mine)
    assert not pids.runs(f, paths.GUARD_MODULE)  # alive, but not the guard
    f.write_text(f"{os.getpid()} 0\n")
    assert not pids.runs(f, mine)  # the pid, but another start time: reused
    f.write_text("not a pid file")
    assert not pids.runs(f, mine)
    assert not pids.runs(tmp_path / "none.pid", mine)


def test_host_ls_says_where_the_guard_watches(monkeypatch: pytest.MonkeyPatch) -> None:
    assert memoryguard.said(False).startswith("none there:")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert memoryguard.said(True).startswith("none for this account:")


def test_copies_no_session_maps_are_given_back_before_any_session_is_stopped(machine: Machine) -> None:
    """A template's copy no session maps is memory nobody uses (a grown one holds up to its guest's RAM): it goes
    first, once a shortage, and sessions are stopped only if that was not enough."""
    machine.unmapped = 400
    assert memoryguard.relieve(600) == [] and machine.given_back == 1 and machine.stopped == []
    machine.available, machine.unmapped = 300, 100
    assert memoryguard.relieve(600) == ["big"] and machine.given_back == 2  # 400 after the copies: `big` still goes
    assert memoryguard.relieve(600, among=["mid"]) == [] and machine.given_back == 2  # (a floor that holds: nothing)
    machine.available = 100
    assert memoryguard.relieve(600, among=["mid"]) == ["mid"] and machine.given_back == 2  # told which: only they


def test_what_root_cannot_see_is_reserved_at_its_worst_never_as_nothing() -> None:
    """A holder root cannot look at holds a file of its recorded size, all holes (reserved whole, mapped or not); a
    QEMU root cannot look at maps every held file (each reserved once, and its own save reads in the largest). A file
    no holder holds counts nothing, unless a holder root could not see may hold it: then at most that size."""
    seen = usage.HeldFiles({(1, 2): 60, (1, 5): 10})
    assert (seen.owed(set()), seen.owed({(1, 2)}), seen.owed(None)) == (0, 60, 70)
    blind = usage.HeldFiles({(1, 2): 60, (1, 5): 10}, unseen=(32,))
    assert (blind.owed(set()), blind.owed({(1, 2)}), blind.owed(None)) == (32, 92, 102)
    made_up = usage.SharedFile(1, 9, 1 << 20, 1 << 20)  # a terabyte of holes, held by no holder of root's
    assert seen.holes_of([made_up, usage.SharedFile(1, 5, 16, 10)]) == 10
    assert seen.holes_of([made_up]) == 0 and blind.holes_of([made_up]) == 32
    assert seen.holes_of(None) == 60 and blind.holes_of(None) == 60 and usage.HeldFiles({}, (32,)).holes_of(None) == 32


@pytest.mark.usefixtures("looks_in_this_process")
def test_a_holder_root_cannot_look_at_and_a_qemu_it_cannot_see_all_of_count_at_their_worst(tmp_path: Path) -> None:
    """Root's real looks (in this process): a holder whose number holds a pipe is reserved at its recorded size; a QEMU
    (this process, by libvirt's pid file) holding more memory files of ours than a look reads makes every held file
    count, and its session's save the largest."""
    import json

    from vmsandbox.vm.memory import look, sealed

    me, start = os.getpid(), pids.process_start(os.getpid()) or ""
    memfd = sealed.create("vmsandbox-guarded", 64 << 20)
    reading, writing = os.pipe()
    made: list[int] = []
    try:
        os.pwrite(memfd, b"x" * (4 << 20), 0)  # 4 MiB held, 60 MiB of holes
        sealed.seal(memfd)
        st = os.fstat(memfd)
        good, swapped = tmp_path / "good.json", tmp_path / "swapped.json"
        good.write_text(json.dumps(sealed.Held(me, start, memfd, st.st_ino, st.st_size).as_dict()))
        swapped.write_text(json.dumps(sealed.Held(me, start, reading, st.st_ino + 1, 32 << 20).as_dict()))
        pid_files, proc = tmp_path / "pids", tmp_path / "proc"
        pid_files.mkdir()
        (proc / str(me)).mkdir(parents=True)
        (proc / str(me) / "cmdline").write_bytes(b"qemu\0-name\0guest=vmsandbox-a,x\0")
        assert usage.held_files([good, swapped]) == usage.HeldFiles({(st.st_dev, st.st_ino): 60}, (32,))
        assert usage.reserved_mib([good, swapped], pid_files, proc) == 32  # no QEMU maps the seen one: its holes
        (pid_files / "vmsandbox-a.pid").write_text(str(me))
        assert usage.mapped_keys(pid_files, proc) == {(st.st_dev, st.st_ino)}
        assert usage.reserved_mib([good, swapped], pid_files, proc) == 92
        made = [sealed.create("vmsandbox-many", 0) for _ in range(look.MOST)]  # past what a look reads
        assert usage.mapped_keys(pid_files, proc) is None and usage.seen_files(me) is None
        assert usage.reserved_mib([good, swapped], pid_files, proc) == 92  # (here the QEMU maps it anyway)
    finally:
        for fd in (memfd, reading, writing, *made):
            os.close(fd)


def test_a_qemu_root_cannot_see_is_taken_to_map_the_largest_held_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its save may read in the largest held file's holes: a stop is not made where that would be more than the
    kernel has (as for a session known to map it); one root sees keeps its own figure."""
    records = [FakeRecord("blind", keep=True, owner_alive=False), FakeRecord("seen", keep=True, owner_alive=False)]
    monkeypatch.setattr(memoryguard, "_records", lambda: iter(records))
    monkeypatch.setattr(usage, "qemu_pid", lambda d: 41 if d == "vmsandbox-blind" else 42)
    monkeypatch.setattr(usage, "of_process", lambda _pid: usage.Usage(300, 200, 100, 200, 150))
    monkeypatch.setattr(usage, "seen_files", lambda pid: None if pid == 41 else [usage.SharedFile(1, 2, 2048, 64)])
    monkeypatch.setattr(usage, "held_files", lambda: usage.HeldFiles({(1, 2): 64, (1, 7): 7000}))
    assert [(h.name, h.holes_mib) for h in memoryguard.running()] == [("blind", 7000), ("seen", 64)]
