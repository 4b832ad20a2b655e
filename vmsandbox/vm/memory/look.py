"""Root's look at another process's descriptors (`python -m vmsandbox.vm.memory.look`): a helper process that
answers, one JSON line per JSON line asked on its stdin, which descriptors of a process (a holder, a QEMU) are
memory files of ours (memfds), with their inode, size and seals. Started, asked with a deadline and abandoned by
vm.memory.foreign: root's own process never holds a descriptor another account handed it.

Why a process of its own: whatever a process of QEMU's account puts at a number root looks at (it may trace a
holder, and a QEMU is its own) is what root takes with pidfd_getfd — a FUSE file whose close sends a FLUSH that is
never answered (the closer sits in state D for good, deaf to SIGKILL), a FIFO, a terminal, a device, something
new. The helper takes it instead, and asks nothing of the file:
1. before taking it, what the kernel says of the descriptor: its link (/proc/PID/fd/N reads `/memfd:NAME (deleted)`)
   and its mount (/proc/PID/fdinfo/N `mnt_id`, the kernel's internal one of every memfd); anything else is not taken;
2. that is advisory (the process may swap the number between the look and the take), so of the copy it took, again:
   F_GET_SEALS, which the kernel answers only for a memory file (shmem) without calling the file, then its mount;
3. only a memory file is then asked its size (fstat) and closed: shmem's close never waits. Anything else is never
   closed by the helper: at the first such copy it makes a keeper (`make_keeper`), a process that shares its
   descriptor table and is root's child as the helper is, and goes on answering. The keeper waits for the helper
   to end (told to, full, killed at a deadline) and then ends: the table's last holder, its exit is the close that
   may hang, after its memory is released (a task's exit lets go of its memory before its descriptors). So the
   helper itself always ends at once, and every copy a helper held, however many offenders handed them over, costs
   one task and one pid for good at worst; foreign bounds how many it leaves. Where the kernel makes no keeper
   (clone3 refused), the helper ends with what it holds, as its own keeper.

Standard library only, nothing read from disk once it runs but /proc. SIGTERM is ignored (a thread that started it
may end: PDEATHSIG): it ends when its stdin does, or once it holds MOST_HELD copies (root starts a fresh one).
It says {"ready": true} once it runs (root's deadline for a look counts from there: a helper slow to start on a
loaded host blames no process). Each answer is one JSON line; a keeper made while answering is said first, on a line
of its own ({"keeper": PID}).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import select
import signal
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

PREFIX = "/memfd:vmsandbox-"  # the link of every memory file of ours (vm.memory.sealed.create names them so)
SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
SYS_PIDFD_GETFD = 438  # pidfd_getfd(2), Linux 5.6: one number on every architecture
SYS_CLONE3 = 435  # clone3(2), Linux 5.3: one number on every architecture
CLONE_FILES, CLONE_PARENT = 0x400, 0x8000
CLONE_ARGS = struct.Struct("=8Q")  # struct clone_args as Linux 5.3 knows it: flags, pidfd, child_tid, parent_tid,
# exit_signal (0: CLONE_PARENT takes the helper's), stack, stack_size (0, 0: the helper's stack, copied), tls
MOST_HELD = 256  # copies a helper holds (with its keeper) before it ends and root starts a fresh one
MOST = 64  # memory files looked at in one process, at most (a QEMU maps one; one could make up thousands)
LINE = 1 << 16  # a request's length, at most
NAME = b"vmsandbox-look"  # what `ps` shows of it
KEEPER_NAME = b"vmsandbox-keep"  # and of its keeper (which may hang for good once the helper has ended)
_PR_SET_NAME = 15
READY = {"ready": True}  # its first line, before any request

# why a descriptor was not looked at (vm.memory.foreign says each in words)
NOT_MEMFD, SWAPPED, NOT_TAKEN, TOO_MANY = "not-memfd", "swapped", "not-taken", "too-many"


def mount_in(fdinfo: str) -> int | None:
    """The mount a descriptor's file is on, from its fdinfo text (None: it does not say)."""
    for line in fdinfo.splitlines():
        if line.startswith("mnt_id:"):
            with contextlib.suppress(IndexError, ValueError):
                return int(line.split()[1])
    return None


def mount_of(pid: int | str, fd: int) -> int | None:
    """The mount of process `pid`'s descriptor `fd` (fdinfo: nothing is asked of its file)."""
    try:
        with Path(f"/proc/{pid}/fdinfo/{fd}").open(encoding="ascii", errors="replace") as f:
            return mount_in(f.read(4096))
    except OSError:
        return None


def memfd_mount() -> int | None:
    """The kernel's internal mount every memfd lives on, read from a memfd made to ask."""
    probe = os.memfd_create("vmsandbox-mount", os.MFD_CLOEXEC)
    try:
        return mount_of("self", probe)
    finally:
        os.close(probe)


