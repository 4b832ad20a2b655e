"""Sealed memory files: a guest's RAM in a memfd that nobody can change once it is sealed — not the QEMU processes
that map it copy-on-write, not the holder that hands it to them (vm.memory.hold), not us — and the holder process
that keeps it where QEMU opens it (/proc/PID/fd/N).

The seals (memfd_create(2), fcntl F_ADD_SEALS): F_SEAL_WRITE (no write(2), no shared writable mapping, no hole
punched: QEMU 7.2 punches holes in a memory backend's file when the guest's balloon reports free pages, private
mapping or not, and fails with EPERM here), F_SEAL_SHRINK and F_SEAL_GROW (no truncate, no fallocate past the
end), F_SEAL_SEAL (the seals stay). A private (copy-on-write) mapping stays writable: a guest's writes land in
its own QEMU's anonymous pages, never in the file.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import json
import os
import select
import signal
import stat
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vmsandbox import paths, pids, proc
from vmsandbox.errors import VmsandboxError

SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
READY_TIMEOUT = 30.0
CHUNK = 1 << 30
SYS_PIDFD_GETFD = 438  # pidfd_getfd(2), Linux 5.6: one number on every architecture
PROC_SELF = Path("/proc/self")


def create(name: str, size: int) -> int:
    """A new memfd of `size` bytes (all holes), sealable, closed on exec."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return fd


def fill(fd: int, source: Path) -> int:
    """Copy the file `source` into memfd `fd` (sized like it), its holes left holes; the bytes copied."""
    copied = 0
    opened = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)  # a link there is refused, never followed
    with os.fdopen(opened, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise VmsandboxError(f"{source} is not a template's memory file", hint="run `vmsandbox rm --stale`")
        src, end, at = f.fileno(), os.fstat(f.fileno()).st_size, 0
        while at < end:
            try:
                data = os.lseek(src, at, os.SEEK_DATA)
            except OSError:  # ENXIO: no data past `at`
                break
            hole = os.lseek(src, data, os.SEEK_HOLE)
            os.lseek(fd, data, os.SEEK_SET)
            while data < hole:
                n = os.sendfile(fd, src, data, min(hole - data, CHUNK))
                if n == 0:
                    raise VmsandboxError(f"{source} ended while it was copied into memory")
                data += n
                copied += n
            at = hole
    return copied


def seal(fd: int, owner: tuple[int, int]) -> None:
    """Seal the memfd for good, owned by QEMU's account (which opens it read-write: sealed, that changes nothing)."""
    os.fchown(fd, *owner)
    os.fchmod(fd, 0o600)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)


def sealed(fd: int) -> bool:
    try:
        return fcntl.fcntl(fd, fcntl.F_GET_SEALS) & SEALS == SEALS
    except OSError:  # not a memfd
        return False


@functools.cache
def _memfd_mount() -> int | None:
    """The kernel's internal mount every memfd lives on (its mnt_id), read from a memfd made to ask."""
    probe = os.memfd_create("vmsandbox-mount", os.MFD_CLOEXEC)
    try:
        return _mount_of(probe)
    finally:
        os.close(probe)


def _mount_of(fd: int) -> int | None:
    """The mount of this process's descriptor `fd`, from /proc/self/fdinfo (nothing is asked of its file)."""
    with contextlib.suppress(OSError, ValueError):
        for line in (PROC_SELF / "fdinfo" / str(fd)).read_text().splitlines():
            if line.startswith("mnt_id:"):
                return int(line.split()[1])
    return None


YAMA = Path("/proc/sys/kernel/yama/ptrace_scope")


def taking_problem() -> str | None:
    """Why root cannot take a copy of another process's descriptor here (`taken`), or None."""
    try:
        if YAMA.read_text().strip() == "3":
            return "Yama's ptrace_scope is 3 here: root may not take the holder's memory file to check it"
    except OSError:
        pass  # no Yama
    release = os.uname().release.split("-")[0].split(".")
    with contextlib.suppress(ValueError):
        if tuple(int(p) for p in release[:2]) < (5, 6):
            return f"the kernel ({os.uname().release}) has no pidfd_getfd (5.6), by which root checks a holder"
    return None


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


