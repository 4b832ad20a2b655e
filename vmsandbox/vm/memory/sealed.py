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

import array
import contextlib
import fcntl
import json
import os
import signal
import socket
import stat
import struct
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from vmsandbox import filewrite, paths, pids, proc
from vmsandbox.errors import VmsandboxError
from vmsandbox.vm.memory import foreign, look

SEALS = look.SEALS
READY_TIMEOUT = 30.0
EXIT_GRACE = 5.0  # a holder killed ends at once, unless a process of its account holds it up: then it is left
SAID_BYTES = 500  # what is kept of a holder's words on stderr when it did not start


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
    # a link there is refused, never followed; a FIFO is not waited on
    opened = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(opened, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise VmsandboxError(f"{source} is not a template's memory file", hint="run `vmsandbox rm --stale`")
        return filewrite.copy_data(f.fileno(), fd, os.fstat(f.fileno()).st_size, str(source))


def seal(fd: int) -> None:
    """Seal the memfd for good: root's, mode 0666, as the QEMUs of several accounts open it read-write (a session's
    own account each, confine.pool) — sealed, that lets none of them change a byte. What decides who opens it is
    who may reach a descriptor of it: a process holding one (/proc/PID/fd/N) of the same account, or root."""
    if os.geteuid() == 0:
        os.fchown(fd, 0, 0)
    os.fchmod(fd, 0o666)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)


def sealed(fd: int) -> bool:
    try:
        return fcntl.fcntl(fd, fcntl.F_GET_SEALS) & SEALS == SEALS
    except OSError:  # not a memfd
        return False


YAMA = Path("/proc/sys/kernel/yama/ptrace_scope")


def taking_problem() -> str | None:
    """Why root cannot take a copy of another process's descriptor here (vm.memory.look), or None."""
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

    def stat(self) -> foreign.Memfd | None:
        """The file the holder holds, if it still runs and holds that same file, sealed."""
        found = self.look()
        return found if isinstance(found, foreign.Memfd) else None

    def look(self) -> foreign.Memfd | str | None:
        """The file the holder holds, as root's look helper sees it (vm.memory.foreign: root's own process never
        holds what is at the holder's number, whatever a process of QEMU's account put there): that same file,
        sealed; else why not, in words (said once: foreign.unsaid); None if the holder ended."""
        seen = foreign.look(self.pid, f"holder pid {self.pid}", start=self.start, fds=(self.fd,))
        if seen.gone:
            return None
        if seen.skipped:
            return seen.skipped[0]
        for m in seen.found:
            if m.inode == self.ino and m.size == self.size and m.sealed:
                return m
        said = f"skipped holder pid {self.pid}: its descriptor {self.fd} is another memory file than it was given"
        foreign.note(said)
        return said

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
            return pids.readable(pidfd, wait) if wait else False
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


def held_files(entries: Iterable[Path] | None = None) -> list[tuple[Held, foreign.Memfd]]:
    """The holders of this machine that still hold their sealed file, and that file, from what each says where it
    is (`entries`, by default every one in paths.memory_holders_dir(): root's)."""
    if entries is None:
        entries = holder_entries()
    found = []
    for entry in entries:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            held = Held.of(json.loads(entry.read_text()))
            st = held.stat()
            if st is not None:
                found.append((held, st))
    return found