def start_of(pid: int) -> str | None:
    """The start time of process `pid` while it runs (a reused pid is another process; a zombie holds nothing)."""
    try:
        with Path(f"/proc/{pid}/stat").open(encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if len(fields) < 20 or fields[0] in ("Z", "X") else fields[19]


def seals_of(fd: int) -> int | None:
    """The seals of a memory file; None for anything else (the kernel answers F_GET_SEALS without the file)."""
    try:
        return fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError:
        return None


def told(pid: int, fd: int, mount: int | None) -> str | None:
    """What the kernel says of process `pid`'s descriptor `fd` before it is taken: None if it looks like a memory
    file of ours, else why not (advisory: the process may swap it before it is taken)."""
    try:
        link = str(Path(f"/proc/{pid}/fd/{fd}").readlink())
    except OSError:
        return NOT_TAKEN
    if not link.startswith(PREFIX) or mount is None or mount_of(pid, fd) != mount:
        return NOT_MEMFD
    return None


def answer(
    request: dict[str, Any], mount: int | None, libc: Any, hold: Callable[[int], None] = lambda _fd: None
) -> tuple[dict[str, Any], list[int]]:
    """The answer to one request ({"pid", "start", "fds": a list, or null for every memory file of ours}), and the
    copies taken that are no memory file (never closed: see the module; each handed to `hold` as it is taken,
    before the next take, which could be the one that waits)."""
    pid, start, fds = int(request["pid"]), request.get("start"), request.get("fds")
    found: list[list[int]] = []
    skipped: list[list[Any]] = []
    held: list[int] = []
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return {"gone": True, "found": found, "skipped": skipped, "holding": False}, held
    try:
        now = start_of(pid)
        if now is None or (start is not None and now != str(start)):  # (the pidfd holds that process from here on)
            return {"gone": True, "found": found, "skipped": skipped, "holding": False}, held
        if fds is None:
            fds = _memory_files(pid)
        for n, fd in enumerate(int(f) for f in fds):
            if n >= MOST:
                skipped.append([fd, TOO_MANY])
                continue
            why = told(pid, fd, mount)
            got = -1 if why is not None else int(libc.syscall(SYS_PIDFD_GETFD, pidfd, fd, 0))
            if why is None and got < 0:
                why = NOT_TAKEN
            if why is not None:
                skipped.append([fd, why])
                continue
            seals = seals_of(got)
            if seals is None or mount_of("self", got) != mount:  # taken, and no memory file: never closed here
                held.append(got)
                hold(got)
                skipped.append([fd, SWAPPED])
                continue
            st = os.fstat(got)
            os.close(got)  # (a memory file's close never waits)
            found.append([fd, st.st_dev, st.st_ino, st.st_size, st.st_blocks, int(seals & SEALS == SEALS)])
    finally:
        os.close(pidfd)
    return {"gone": False, "found": found, "skipped": skipped, "holding": bool(held)}, held


def _memory_files(pid: int) -> list[int]:
    """The descriptors of process `pid` whose link names a memory file of ours (readlink asks nothing of a file)."""
    found = []
    with contextlib.suppress(OSError):
        for entry in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError, ValueError):
                if str(entry.readlink()).startswith(PREFIX):
                    found.append(int(entry.name))
    return sorted(found)


class Keeping:
    """What a helper holds of what it took and may not close: how many copies, and its keeper (made at the first,
    by `make`; None: none could be made), said to root on a line of its own as soon as it is made."""

    def __init__(self, make: Callable[[], int | None], say: Callable[[dict[str, Any]], None]) -> None:
        self.make, self.say = make, say
        self.keeper: int | None = None
        self.held = 0

    def hold(self, _fd: int) -> None:
        if self.held == 0:
            self.keeper = self.make()
            if self.keeper is not None:
                self.say({"keeper": self.keeper})
        self.held += 1

    @property
    def ends(self) -> bool:
        """Whether the helper ends after this answer: it holds a copy and has no keeper, or it is full."""
        return (self.held > 0 and self.keeper is None) or self.held >= MOST_HELD


def make_keeper(libc: Any) -> int | None:
    """A keeper of this helper's descriptors: a copy of this process (clone3) that shares its descriptor table
    (CLONE_FILES) and is its parent's child (CLONE_PARENT: root's process reaps it), waits until the helper has
    ended, then ends, the table's last holder: its exit closes what the helper took and kept. Its pid; None where
    the kernel makes none (a filter refuses clone3, a kernel before 5.3)."""
    me = os.pidfd_open(os.getpid())  # (in the shared table, never closed: the keeper waits on it)
    args = ctypes.create_string_buffer(CLONE_ARGS.pack(CLONE_FILES | CLONE_PARENT, 0, 0, 0, 0, 0, 0, 0))
    pid = int(libc.syscall(SYS_CLONE3, args, ctypes.c_size_t(CLONE_ARGS.size)))
    if pid == 0:  # the keeper: one thread, this process's memory copied; it runs nothing but this
        try:
            libc.prctl(_PR_SET_NAME, KEEPER_NAME, 0, 0, 0)
            until = select.poll()  # (never select(2): it takes no descriptor past 1,023)
            until.register(me, select.POLLIN)
            until.poll()  # until the helper has ended
        finally:
            os._exit(0)  # (never the interpreter's teardown)
    if pid < 0:
        os.close(me)
        return None
    return pid


def serve(mount: int | None, libc: Any, make: Callable[[], int | None], stdin: IO[bytes], stdout: IO[bytes]) -> int:
    """Answer each request on `stdin` until it ends (0), or until the helper must end: it holds a copy that is no
    memory file and has no keeper (1), or it holds MOST_HELD (0)."""

    def say(said: dict[str, Any]) -> None:
        stdout.write(json.dumps(said).encode() + b"\n")
        stdout.flush()

    keeping = Keeping(make, say)
    say(READY)
    while line := stdin.readline(LINE):
        said, _held = answer(json.loads(line), mount, libc, keeping.hold)
        say({**said, "ends": keeping.ends})
        if keeping.ends:
            return 1 if keeping.keeper is None else 0
    return 0


def main() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_NAME, NAME, 0, 0, 0)
    code = 2
    try:
        code = serve(memfd_mount(), libc, lambda: make_keeper(libc), sys.stdin.buffer, sys.stdout.buffer)
    finally:  # never the interpreter's teardown: its memory goes before what it holds (see the module)
        os._exit(code)


if __name__ == "__main__":
    main()
