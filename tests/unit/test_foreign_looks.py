"""Root's looks at what another account's process holds (vm.memory.look, the helper's own code, run here in this
process; vm.memory.foreign, root's side): only what the kernel calls a memfd is taken, and what turns out to be
something else once taken is held, never closed; a process that handed one over is not looked at again; what was
skipped is said once; the holder's words are compared, never parsed, and never waited for past a deadline; a warm
start whose shared memory fails for any reason loads a copy."""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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

    def syscall(self, number: int, pidfd: int, fd: int, flags: int) -> int:
        assert number == look.SYS_PIDFD_GETFD
        self.taken.append(fd)
        if self.swap is not None:
            return os.dup(self.swap)
        return int(self.libc.syscall(number, pidfd, fd, flags))


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
    sealed.seal(fds["sealed"], (os.getuid(), os.getgid()))
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


def test_looks_stop_while_too_many_helpers_are_left_hanging(monkeypatch: pytest.MonkeyPatch) -> None:
    """A helper left hanging costs a task and a pid: past MOST_LEFT of them no look is made (the callers go on as for
    a process they could not look at); one that ends is reaped, and counts no more."""
    helper = foreign._Helper()
    left = [_Left() for _ in range(foreign.MOST_LEFT)]
    helper.left = left  # type: ignore[assignment]
    monkeypatch.setattr(foreign, "_HELPER", helper)
    said = helper.ask({"pid": 1, "start": None, "fds": None})
    assert isinstance(said, str) and f"left {foreign.MOST_LEFT} looks hanging" in said
    assert helper.child is None  # no helper started
    left[0].ended = True
    assert foreign.left() == foreign.MOST_LEFT - 1


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
