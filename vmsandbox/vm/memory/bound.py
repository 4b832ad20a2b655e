"""Each session's growth bounded by the kernel: its QEMU's memory cgroup (the one libvirt made for its domain) held
to the guest's RAM and QEMU's overhead. Admission reserved that much for the session; past it, the kernel takes
memory back from that QEMU first (its page cache, then its pages to swap) and slows it down — it never kills it:
a session killed is work lost, and the memory guard, which stops sessions to disk whole, is the line behind.

So the bound is cgroup v2's memory.high (reclaim and throttle above it, no OOM kill), or on cgroup v1 its soft
limit (memory.soft_limit_in_bytes: reclaimed first when the host runs short). Never a hard limit: measured here
(cgroup v1), a hard limit of RAM + 512 MiB had the kernel kill the QEMU of a guest whose 1,000 connections and
disk writes filled its cgroup with socket buffers and dirty page cache, which v1 does not throttle per cgroup
(its RSS was 1.8 GiB). libvirt's own `<memtune>` is not used either: its hard_limit is such a limit (and
raises the locked-memory limit, which needs CAP_SYS_RESOURCE, which this machine's root lacks).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

# What a session's QEMU may take past its guest's RAM: QEMU itself, its page cache and, under TCG, its translation
# cache (128 MiB: vm.domain.TCG_TB_CACHE_MIB). Measured here: an idle TCG session's QEMU holds ~200 MiB besides its
# guest's pages.
QEMU_OVERHEAD_MIB = 512
CGROUPS = Path("/sys/fs/cgroup")
PROC = Path("/proc")


def limit_mib(memory_mib: int) -> int:
    return memory_mib + QEMU_OVERHEAD_MIB


def cgroup_of(pid: int, proc: Path = PROC, cgroups: Path = CGROUPS) -> tuple[Path, str] | None:
    """The memory cgroup directory of process `pid` and the file that limits it (None: no memory controller)."""
    try:
        lines = (proc / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _id, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):  # cgroup v1
            return cgroups / "memory" / path.lstrip("/"), "memory.soft_limit_in_bytes"
    for line in lines:
        _id, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2's unified hierarchy (mounted at the root, or at unified/ beside v1)
            for base in (cgroups, cgroups / "unified"):
                where = base / path.lstrip("/")
                if (where / "memory.high").exists():
                    return where, "memory.high"
    return None


def limit(pid: int, memory_mib: int, proc: Path = PROC, cgroups: Path = CGROUPS) -> str | None:
    """Limit the memory cgroup of QEMU `pid` to its guest's `memory_mib` and QEMU's overhead. None when done;
    else why not, in words (the session runs unbounded, and says so). Only a cgroup of its own: one other
    processes share (the host's root cgroup, where no libvirt cgroup was made) is never limited."""
    found = cgroup_of(pid, proc, cgroups)
    if found is None:
        return "this host has no memory cgroup for its QEMU"
    where, name = found
    if where in (cgroups / "memory", cgroups, cgroups / "unified") or "machine" not in where.parts:
        return f"its QEMU runs in no cgroup of its own ({where})"
    try:
        (where / name).write_text(str(limit_mib(memory_mib) << 20))
    except OSError as exc:
        return f"its cgroup could not be bounded: {exc.strerror or exc}"
    return None


def limit_of(pid: int, proc: Path = PROC, cgroups: Path = CGROUPS) -> int | None:
    """The limit, in bytes, of QEMU `pid`'s memory cgroup (None: none, or unlimited)."""
    found = cgroup_of(pid, proc, cgroups)
    if found is None:
        return None
    with contextlib.suppress(OSError, ValueError):
        value = (found[0] / found[1]).read_text().strip()
        return None if value == "max" or int(value) >= 1 << 62 else int(value)
    return None