@contextlib.contextmanager
def taken(pid: int, fd: int, start: str | None = None) -> Iterator[int | None]:
    """Process `pid`'s descriptor `fd`, if it is a memory file: a copy of it taken from the process (pidfd_getfd(2))
    and told a memfd by its mount alone (fdinfo) before anything is asked of the file; None for anything else.
    Nothing is opened by a path: a process of QEMU's account may trace a holder (or be a QEMU) and put any file at
    that number — a device opened would act (a watchdog armed, a terminal taken as root's controlling one), a FUSE
    file asked its size could hang root. `start`: the process's start time, so that a reused pid is not it."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        yield None
        return
    try:
        if start is not None and not pids.alive(pid, start):  # (the pidfd holds that process from here on)
            yield None
            return
        got = int(_libc().syscall(SYS_PIDFD_GETFD, pidfd, fd, 0))
        if got < 0:  # gone, no such descriptor, or a kernel before 5.6
            yield None
            return
        try:
            memory = _mount_of(got)
            yield got if memory is not None and memory == _memfd_mount() else None
        finally:
            os.close(got)
    finally:
        os.close(pidfd)


@dataclass(frozen=True)
class Held:
    """A holder process and the sealed memory file it holds: where QEMU opens it."""

    pid: int
    start: str  # the process's start time: a reused pid is not it
    fd: int
    ino: int  # the memfd's inode: what the holder holds is still that file
    size: int

    @property
    def path(self) -> str:
        return f"/proc/{self.pid}/fd/{self.fd}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, data: dict[str, Any]) -> Held:
        return cls(int(data["pid"]), str(data["start"]), int(data["fd"]), int(data["ino"]), int(data["size"]))

    def alive(self) -> bool:
        """Whether the holder still runs and holds that same file, sealed."""
        return self.stat() is not None

    def stat(self) -> os.stat_result | None:
        """The file the holder holds, if it still runs and holds that same file, sealed (taken from it: `taken`)."""
        with taken(self.pid, self.fd, self.start) as fd:
            if fd is None:
                return None
            st = os.fstat(fd)
            same = stat.S_ISREG(st.st_mode) and st.st_ino == self.ino and st.st_size == self.size
            return st if same and sealed(fd) else None

    def stop(self, wait: float = 0.0) -> bool:
        """Tell the holder to end, through a pidfd of the process whose start time is its own (a pid reused since
        is never signalled); with `wait`, wait that long for it to end. Whether it has ended (not: it runs on —
        held up, or a process of its account traces it — and its file with it)."""
        try:
            pidfd = os.pidfd_open(self.pid)
        except OSError:
            return True
        try:
            if not pids.alive(self.pid, self.start):  # (checked with the pidfd open: it holds that process)
                return True
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGTERM)
            return bool(select.select([pidfd], [], [], wait)[0]) if wait else False
        finally:
            os.close(pidfd)


def holder_entries() -> list[Path]:
    """What each holder says where it is (paths.memory_holders_dir), in order: none where there is none, nor for an
    account that may not read root's directory (another account's sessions never map root's holders' files); root
    denied it is told so (the guard and gc would count nothing reserved and stop nothing)."""
    root = paths.memory_holders_dir()
    try:
        return sorted(root.glob("*.json")) if root.is_dir() else []
    except PermissionError:
        if os.geteuid() == 0:  # root denied its own directory (a security module, a root-squashed mount): said
            raise
        return []


def held_files(entries: Iterable[Path] | None = None) -> list[Held]:
    """The holders of this machine that still hold their sealed file, from what each says where it is (`entries`,
    by default every one in paths.memory_holders_dir(): root's)."""
    if entries is None:
        entries = holder_entries()
    found = []
    for entry in entries:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            held = Held.of(json.loads(entry.read_text()))
            if held.alive():
                found.append(held)
    return found


def hold(fd: int, owner: tuple[int, int], *, detached: bool) -> tuple[Held, proc.Child]:
    """Start the holder of sealed memfd `fd` as QEMU's account `owner`. `detached`: it holds the file until it is
    stopped (Held.stop), outliving this process; else until the child's stdin is closed (Child.stdin: close it,
    or this process ends)."""
    if not sealed(fd):
        raise ValueError("only a sealed memory file is handed to QEMU")
    st = os.fstat(fd)
    os.set_inheritable(fd, True)
    try:
        until = "signal" if detached else "eof"
        argv = proc.own_module("vmsandbox.vm.memory.hold", str(owner[0]), str(owner[1]), str(fd), until)
        child = proc.start(argv, stdin=proc.DEVNULL if detached else proc.PIPE, pass_fds=(fd,), cwd=Path("/"))
    finally:
        os.set_inheritable(fd, False)
    line = _ready_line(child)
    if not line.startswith("ready "):
        child.kill()
        child.wait()
        said = (child.stderr.read() if child.stderr else b"").decode(errors="replace").strip()[-500:]
        raise VmsandboxError(
            f"the memory holder did not start: {line or said or 'no answer'}",
            hint="`vmsandbox doctor` says whether sessions here can share memory",
        )
    _, _pid, held_fd = line.split()  # (its own pid, which it says: the one we started is the one that holds)
    return Held(child.pid, pids.process_start(child.pid) or "", int(held_fd), st.st_ino, st.st_size), child


def _ready_line(child: proc.Child) -> str:
    """The holder's first line (it says it is ready once it is QEMU's account), or "" if none comes in time."""
    out = child.stdout
    if out is None:
        return ""
    ready, _, _ = select.select([out], [], [], READY_TIMEOUT)
    if not ready:
        return ""
    return out.readline(256).decode(errors="replace").strip()
