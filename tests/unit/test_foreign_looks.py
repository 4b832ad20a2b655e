"""Root's looks at what another account's process holds (vm.memory.look, the helper's own code, run here in this
process; vm.memory.foreign, root's side): only what the kernel calls a memfd is taken, and what turns out to be
something else once taken is held, never closed; a process that handed one over is not looked at again; what was
skipped is said once; the holder's words are compared, never parsed, and never waited for past a deadline; a warm
start whose shared memory fails for any reason loads a copy."""

from __future__ import annotations

import contextlib
import ctypes
import io
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.unit.conftest import saved_record
from vmsandbox import pids
from vmsandbox.session.place.local import sharing, start
from vmsandbox.vm.memory import foreign, look, sealed

pytestmark = pytest.mark.usefixtures("looks_in_this_process")


class Recording:
    """libc as the helper calls it, every pidfd_getfd recorded (`swap`: what a take gets instead, as if the process
    had put it at that number between the helper's look and its take)."""

    def __init__(self, swap: int | None = None) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.taken: list[int] = []
        self.swap = swap
        self.copies: list[int] = []  # what the takes got instead: a helper that holds one never closes it

    def syscall(self, number: int, pidfd: int, fd: int, flags: int) -> int:
        assert number == look.SYS_PIDFD_GETFD
        self.taken.append(fd)
        if self.swap is not None:
            self.copies.append(os.dup(self.swap))
            return self.copies[-1]
        return int(self.libc.syscall(number, pidfd, fd, flags))

    def close_copies(self) -> None:
        """Close what the takes got instead (the helper held each: a test's own pipes and files)."""
        for fd in self.copies:
            os.close(fd)
        self.copies.clear()


def asked(fds: list[int], libc: Recording, start: str | None = None) -> tuple[dict[str, Any], list[int]]:
    me = os.getpid()
    return look.answer({"pid": me, "start": start or pids.process_start(me), "fds": fds}, look.memfd_mount(), libc)


@contextlib.contextmanager
def every_kind(tmp_path: Path) -> Iterator[dict[str, int]]:
    """A descriptor of each kind a process of QEMU's account could put at a number root looks at."""
    fds: dict[str, int] = {}
    master, fds["terminal"] = os.openpty()
    fds["pipe"], writing = os.pipe()
    os.mkfifo(tmp_path / "fifo")
    fds["fifo"] = os.open(tmp_path / "fifo", os.O_RDONLY | os.O_NONBLOCK)
    fds["disk file"] = os.open(tmp_path / "file", os.O_RDWR | os.O_CREAT, 0o600)
    fds["tmpfs file"] = os.open("/dev/shm", os.O_RDWR | os.O_TMPFILE, 0o600)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fds["socket"] = sock.fileno()
    fds["eventfd"] = os.eventfd(0)
    fds["memfd named otherwise"] = os.memfd_create("someone-else", os.MFD_CLOEXEC)
    fds["unsealed"] = sealed.create("vmsandbox-unsealed", 1 << 20)
    fds["sealed"] = sealed.create("vmsandbox-sealed", 1 << 20)
    sealed.seal(fds["sealed"])
    try:
        yield fds
    finally:
        sock.close()
        for fd in [master, writing, *(v for k, v in fds.items() if k != "socket")]:
            os.close(fd)


def test_only_what_the_kernel_calls_a_memfd_of_ours_is_taken(tmp_path: Path) -> None:
    """Before it takes a descriptor, the helper asks the kernel what it is (its link, its mount): a terminal, a pipe,
    a FIFO, a file of a disk, a tmpfs file (shmem, as memfds are, on another mount), a socket, an eventfd and a
    memfd not named as ours are never taken; our memfds are, sealed or not, and said so."""
    with every_kind(tmp_path) as fds:
        libc = Recording()
        said, held = asked(list(fds.values()), libc)
        assert held == [] and not said["holding"] and not said["gone"]
        assert libc.taken == [fds["unsealed"], fds["sealed"]]
        assert [(f[0], f[5]) for f in said["found"]] == [(fds["unsealed"], 0), (fds["sealed"], 1)]
        st = os.fstat(fds["sealed"])
        assert said["found"][1][1:5] == [st.st_dev, st.st_ino, st.st_size, st.st_blocks]
        others = {v for k, v in fds.items() if k not in ("unsealed", "sealed")}
        assert {fd for fd, why in said["skipped"]} == others
        assert {why for _, why in said["skipped"]} == {look.NOT_MEMFD}
        # asked for every memory file of ours it holds: just those two, found by their links
        every, _ = look.answer({"pid": os.getpid(), "start": None, "fds": None}, look.memfd_mount(), Recording())
        assert [f[0] for f in every["found"]] == [fds["unsealed"], fds["sealed"]]


