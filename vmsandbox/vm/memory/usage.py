"""What a VM's process takes of this machine's memory, read from /proc/PID/smaps_rollup: resident (RSS), and
proportional (PSS: a page shared with N processes counts 1/N), of which shared with another process and private
to it. A session that maps its template's memory shares every page of it that it never wrote."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
LIBVIRT_PIDS = Path("/run/libvirt/qemu")  # where the system libvirtd's QEMU driver keeps each domain's pid file
KIB_PER_MIB = 1024
MIB = 1024 * 1024
SHARED_PREFIX = "/memfd:vmsandbox-"  # the name of every sealed memory file (vm.memory.sealed.create)


@dataclass(frozen=True)
class Usage:
    rss_mib: int
    pss_mib: int
    shared_mib: int  # resident pages another process maps too (the template's, where it maps them)
    private_mib: int  # resident pages only this process maps

    def as_dict(self) -> dict[str, int]:
        return {
            "rss_mib": self.rss_mib,
            "pss_mib": self.pss_mib,
            "shared_mib": self.shared_mib,
            "private_mib": self.private_mib,
        }


def of_process(pid: int, proc: Path = PROC) -> Usage | None:
    """The memory process `pid` takes now (None: no such process, or not ours to read)."""
    try:
        lines = (proc / str(pid) / "smaps_rollup").read_text().splitlines()[1:]
    except OSError:
        return None
    kib: dict[str, int] = {}
    for line in lines:
        key, _, rest = line.partition(":")
        words = rest.split()
        if len(words) == 2 and words[1] == "kB" and words[0].isdigit():
            kib[key] = int(words[0])
    if "Rss" not in kib or "Pss" not in kib:
        return None

    def mib(*keys: str) -> int:
        return sum(kib.get(k, 0) for k in keys) // KIB_PER_MIB

    return Usage(mib("Rss"), mib("Pss"), mib("Shared_Clean", "Shared_Dirty"), mib("Private_Clean", "Private_Dirty"))


def qemu_pid(domain: str, pids: Path = LIBVIRT_PIDS, proc: Path = PROC) -> int | None:
    """The pid of the QEMU of the system libvirt's running domain `domain` (None: no pid file, or a stale one)."""
    try:
        pid = int((pids / f"{domain}.pid").read_text().strip())
        argv = (proc / str(pid) / "cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    if not any(a.startswith(f"guest={domain},".encode()) or a == f"guest={domain}".encode() for a in argv):
        return None  # the pid is another process's now
    return pid


def of_domain(domain: str, pids: Path = LIBVIRT_PIDS, proc: Path = PROC) -> Usage | None:
    """The memory the QEMU of the system libvirt's running domain `domain` takes now (None: no pid file, or a
    stale one, or not ours to read)."""
    pid = qemu_pid(domain, pids, proc)
    return None if pid is None else of_process(pid, proc)


def footprint(domains: Iterable[str], pids: Path = LIBVIRT_PIDS, proc: Path = PROC) -> int | None:
    """What one running session takes of this machine now, typically: the median PSS of the QEMUs of the system
    libvirt's running `domains` (None: none can be read)."""
    found = sorted(u.pss_mib for u in (of_domain(d, pids, proc) for d in domains) if u is not None)
    return found[len(found) // 2] if found else None


@dataclass(frozen=True)
class SharedFile:
    """The sealed memory file a QEMU maps as its guest's RAM (a template's, or a fork's), shared with every other
    session that maps it."""

    inode: int
    size_mib: int
    holes_mib: int  # what it holds no page for yet: see `shared_file`


def shared_file(domain: str, pids: Path = LIBVIRT_PIDS, proc: Path = PROC) -> SharedFile | None:
    """The shared memory file the QEMU of running domain `domain` maps (None: its memory is its own, or it runs no
    more). Its holes are memory to come: a save of any session that maps it (`stop`, a checkpoint, a fork) reads
    every page, and tmpfs gives each hole read through a private mapping a page of its own, zeros kept for good —
    once per file, up to its size."""
    pid = qemu_pid(domain, pids, proc)
    if pid is None:
        return None
    try:
        fds = list((proc / str(pid) / "fd").iterdir())
    except OSError:
        return None
    for fd in fds:
        try:
            if not str(fd.readlink()).startswith(SHARED_PREFIX):
                continue
            st = fd.stat()
        except OSError:
            continue
        held = st.st_blocks * 512
        return SharedFile(st.st_ino, st.st_size // MIB, max(st.st_size - held, 0) // MIB)
    return None


def shared_files(pids: Path = LIBVIRT_PIDS, proc: Path = PROC) -> dict[int, SharedFile]:
    """The shared memory files the QEMUs of the running domains map, by inode (each once)."""
    found: dict[int, SharedFile] = {}
    with contextlib.suppress(OSError):
        for pidfile in sorted(pids.glob("*.pid")):
            f = shared_file(pidfile.name.removesuffix(".pid"), pids, proc)
            if f is not None:
                found[f.inode] = f
    return found


def reserved_mib(pids: Path = LIBVIRT_PIDS, proc: Path = PROC) -> int:
    """The memory this machine owes the shared files its sessions map: their holes, which the next save of any
    session that maps one reads in (`shared_file`). Not available, though the kernel counts it so."""
    return sum(f.holes_mib for f in shared_files(pids, proc).values())
