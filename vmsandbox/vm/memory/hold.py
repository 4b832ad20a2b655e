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
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_DUMPABLE, _PR_SET_NO_NEW_PRIVS = 4, 38


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


def main(argv: list[str]) -> int:
    uid, gid, fd, until = int(argv[0]), int(argv[1]), int(argv[2]), argv[3]
    os.fstat(fd)  # the memory file is there
    if uid == 0:
        raise SystemExit("memhold: QEMU's account is root: a root QEMU has no capabilities to open our descriptors")
    become(uid, gid)
    sys.stdout.write(f"ready {os.getpid()} {fd}\n")
    sys.stdout.flush()
    if until == "eof":
        while os.read(0, 4096):
            pass
    else:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        while True:
            signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