@pytest.mark.parametrize("instead", ["pipe", "tmpfs file", "fifo", "terminal"])
def test_what_is_no_memfd_once_taken_is_held_and_never_closed(tmp_path: Path, instead: str) -> None:
    """The look before the take is advisory: the process may swap the number in between. What the take got is asked
    again of the kernel (F_GET_SEALS, then its mount): anything else than a memfd is kept open — its close could
    wait for good (a FUSE file's FLUSH) — and the helper says it holds one (it then ends: its exit closes it, after
    its memory is gone)."""
    with every_kind(tmp_path) as fds:
        libc = Recording(swap=fds[instead])
        said, held = asked([fds["sealed"]], libc)
        try:
            assert said == {"gone": False, "found": [], "skipped": [[fds["sealed"], look.SWAPPED]], "holding": True}
            (copy,) = held
            assert os.fstat(copy).st_ino == os.fstat(fds[instead]).st_ino  # still open: never closed by the helper
        finally:
            for fd in held:
                os.close(fd)
        # swapped for another memfd: that is safe to hold and close, and its inode says it is not the one
        libc = Recording(swap=fds["unsealed"])
        said, held = asked([fds["sealed"]], libc)
        assert held == [] and said["found"][0][2] == os.fstat(fds["unsealed"]).st_ino


def test_a_process_that_ended_or_whose_pid_is_another_is_gone(tmp_path: Path) -> None:
    with every_kind(tmp_path) as fds:
        said, _ = asked([fds["sealed"]], Recording(), start="1")  # another start time: the pid is reused
        assert said["gone"] and said["found"] == []
    said, _ = look.answer({"pid": 2**22 + 1, "start": None, "fds": [3]}, look.memfd_mount(), Recording())
    assert said["gone"]


def test_a_holder_is_alive_only_holding_the_sealed_file_it_was_given_and_says_why_not(tmp_path: Path) -> None:
    me = (os.getpid(), pids.process_start(os.getpid()) or "")
    with every_kind(tmp_path) as fds:
        st = os.fstat(fds["sealed"])
        assert isinstance(sealed.Held(*me, fds["sealed"], st.st_ino, st.st_size).look(), foreign.Memfd)
        assert sealed.Held(*me, fds["fifo"], st.st_ino, st.st_size).look() == (
            f"skipped holder pid {me[0]}: its descriptor {fds['fifo']} is not a memfd"
        )
        other = sealed.Held(*me, fds["sealed"], st.st_ino + 1, st.st_size).look()
        assert (
            other
            == f"skipped holder pid {me[0]}: its descriptor {fds['sealed']} is another memory file than it was given"
        )
        unsealed = os.fstat(fds["unsealed"])
        not_sealed = sealed.Held(*me, fds["unsealed"], unsealed.st_ino, unsealed.st_size).look()
        assert not_sealed == other.replace(str(fds["sealed"]), str(fds["unsealed"]))
        assert sealed.Held(me[0], "1", fds["sealed"], st.st_ino, st.st_size).look() is None  # ended: nothing said
        fifo = f"skipped holder pid {me[0]}: its descriptor {fds['fifo']} is not a memfd"
        assert foreign.unsaid() == [fifo, other, not_sealed]
        assert foreign.unsaid() == []  # each said once
        sealed.Held(*me, fds["fifo"], st.st_ino, st.st_size).look()
        assert foreign.unsaid() == []  # and never again