def hold(fd: int, owner: tuple[int, int], *, detached: bool, serve: Path | None = None) -> tuple[Held, proc.Child]:
    """Start the holder of sealed memfd `fd` as QEMU's account `owner`. `detached`: it holds the file until it is
    stopped (Held.stop), outliving this process; else until the child's stdin is closed (Child.stdin: close it,
    or this process ends). `serve`: root's keeper instead (owner (0, 0), detached), handing the file to root on
    that socket (fetch)."""
    if not sealed(fd):
        raise ValueError("only a sealed memory file is handed to QEMU")
    st = os.fstat(fd)
    os.set_inheritable(fd, True)
    try:
        if serve is None:
            how = ["signal" if detached else "eof"]
        else:
            owner, how = (0, 0), ["serve", str(serve)]
        argv = proc.own_module("vmsandbox.vm.memory.hold", str(owner[0]), str(owner[1]), str(fd), *how)
        child = proc.start(argv, stdin=proc.DEVNULL if detached else proc.PIPE, pass_fds=(fd,), cwd=Path("/"))
    finally:
        os.set_inheritable(fd, False)
    deadline = time.monotonic() + READY_TIMEOUT
    line = _words(child.stdout, deadline, until_line=True)
    # its words are only compared, never parsed: the one we started, holding the number we gave it (a process of
    # its account may trace it before it says them, and make it say anything)
    if line != f"ready {child.pid} {fd}":
        end(child, 0.0)
        said = _words(child.stderr, time.monotonic() + 1.0, until_line=False)
        raise VmsandboxError(
            f"the memory holder did not start: {_printable(line or said or 'no answer')}",
            hint="`vmsandbox doctor` says whether sessions here can share memory",
        )
    return Held(child.pid, pids.process_start(child.pid) or "", fd, st.st_ino, st.st_size), child


FETCH_TIMEOUT = 5.0


def fetch(socket_path: Path, held: Held) -> int:
    """A descriptor of the file root's keeper `held` holds (hold with `serve`), handed over on its socket: checked
    to come from that very process (root's: no other account can put another file at its number) and to be that
    same sealed file. The caller closes it."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(FETCH_TIMEOUT)
        where = os.open(socket_path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:  # (through its directory's descriptor: a socket's path may hold 107 bytes, a runtime directory more)
            conn.connect(f"/proc/self/fd/{where}/{socket_path.name}")
        finally:
            os.close(where)
        pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        if uid != 0 or pid != held.pid or not pids.alive(pid, held.start):
            raise VmsandboxError(f"the memory keeper's socket {socket_path} is not its keeper's (pid {pid})")
        fds = array.array("i")
        _data, ancillary, _flags, _addr = conn.recvmsg(1, socket.CMSG_LEN(fds.itemsize))
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    if len(fds) != 1:
        for extra in fds:
            os.close(extra)
        raise VmsandboxError("the memory keeper handed over no memory file")
    got = fds[0]
    st = os.fstat(got)
    if st.st_ino != held.ino or st.st_size != held.size or not sealed(got):
        os.close(got)
        raise VmsandboxError("the memory keeper handed over another file than it was given")
    os.set_inheritable(got, False)
    return got


def end(child: proc.Child, wait: float) -> bool:
    """Let a holder we started end: told (its stdin closed), `wait` seconds, then killed, EXIT_GRACE more — then
    left to itself, never waited for longer (a process of its account may hold it up: a FUSE file closed in it
    hangs it for good). Whether it ended."""
    if child.stdin is not None:
        with contextlib.suppress(OSError):
            child.stdin.close()
    try:
        pidfd = os.pidfd_open(child.pid)  # (our child, not yet reaped: its pid is not another's)
    except OSError:
        return child.poll() is not None
    try:
        for grace, kill in ((wait, True), (EXIT_GRACE, False)):
            if pids.readable(pidfd, grace):
                child.wait()  # (it ended: at once)
                return True
            if kill:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        return False
    finally:
        os.close(pidfd)


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() and c.isascii() else "?" for c in text)


def _words(stream: IO[bytes] | None, deadline: float, *, until_line: bool) -> str:
    """What a holder said on `stream` by `deadline`: its first line (`until_line`), or what it said until the
    stream ended, at most SAID_BYTES (never a read that waits past the deadline)."""
    if stream is None:
        return ""
    got = bytearray()
    fd = stream.fileno()
    while len(got) < SAID_BYTES and not (until_line and b"\n" in got):
        wait = deadline - time.monotonic()
        if wait <= 0 or not pids.readable(fd, wait):
            break
        chunk = os.read(fd, SAID_BYTES)
        if not chunk:
            break
        got += chunk
    text = bytes(got[:SAID_BYTES]).decode(errors="replace")
    return text.split("\n", 1)[0].strip() if until_line else text.strip()
