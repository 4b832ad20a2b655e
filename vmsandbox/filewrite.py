"""Writing files of ours safely: made ours before another program writes into them, or replaced whole in one
rename (a reader, or a crash, sees the old content or the new, never a part); one writer at a time, by an flock
waited for a bounded while; and copies of a file another process may still be writing (a session's disk, its
QEMU's), no larger than it was when the copy began, nor than the host made it."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import os
import shutil
import stat
import time
from pathlib import Path

from vmsandbox import pids
from vmsandbox.errors import VmsandboxError

CHUNK = 1 << 30  # bytes a copy asks the kernel for at a time
COPY_SLACK = 16 << 20  # bytes a copy takes past what its source had allocated when opened (copy_sparse)


def own_file(path: Path, *, truncate: bool = False) -> None:
    """Make `path` ours (0600) before root writes into it: virtlogd a VM's serial console, libvirtd a saved
    memory file. A file they made would be root's, 0600, which an unprivileged owner could not read back."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_TRUNC if truncate else 0)
    os.close(os.open(path, flags, 0o600))


def write_atomically(path: Path, text: str | bytes, *, mode: int = 0o600) -> None:
    """Write text through a temporary file beside path and one rename: a reader (or a crash) sees the old
    content or the new, never a part of it. `mode` is the new file's, whatever the umask (vmsandbox runs under
    077): private by default; 0o644 for what other accounts read (a template's metadata)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as f:
            f.write(text)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def locked_within(fd: int, seconds: float | None, *, poll: float = 0.1) -> bool:
    """An exclusive flock on `fd`, taken within `seconds` (None: however long it takes; 0: one try). False: another
    held it all that while."""
    deadline = None if seconds is None else time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(poll)
        else:
            return True


def copy_sparse(source: Path, dest: Path, *, most: int | None = None) -> int:
    """`dest` made anew (0600, nothing of `source`'s owner, mode or extended attributes: libvirt's record of who
    uses a disk; written under a name of its own, then renamed over `dest`) with `source`'s data, its holes left
    holes. `source` may be a file a running process still writes (a session's QEMU its disk, which its guest may
    have taken over), which also sets its size and what it counts as allocated: what is copied is bounded by what
    the file held when it was opened — as far as its size then, and no more bytes than it had allocated then
    (COPY_SLACK aside), however it grows, extends or moves its data meanwhile — and by `most`, the size the host
    gave it (a raw disk's; a qcow2 image's largest file), whatever it claims; the room for that is looked for
    first. `source` must be a regular file, and not a symbolic link. The bytes copied."""
    try:
        src = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)  # (a FIFO: not waited on)
    except OSError as exc:
        if exc.errno == errno.EWOULDBLOCK:
            raise VmsandboxError(f"{source} is held by a lease of another process (its session's QEMU?)") from exc
        raise VmsandboxError(f"cannot read {source}: {exc.strerror}") from exc
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.copy")
    try:
        _sweep_killed(dest)
        info = _copyable(src, source, dest.parent, most)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            dst = os.open(tmp, flags, 0o600)
        except FileExistsError:  # left by a copy of a process of this pid that was killed: ours to replace
            tmp.unlink()
            dst = os.open(tmp, flags, 0o600)
        try:
            os.fchmod(dst, 0o600)
            end, held = _bounds(info, most)
            copied = copy_data(src, dst, end, str(source), most=held + COPY_SLACK)
            os.ftruncate(dst, end)  # (a hole at its end)
        finally:
            os.close(dst)
        tmp.replace(dest)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):  # (no room left after all, a name in the way)
            raise VmsandboxError(
                f"copying {source} to {dest} failed: {exc.strerror or exc}", hint=f"is there room in {dest.parent}?"
            ) from exc
        raise
    finally:
        os.close(src)
    return copied


def _sweep_killed(dest: Path) -> None:
    """The temporary files of copies to `dest` whose process is gone (one killed halfway leaves its part)."""
    for left in dest.parent.glob(f".{glob.escape(dest.name)}.*.copy"):
        pid = left.name[len(dest.name) + 2 : -len(".copy")]
        if pid.isdigit() and pids.process_start(int(pid)) is None:  # (no such process)
            with contextlib.suppress(OSError):
                left.unlink()


def _bounds(info: os.stat_result, most: int | None) -> tuple[int, int]:
    """How far a file is copied, and how many of its bytes at most: its size and its allocated bytes when it was
    opened, neither past `most`."""
    end, held = info.st_size, info.st_blocks * 512
    return (end, held) if most is None else (min(end, most), min(held, most))


def _copyable(src: int, source: Path, into: Path, most: int | None) -> os.stat_result:
    """The file open at `src`, if it is a regular file whose allocated bytes (up to `most`) `into` has room for."""
    info = os.fstat(src)
    if not stat.S_ISREG(info.st_mode):
        raise VmsandboxError(f"{source} is not a regular file: it is not copied")
    need, free = _bounds(info, most)[1], shutil.disk_usage(into).free
    if need > free:
        raise VmsandboxError(
            f"copying {source} needs {need / 1024**3:.1f} GiB that {into} has not ({free / 1024**3:.1f} GiB free)",
            hint="free space there (`vmsandbox rm --stale`, `vmsandbox rm` of sessions you no longer need)",
        )
    return info


def copy_data(src: int, dst: int, end: int, what: str, *, most: int | None = None) -> int:
    """The data of the file open at `src` up to `end` into `dst` at the same offsets, in the kernel (copy_file_range:
    a reflink where the file system can; sendfile between file systems); its holes are skipped, so they stay holes
    in a new `dst`. Raises (`what` names the file) rather than copy more than `most` bytes, and where `src` is
    found shorter than `end` at the end (a file cut short and grown back meanwhile may pass). The bytes copied."""
    copied, at, across = 0, 0, False
    while at < end:
        try:
            data = os.lseek(src, at, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
            break  # nothing but a hole to its end
        hole = min(os.lseek(src, data, os.SEEK_HOLE), end)
        while data < hole:
            count = min(hole - data, CHUNK)
            if most is not None and copied + count > most:
                raise VmsandboxError(
                    f"{what} grew while it was copied: it held {most - COPY_SLACK:,} bytes when the copy began, "
                    "and was not copied further (the process that writes it moved or added data meanwhile)"
                )
            if not across:
                try:
                    n = os.copy_file_range(src, dst, count, data, data)
                except OSError as exc:
                    if exc.errno not in (errno.EXDEV, errno.EOPNOTSUPP, errno.EINVAL):
                        raise
                    across = True  # (refused before a byte moved)
            if across:
                os.lseek(dst, data, os.SEEK_SET)
                n = os.sendfile(dst, src, data, count)
            if n == 0:
                break  # it got shorter
            data += n
            copied += n
        at = hole
    if os.fstat(src).st_size < end:
        raise VmsandboxError(f"{what} got shorter while it was copied: it was changed meanwhile")
    return copied