def test_a_process_that_handed_over_something_else_is_not_looked_at_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the helper holds what a process handed it (and has ended with it), this process never asks about that
    process again: each look would cost another helper, perhaps hanging for good."""
    asks: list[dict[str, Any]] = []

    def swapped(request: dict[str, Any]) -> dict[str, Any]:
        asks.append(request)
        return {"gone": False, "found": [], "skipped": [[7, look.SWAPPED]], "holding": True}

    monkeypatch.setattr(foreign, "_asked", swapped)
    first = foreign.look(os.getpid(), "QEMU pid 1")
    assert first.found == () and "was no memfd once taken" in first.skipped[0]
    again = foreign.look(os.getpid(), "QEMU pid 1")
    assert len(asks) == 1 and "handed root's look something else" in again.skipped[0]
    assert foreign.unsaid() == [*first.skipped, *again.skipped]
    monkeypatch.setattr(foreign, "_asked", lambda _r: {"found": "nonsense", "skipped": []})
    assert foreign.look(1, "holder pid 1").skipped == (
        "skipped holder pid 1: root's look helper answered what it may not",
    )


class _Left:
    """A helper left running (perhaps in state D for good), as Popen shows it: `poll` is None until it ends."""

    def __init__(self) -> None:
        self.ended = False

    def poll(self) -> int | None:
        return 0 if self.ended else None


def test_a_holders_words_are_read_to_a_deadline_never_past_it() -> None:
    """A holder a process of its account traces may say anything, half a line, or nothing: what it said by the
    deadline is taken as it is (compared with what the holder we started says, never parsed)."""
    reading, writing = os.pipe()
    with os.fdopen(reading, "rb") as stream:
        try:
            os.write(writing, b"ready 12 x\nmore")
            assert sealed._words(stream, time.monotonic() + 60, until_line=True) == "ready 12 x"
            os.write(writing, b"rea")  # half a line, and the writer stays: no end, no newline
            assert sealed._words(stream, time.monotonic() + 0.05, until_line=True) == "rea"
            os.write(writing, b"\xff\xfe\x1b[2J" + b"x" * 2000 + b"\n")
            said = sealed._words(stream, time.monotonic() + 60, until_line=True)
            assert len(said) <= sealed.SAID_BYTES and sealed._printable(said).startswith("??")
        finally:
            os.close(writing)
        rest = sealed._words(stream, time.monotonic() + 60, until_line=False)  # the rest, to the end, bounded
        assert set(rest) == {"x"} and len(rest) <= sealed.SAID_BYTES


@pytest.mark.parametrize("failure", [ValueError("not enough values to unpack"), OSError(12, "Cannot allocate memory")])
def test_a_warm_start_whose_shared_memory_fails_in_any_way_loads_a_copy(
    monkeypatch: pytest.MonkeyPatch, failure: Exception
) -> None:
    def fails(*_args: object) -> sharing.Shared:
        raise failure

    monkeypatch.setattr(sharing, "of_template", fails)
    record = saved_record("warm")
    assert start._template_memory(record, None, None) is None  # type: ignore[arg-type]
    assert record.memory_note.startswith("its template's memory is copied: ")
    assert type(failure).__name__ in record.memory_note


class Keepers:
    """The keepers a helper makes, as numbers (no process is made here): `make` is look.make_keeper's stand-in."""

    def __init__(self, *, made: bool = True) -> None:
        self.made = made
        self.pids: list[int] = []

    def make(self) -> int | None:
        if not self.made:
            return None
        self.pids.append(90000 + len(self.pids))
        return self.pids[-1]


def served(requests: list[dict[str, Any]], libc: Recording, keepers: Keepers) -> tuple[int, list[dict[str, Any]]]:
    """What the helper's loop (look.serve) says to `requests`, in order, after it said it is ready; its exit code."""
    out = io.BytesIO()
    lines = io.BytesIO(b"".join(json.dumps(r).encode() + b"\n" for r in requests))
    code = look.serve(look.memfd_mount(), libc, keepers.make, lines, out)
    ready, *said = [json.loads(line) for line in out.getvalue().splitlines()]
    assert ready == look.READY  # before any request
    return code, said


def test_a_helper_that_holds_what_it_took_hands_it_to_one_keeper_and_goes_on_answering(tmp_path: Path) -> None:
    """What the helper may not close stays in its descriptor table, which it shares with a keeper made at the first
    such copy (said first, on a line of its own); it goes on answering, each later copy in the same table, and ends
    only once it holds MOST_HELD of them. Without a keeper (the kernel makes none) it ends with the first."""
    me, start = os.getpid(), pids.process_start(os.getpid())
    with every_kind(tmp_path) as fds:
        ask = {"pid": me, "start": start, "fds": [fds["sealed"]]}
        keepers, libc = Keepers(), Recording(swap=fds["fifo"])
        code, said = served([ask] * 5, libc, keepers)
        for copy in libc.copies:  # still open in this process: the helper's table is its keeper's, never closed
            assert os.fstat(copy).st_ino == os.fstat(fds["fifo"]).st_ino
        libc.close_copies()
        assert code == 0 and keepers.pids == [90000]  # every request answered; one keeper for all
        assert said[0] == {"keeper": 90000}
        assert [a["holding"] for a in said[1:]] == [True] * 5 and not any(a["ends"] for a in said[1:])
        assert served([ask] * 2, Recording(), Keepers())[1][-1]["found"]  # nothing held: no keeper

        libc = Recording(swap=fds["fifo"])
        code, said = served([ask] * 3, libc, Keepers(made=False))
        libc.close_copies()
        assert code == 1 and len(said) == 1 and said[0]["holding"] and said[0]["ends"]  # it ends holding it


