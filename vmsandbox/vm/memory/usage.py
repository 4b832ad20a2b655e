"""What a VM's process takes of this machine's memory, read from /proc/PID/smaps_rollup: resident (RSS), and
proportional (PSS: a page shared with N processes counts 1/N), of which shared with another process and private
to it. A session that maps its template's memory shares every page of it that it never wrote."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from vmsandbox.vm.memory import foreign, sealed

PROC = Path("/proc")
LIBVIRT_PIDS = Path("/run/libvirt/qemu")  # where the system libvirtd's QEMU driver keeps each domain's pid file
KIB_PER_MIB = 1024
MIB = 1024 * 1024
START_SLACK = 2.0  # the boot time's whole seconds, and libvirt writing the pid file after QEMU started
DOMAINS = "vmsandbox-"  # the name of every session's domain starts so (session.record.DOMAIN_PREFIX)


@dataclass(frozen=True)
class Usage:
    rss_mib: int
    pss_mib: int
    shared_mib: int  # resident pages another process maps too (the template's, where it maps them)
    private_mib: int  # resident pages only this process maps
    # its anonymous pages (what it wrote of the guest's RAM, its own heap and code cache): what ending it gives back,
    # where the private pages of a shared file it alone maps stay with the file's holder
    anonymous_mib: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "rss_mib": self.rss_mib,
            "pss_mib": self.pss_mib,
            "shared_mib": self.shared_mib,
            "private_mib": self.private_mib,
            "anonymous_mib": self.anonymous_mib,
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

    private = mib("Private_Clean", "Private_Dirty")
    return Usage(mib("Rss"), mib("Pss"), mib("Shared_Clean", "Shared_Dirty"), private, mib("Anonymous"))


def qemu_pid(domain: str, pids: Path | None = None, proc: Path = PROC) -> int | None:
    """The pid of the QEMU of the system libvirt's running domain `domain` (None: no pid file, or a stale one)."""
    pidfile = (pids or LIBVIRT_PIDS) / f"{domain}.pid"
    try:
        pid = int(pidfile.read_text().strip())
        argv = (proc / str(pid) / "cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    named = any(a.startswith(f"guest={domain},".encode()) or a == f"guest={domain}".encode() for a in argv)
    if not (named or _started_before(pid, pidfile, proc)):
        return None  # the pid is another process's now
    return pid


def _started_before(pid: int, pidfile: Path, proc: Path) -> bool:
    """Whether process `pid` started before libvirt wrote `pidfile` (a pid reused later starts later): by the
    kernel's start time, which a process cannot change — its command line it can (a QEMU its guest took over
    that rewrites it is still its domain's, for the memory guard and the reservation)."""
    try:
        ticks = int((proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(
            int(line.split()[1]) for line in (proc / "stat").read_text().splitlines() if line.startswith("btime ")
        )
        written = pidfile.stat().st_mtime
    except (OSError, ValueError, IndexError, StopIteration):
        return False
    return boot + ticks / os.sysconf("SC_CLK_TCK") <= written + START_SLACK


def of_domain(domain: str, pids: Path | None = None, proc: Path = PROC) -> Usage | None:
    """The memory the QEMU of the system libvirt's running domain `domain` takes now (None: no pid file, or a
    stale one, or not ours to read)."""
    pid = qemu_pid(domain, pids, proc)
    return None if pid is None else of_process(pid, proc)


def footprint(domains: Iterable[str], pids: Path | None = None, proc: Path = PROC) -> int | None:
    """What one running session takes of this machine now, typically: the median PSS of the QEMUs of the system
    libvirt's running `domains` (None: none can be read)."""
    found = sorted(u.pss_mib for u in (of_domain(d, pids, proc) for d in domains) if u is not None)
    return found[len(found) // 2] if found else None


@dataclass(frozen=True)
class SharedFile:
    """A sealed memory file (a template's, or a fork's) that a QEMU maps as its guest's RAM, shared with every
    other session that maps it."""

    device: int
    inode: int
    size_mib: int
    holes_mib: int  # what it holds no page for yet: see `reserved_mib`

    @property
    def key(self) -> tuple[int, int]:
        return self.device, self.inode


def memory_files(pid: int) -> list[SharedFile]:
    """Every memory file of ours (by its name) that process `pid` holds open, as root's look helper sees it
    (vm.memory.foreign: root's own process never holds what a QEMU hands it); what it skipped is said there."""
    return _shared(foreign.look(pid, f"QEMU pid {pid}").found)


def seen_files(pid: int) -> list[SharedFile] | None:
    """The memory files of ours QEMU `pid` holds, all of them; None where root could not see them all (its look
    skipped something, or was not made: vm.memory.foreign): a caller assumes the worst."""
    seen = foreign.look(pid, f"QEMU pid {pid}")
    return None if seen.blind else _shared(seen.found)


def _shared(found: Iterable[foreign.Memfd]) -> list[SharedFile]:
    return [SharedFile(m.device, m.inode, m.size // MIB, max(m.size - m.blocks * 512, 0) // MIB) for m in found]


def shared_file(domain: str, pids: Path | None = None, proc: Path = PROC) -> SharedFile | None:
    """The shared memory file the QEMU of running domain `domain` maps (None: its memory is its own, or it runs no
    more)."""
    pid = qemu_pid(domain, pids, proc)
    found = [] if pid is None else memory_files(pid)
    return found[0] if found else None


def _qemus(pids: Path | None, proc: Path) -> list[int]:
    """The pids of the QEMUs of the running vmsandbox domains."""
    found = []
    with contextlib.suppress(OSError):
        for pidfile in sorted((pids or LIBVIRT_PIDS).glob(f"{DOMAINS}*.pid")):
            pid = qemu_pid(pidfile.name.removesuffix(".pid"), pids, proc)
            if pid is not None:
                found.append(pid)
    return found


def shared_files(pids: Path | None = None, proc: Path = PROC) -> dict[tuple[int, int], SharedFile]:
    """The shared memory files the QEMUs of the running vmsandbox domains hold, by (device, inode), each once (those
    root could see: `mapped_keys` says whether it saw them all)."""
    return {f.key: f for pid in _qemus(pids, proc) for f in memory_files(pid)}


def mapped_keys(pids: Path | None = None, proc: Path = PROC) -> set[tuple[int, int]] | None:
    """The (device, inode) of every memory file the QEMUs of the running vmsandbox domains hold; None where root could
    not see all a QEMU holds (it may map any file)."""
    mapped: set[tuple[int, int]] = set()
    for pid in _qemus(pids, proc):
        files = seen_files(pid)
        if files is None:
            return None
        mapped.update(f.key for f in files)
    return mapped


@dataclass(frozen=True)
class HeldFiles:
    """The files root's holders hold, as root's looks saw them: each seen file's holes (MiB) by (device, inode); and,
    for each holder root could not look at (one a process of QEMU's account tampered with), its file's recorded
    size, all of it holes at worst — never nothing."""

    seen: dict[tuple[int, int], int]
    unseen: tuple[int, ...] = ()

    def holes_of(self, files: list[SharedFile] | None) -> int:
        """What a save of the session whose QEMU holds `files` reads in of a held file's holes, at worst (None: root
        could not see what it holds: any held file). A file no holder of root's holds counts nothing (a QEMU may
        make up a memfd of any size), unless a holder root could not see may hold it: then at most that size."""
        unseen = max(self.unseen, default=0)
        if files is None:
            return max([*self.seen.values(), unseen], default=0)
        holes = [self.seen[f.key] if f.key in self.seen else min(f.holes_mib, unseen) for f in files]
        return max(holes, default=0)

    def owed(self, mapped: set[tuple[int, int]] | None) -> int:
        """What the held files' holes take back at the sessions' next saves: each file a running QEMU maps, once (None:
        a QEMU root could not see may map any), and every file root could not see, whole."""
        seen = [holes for key, holes in self.seen.items() if mapped is None or key in mapped]
        return sum(seen) + sum(self.unseen)


def held_files(holders: Iterable[Path] | None = None) -> HeldFiles:
    """The files root's holders hold (`holders`: where each says where it holds its file, by default
    paths.memory_holders_dir()), as root's looks see them: the only memory files whose holes count. A holder that
    ended holds nothing."""
    seen: dict[tuple[int, int], int] = {}
    unseen: list[int] = []
    for entry in sealed.holder_entries() if holders is None else holders:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            held = sealed.Held.of(json.loads(entry.read_text()))
            found = held.look()
            if isinstance(found, foreign.Memfd):
                seen[found.key] = max(found.size - found.blocks * 512, 0) // MIB
            elif found is not None:  # (a holder root could not look at: its file is all holes, at worst)
                unseen.append(-(-held.size // MIB))
    return HeldFiles(seen, tuple(unseen))


def reserved_mib(holders: Iterable[Path] | None = None, pids: Path | None = None, proc: Path = PROC) -> int:
    """The memory this machine owes the shared files its sessions map: their holes. A save of any session that maps
    one (`stop`, a checkpoint, a fork) reads every page, and tmpfs gives each hole read through a private mapping a
    page of its own, zeros kept for good — once per file, up to its size. Not available, though the kernel counts
    it so. Only files root's holders hold count (`holders`: as for `held_files`), each at most its size, once, and
    only while a session's QEMU maps it: a file a QEMU made up counts nothing. What root cannot see counts at its
    worst (HeldFiles.owed): a QEMU it cannot look at maps every held file, a holder it cannot look at holds a file
    of its recorded size, all holes."""
    return held_files(holders).owed(mapped_keys(pids, proc))


def held_keys(holders: Iterable[Path] | None = None) -> set[tuple[int, int]]:
    """The (device, inode) of every file root's holders hold that root could look at (`holders`: as for
    `reserved_mib`)."""
    return set(held_files(holders).seen)
