"""A process of QEMU's account that puts a file of its choosing where root looks: `python descriptor_standin.py
hold|race FILE UID GID NUMBER [ARG...]`, started as root (as libvirt starts a QEMU, as root starts a holder).

It opens FILE (a FUSE stand-in's file that never answers root's close) and makes a sealed memfd named as ours,
becomes UID:GID for good (dumpable, as a holder and a QEMU are), and then
- `hold`: keeps FILE at descriptor NUMBER, as a holder traced by a QEMU of its account would after its
  descriptor was swapped;
- `race`: swaps NUMBER between the memfd and FILE without end, as a QEMU racing root's look at its own descriptor.
It prints `ready PID NUMBER INODE SIZE` (the memfd's inode and size: what a holder's record would say) and runs
until its stdin ends. ARG...: ignored (a QEMU's `guest=NAME,` for the pid-file check).
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import sys
import threading
import time

SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
PR_SET_DUMPABLE = 4
DWELL = 200_000  # nanoseconds each file stays at the number, racing (the FUSE file's close, answered, not counted)


def main(mode: str, path: str, uid: int, gid: int, number: int) -> int:
    foreign = os.open(path, os.O_RDONLY)
    memfd = os.memfd_create("vmsandbox-standin", os.MFD_ALLOW_SEALING)
    os.ftruncate(memfd, 1 << 20)
    fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, SEALS)
    os.dup2(foreign if mode == "hold" else memfd, number, inheritable=False)
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
    st = os.fstat(memfd)
    print(f"ready {os.getpid()} {number} {st.st_ino} {st.st_size}", flush=True)
    ended = threading.Event()

    def until_stdin_ends() -> None:
        sys.stdin.read()
        ended.set()

    threading.Thread(target=until_stdin_ends, daemon=True).start()
    if mode == "hold":
        ended.wait()
        return 0
    while not ended.is_set():
        os.dup2(foreign, number, inheritable=False)
        dwell()
        os.dup2(memfd, number, inheritable=False)  # (its close of the FUSE file is answered: it is not root)
        dwell()
    return 0


def dwell() -> None:
    until = time.monotonic_ns() + DWELL
    while time.monotonic_ns() < until:
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])))