def test_a_helper_ends_once_it_holds_its_most(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(look, "MOST_HELD", 3)
    with every_kind(tmp_path) as fds:
        ask = {"pid": os.getpid(), "start": pids.process_start(os.getpid()), "fds": [fds["sealed"]]}
        libc = Recording(swap=fds["pipe"])
        code, said = served([ask] * 5, libc, Keepers())
        libc.close_copies()
    assert code == 0 and [a.get("ends") for a in said] == [None, False, False, True]  # its keeper holds the three


class InProcessHelper:
    """Root's look helper as foreign._Helper starts it, but its loop (look.serve) run by a thread of this process on
    two pipes: it looks at this process's descriptors only. `hang_at`: a descriptor whose take never returns until
    the helper is killed (a killable wait of the kernel's, as a take of a process in the middle of an exec)."""

    started: ClassVar[list[InProcessHelper]] = []

    def __init__(self, libc: Recording, keepers: Keepers, hang_at: int | None = None, slow: bool = False) -> None:
        asked, self._requests = os.pipe()
        self._answers, answered = os.pipe()
        self.stdin, self.stdout = os.fdopen(self._requests, "wb"), os.fdopen(self._answers, "rb")
        self.pid = 0
        self.killed = threading.Event()
        hung = self

        class Taking:
            def syscall(self, number: int, pidfd: int, fd: int, flags: int) -> int:
                if fd == hang_at:
                    hung.killed.wait()
                    return -1
                return libc.syscall(number, pidfd, fd, flags)

        def loop() -> None:
            if slow:  # (an interpreter that starts slower than root waits: it says nothing until it is killed)
                self.killed.wait()
                return
            with (
                contextlib.suppress(OSError, ValueError),  # (root closed its ends: a pipe broken)
                os.fdopen(asked, "rb") as requests,
                os.fdopen(answered, "wb") as answers,
            ):
                look.serve(look.memfd_mount(), Taking(), keepers.make, requests, answers)

        self.thread = threading.Thread(target=loop, daemon=True)
        self.thread.start()
        InProcessHelper.started.append(self)

    def poll(self) -> int | None:
        return None if self.thread.is_alive() else 0

    def kill(self) -> None:
        self.killed.set()


@contextlib.contextmanager
def in_process_helper(
    monkeypatch: pytest.MonkeyPatch,
    libc: Recording,
    keepers: Keepers,
    hang_at: int | None = None,
    *,
    slow_first: bool = False,
) -> Iterator[foreign._Helper]:
    """`slow_first`: the first helper started says nothing until it is killed (an interpreter slow to start)."""
    ended: set[int] = set()

    def started() -> InProcessHelper:
        return InProcessHelper(libc, keepers, hang_at, slow=slow_first and not InProcessHelper.started)

    helper = foreign._Helper(started, ended.__contains__)  # type: ignore[arg-type]
    monkeypatch.setattr(foreign, "_HELPER", helper)
    try:
        yield helper
    finally:
        helper._leave(kill=True)
        for h in InProcessHelper.started:
            h.killed.set()
            h.thread.join(30)
        InProcessHelper.started.clear()


class SwapAt(Recording):
    """A take of any descriptor in `at` gets `swap` instead (the processes that race root's look); others are real."""

    def __init__(self, swap: int, at: set[int]) -> None:
        super().__init__(swap)
        self.at = at

    def syscall(self, number: int, pidfd: int, fd: int, flags: int) -> int:
        if fd in self.at:
            return super().syscall(number, pidfd, fd, flags)
        self.taken.append(fd)
        return int(self.libc.syscall(number, pidfd, fd, flags))


def test_offenders_each_cost_one_copy_and_the_rest_are_still_looked_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many offenders (more than MOST_LEFT, as eight racing QEMUs were against the old bound of 8 helpers) hand over
    what the helper keeps: one helper, one keeper, and a genuine memory file is still looked at."""
    me, start = os.getpid(), pids.process_start(os.getpid())
    with every_kind(tmp_path) as fds:
        offenders = [os.dup(fds["sealed"]) for _ in range(foreign.MOST_LEFT + 2)]
        keepers = Keepers()
        libc = SwapAt(fds["fifo"], set(offenders))
        try:
            with in_process_helper(monkeypatch, libc, keepers) as helper:
                first = None
                for fd in offenders:
                    said = helper.ask({"pid": me, "start": start, "fds": [fd]})
                    assert isinstance(said, dict) and said["holding"] and not said["ends"], said
                    first = first or helper.child
                    assert helper.child is first  # the same helper goes on
                genuine = helper.ask({"pid": me, "start": start, "fds": [fds["sealed"]]})
                assert isinstance(genuine, dict) and [f[0] for f in genuine["found"]] == [fds["sealed"]]
                assert helper.kept == keepers.pids == [90000] and foreign.left() == 1
        finally:
            libc.close_copies()
            for fd in offenders:
                os.close(fd)


def test_a_helper_killed_at_its_deadline_leaves_its_keeper_counted_and_its_process_shunned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A take that waits (the kernel's killable wait) after a copy was kept: root kills the helper at the deadline;
    the keeper it said it made is counted (it ends once the helper has, perhaps hanging), the process asked about is
    never asked about again, and a fresh helper answers the next look."""
    monkeypatch.setattr(foreign, "LOOK_DEADLINE", 0.2)
    me, start = os.getpid(), pids.process_start(os.getpid())
    with every_kind(tmp_path) as fds:
        swapped, waits = os.dup(fds["sealed"]), os.dup(fds["sealed"])
        keepers = Keepers()
        libc = SwapAt(fds["pipe"], {swapped})
        try:
            with in_process_helper(monkeypatch, libc, keepers, hang_at=waits) as helper:
                said = helper.ask({"pid": me, "start": start, "fds": [swapped, waits]})
                assert isinstance(said, str) and "no answer within" in said
                assert helper.kept == [90000] and (me, start) in foreign._SHUNNED
                wait_until_ended = InProcessHelper.started[0].thread
                wait_until_ended.join(30)
                assert foreign.left() == 1  # the keeper (the killed helper has ended and is reaped)
                again = helper.ask({"pid": me, "start": start, "fds": [fds["sealed"]]})
                assert isinstance(again, dict) and again["found"] and len(InProcessHelper.started) == 2
        finally:
            libc.close_copies()
            for fd in (swapped, waits):
                os.close(fd)


def test_a_helper_slow_to_start_is_killed_and_blames_no_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a loaded host a fresh helper may take long to start: past START_DEADLINE it is killed and the look is
    skipped (the caller assumes the worst), but the process asked about was never looked at, so it is no offender:
    the next look, from a fresh helper, sees its memory file. The look's own deadline starts once a helper is ready."""
    monkeypatch.setattr(foreign, "START_DEADLINE", 0.2)
    me, start = os.getpid(), pids.process_start(os.getpid())
    with every_kind(tmp_path) as fds, in_process_helper(monkeypatch, Recording(), Keepers(), slow_first=True) as helper:
        monkeypatch.setattr(foreign, "_asked", helper.ask)
        seen = foreign.look(me, "QEMU pid 1", start=start, fds=(fds["sealed"],))
        assert seen.blind and "did not say it was ready within 0 s" in seen.skipped[0]
        slow = InProcessHelper.started[0]
        assert slow.killed.is_set() and (me, start) not in foreign._SHUNNED
        again = foreign.look(me, "QEMU pid 1", start=start, fds=(fds["sealed"],))
        assert not again.blind and [m.fd for m in again.found] == [fds["sealed"]]
        assert len(InProcessHelper.started) == 2


def test_past_most_left_keepers_no_look_is_made_and_the_caller_is_told_it_is_blind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A keeper left running (and a helper that ended holding, where the kernel makes no keeper) costs a task and a
    pid, perhaps for good: past MOST_LEFT of them no look is made, and the caller is told it could not look (it
    assumes the worst); one that ends is reaped, and counts no more."""
    helper = foreign._Helper(reaped=lambda _pid: False)
    left = [_Left() for _ in range(2)]
    helper.left = left  # type: ignore[assignment]
    helper.kept = list(range(1, foreign.MOST_LEFT - 1))
    monkeypatch.setattr(foreign, "_HELPER", helper)
    monkeypatch.setattr(foreign, "_asked", helper.ask)
    seen = foreign.look(os.getpid(), "QEMU pid 1")
    assert seen.blind and f"left {foreign.MOST_LEFT} processes holding" in seen.skipped[0]
    assert helper.child is None  # no helper started
    left[0].ended = True
    helper.reaped = lambda pid: pid == 1
    assert foreign.left() == foreign.MOST_LEFT - 2
