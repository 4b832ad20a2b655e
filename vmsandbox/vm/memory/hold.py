"""The holder of a sealed memory file (`python -m vmsandbox.vm.memory.hold UID GID FD eof|signal`, the memfd on FD):
the process through which QEMU opens a template's (or a fork source's) memory, at /proc/PID/fd/FD.

QEMU 7.2 opens a memory backend's file by path, and read-write even to map it copy-on-write. A memfd has no path
but /proc/PID/fd/N of a process holding it, which the kernel lets a process open only if it may trace that
process: the same account, no capabilities the opener lacks, and dumpable. So the holder becomes QEMU's
account (libvirt's DAC label: libvirt-qemu) and nothing more, and stays dumpable. What QEMU opens is sealed
(memory.sealed.SEALS: no write, no resize, no hole punched, the seals themselves fixed): neither QEMU nor the holder can
change a byte of it, whatever they do with their descriptors, while each QEMU maps it privately. Every QEMU
libvirt starts runs as that same account already, so the holder gives a QEMU no reach it did not have.

It imports only the standard library, and only before it changes account: nothing is read from disk after.
`eof`: it holds the file until its stdin ends (the vmsandbox that started it closes it, or dies);
`signal`: until it is sent SIGTERM (a template's holder, which outlives the command that started it).

`serve SOCKET` (`python -m vmsandbox.vm.memory.hold 0 0 FD serve SOCKET`): root's keeper of a template's file,
which sessions of many accounts map. It stays root's (no account of a session may trace it, nor put another file
at its number) and hands a copy of its descriptor to root alone (SO_PEERCRED) on a socket in root's own runtime
directory; root passes it to a holder of the session's account (`eof`) for the moment its QEMU opens it. Until
SIGTERM.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import os
import signal
import socket
import struct
import sys
from pathlib import Path

_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_SET_SECCOMP, _PR_SET_NO_NEW_PRIVS = 1, 4, 22, 38
_SECCOMP_MODE_STRICT = 1


def become(uid: int, gid: int) -> None:
    """This process becomes uid:gid for good, with no supplementary groups and no capabilities, dumpable (QEMU of
    the same account may open its descriptors), unable to gain privileges again."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    libc = ctypes.CDLL(None, use_errno=True)
    for option in (_PR_SET_NO_NEW_PRIVS, _PR_SET_DUMPABLE):
        if libc.prctl(option, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"prctl({option}) failed")
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid):
        raise OSError(f"could not become {uid}:{gid}")


SEND_TIMEOUT = 2.0  # a client of root's that does not read its descriptor is let go


def serve(fd: int, path: str) -> None:
    """Hand a copy of descriptor `fd` to each process of root's that connects to the socket at `path`."""
    Path(path).unlink(missing_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o077)
    where = os.open(Path(path).parent, os.O_RDONLY | os.O_DIRECTORY)
    try:  # (through its directory's descriptor: a socket's path may hold 107 bytes, a runtime directory more)
        server.bind(f"/proc/self/fd/{where}/{Path(path).name}")
    finally:
        os.umask(old)
        os.close(where)
    server.listen(16)
    signal.signal(signal.SIGTERM, lambda *_: _end(path))
    sys.stdout.write(f"ready {os.getpid()} {fd}\n")
    sys.stdout.flush()
    while True:
        conn, _ = server.accept()
        with conn:
            conn.settimeout(SEND_TIMEOUT)
            _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            if uid != 0:
                continue  # root's alone
            with contextlib.suppress(OSError):
                conn.sendmsg([b"m"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])


def _end(path: str) -> None:
    with contextlib.suppress(OSError):
        Path(path).unlink()
    os._exit(0)


def main(argv: list[str]) -> int:
    uid, gid, fd, until = int(argv[0]), int(argv[1]), int(argv[2]), argv[3]
    os.fstat(fd)  # the memory file is there
    if until == "serve":
        if uid != 0 or os.geteuid() != 0:
            raise SystemExit("memhold: only root serves a memory file")
        # it outlives the command that started it (whose children die with it: proc.start): a holder that changes
        # account loses that signal by the change itself, root's keeper lets it go
        if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        serve(fd, argv[4])
        return 0
    if uid == 0:
        raise SystemExit("memhold: QEMU's account is root: a root QEMU has no capabilities to open our descriptors")
    become(uid, gid)
    sys.stdout.write(f"ready {os.getpid()} {fd}\n")
    sys.stdout.flush()
    if until == "eof":
        # from here on it only waits: the kernel lets it read, write and end (seccomp's strict mode), whatever a
        # process of its account that traces it makes it run — it is no door out of that QEMU's confinement (its
        # seccomp filter, its cgroup). Its end is then the kernel's kill, at the first other call it makes.
        if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_STRICT, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")
        while os.read(0, 1):
            pass
    else:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        while True:
            signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
