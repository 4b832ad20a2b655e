"""A FUSE file system that never answers root's close: `python fuse_standin.py MOUNTPOINT LOG`, as root.

It serves one file, `held` (0666, anyone may open it: allow_other), speaking the kernel's FUSE protocol over
/dev/fuse itself (no libfuse). Every FLUSH (what the kernel sends at each close of a descriptor of the file) from
an account other than root is answered at once; one from root (uid 0) never is, so a root process that closes a
copy of the file sits in state D until the file system goes away. Each FLUSH is written to LOG as
`flush UID PID answered|held`. It prints `ready` once mounted; on SIGTERM it closes /dev/fuse —
the kernel then fails every request still waiting, so nothing stays hung — and detaches the mount.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import struct
import sys
from pathlib import Path

FUSE_LOOKUP, FUSE_FORGET, FUSE_GETATTR, FUSE_OPEN, FUSE_RELEASE = 1, 2, 3, 14, 18
FUSE_FLUSH, FUSE_INIT, FUSE_INTERRUPT, FUSE_DESTROY, FUSE_BATCH_FORGET = 25, 26, 36, 38, 42
NO_REPLY = {FUSE_FORGET, FUSE_INTERRUPT, FUSE_BATCH_FORGET}
ENOENT, ENOSYS = 2, 38
IN_HEADER = struct.Struct("<IIQQIIIHH")  # len, opcode, unique, nodeid, uid, gid, pid, total_extlen, padding
OUT_HEADER = struct.Struct("<IiQ")  # len, error, unique
ROOT_ID, FILE_ID = 1, 2
NAME = b"held"
MNT_DETACH, MS_NOSUID, MS_NODEV = 2, 2, 4


def attr(node: int) -> bytes:
    """struct fuse_attr: the root directory, or the file (4 KiB, 0666)."""
    mode = 0o40755 if node == ROOT_ID else 0o100666
    size = 0 if node == ROOT_ID else 4096
    return struct.pack("<QQQQQQIIIIIIIIII", node, size, size // 512, 0, 0, 0, 0, 0, 0, mode, 1, 0, 0, 0, 4096, 0)


def reply(dev: int, unique: int, payload: bytes = b"", error: int = 0) -> None:
    os.write(dev, OUT_HEADER.pack(OUT_HEADER.size + len(payload), -error, unique) + payload)


def serve(dev: int, log: Path, stop: int) -> None:
    """Answer the kernel until `stop` (a pipe: stdin, or SIGTERM's wake-up) is readable or the mount goes."""
    while True:
        ready, _, _ = select.select([dev, stop], [], [])
        if stop in ready:
            return
        try:
            request = os.read(dev, 1 << 20 | 4096)
        except OSError:  # ENODEV: unmounted
            return
        answer(dev, request, log)


def answer(dev: int, request: bytes, log: Path) -> None:
    _, opcode, unique, node, uid, _gid, pid, _, _ = IN_HEADER.unpack_from(request)
    body = request[IN_HEADER.size :]
    if opcode in NO_REPLY:
        return
    if opcode == FUSE_INIT:
        _major, minor = struct.unpack_from("<II", body)
        # major, minor, max_readahead, flags, max_background, congestion_threshold, max_write, time_gran,
        # max_pages, map_alignment, flags2, max_stack_depth, unused[6]
        init = struct.pack("<IIIIHHIIHHII24x", 7, min(minor, 31), 0, 0, 16, 12, 65536, 1, 16, 0, 0, 0)
        reply(dev, unique, init)
    elif opcode == FUSE_LOOKUP:
        if node == ROOT_ID and body.rstrip(b"\0") == NAME:
            reply(dev, unique, struct.pack("<QQQQII", FILE_ID, 0, 0, 0, 0, 0) + attr(FILE_ID))
        else:
            reply(dev, unique, error=ENOENT)
    elif opcode == FUSE_GETATTR:
        reply(dev, unique, struct.pack("<QII", 0, 0, 0) + attr(node))
    elif opcode == FUSE_OPEN:
        reply(dev, unique, struct.pack("<QIi", 0, 0, 0))  # (not FOPEN_NOFLUSH: every close flushes)
    elif opcode == FUSE_FLUSH:
        answered = uid != 0
        with log.open("a") as f:
            f.write(f"flush {uid} {pid} {'answered' if answered else 'held'}\n")
        if answered:
            reply(dev, unique)
    elif opcode in (FUSE_RELEASE, FUSE_DESTROY):
        reply(dev, unique)
    else:
        reply(dev, unique, error=ENOSYS)


def main(mountpoint: str, log: str) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    dev = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    options = f"fd={dev},rootmode=40000,user_id=0,group_id=0,allow_other".encode()
    if libc.mount(b"vmsandbox-standin", mountpoint.encode(), b"fuse", MS_NOSUID | MS_NODEV, options) != 0:
        raise OSError(ctypes.get_errno(), "mount fuse")
    woken, wake = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake)
    signal.signal(signal.SIGTERM, lambda *_: None)
    print("ready", flush=True)
    try:
        serve(dev, Path(log), woken)
    finally:
        os.close(dev)  # the last reference: every request still waiting fails, and whatever hung on it goes on
        libc.umount2(mountpoint.encode(), MNT_DETACH)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
