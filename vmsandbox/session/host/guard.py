"""The memory guard: when this machine runs short of memory, kept sessions are stopped to disk, never killed.

Sessions of one template share the pages they never wrote, so this machine admits more of them than their memory
adds up to (session.place.room). Should they all wake and write, the kernel's OOM killer would end a QEMU: a
session gone, with whatever its guest had not synced. The guard reads every second what this machine has
available — the kernel's MemAvailable less what is reserved: the holes of the memory files sessions share, which
the next save of one of them reads in (vm.memory.usage.reserved_mib) — and under its floor (half the keep_free
admission leaves: 512 MiB by default) it stops kept sessions as `vmsandbox stop` does (memory and devices saved
beside the disks: nothing lost; `vmsandbox start` resumes them), until the floor holds again.

The session holding most memory of its own goes first: its stop frees most, and it is the likeliest to have made
the shortage (a guest cannot look smaller than the private pages the host counts of its QEMU; idleness, which a
guest could feign, is not asked). A session of a running `run` belongs to that command and is never stopped; one
another command holds (its lock), or whose guest does not flush within FLUSH_TIMEOUT, is passed over for the
next: the guard never waits on one guest while the machine runs out. Each stop says why in the session's record
(`inspect`; `start` says it again) and in the guard's log (paths.GUARD_LOG, in the sessions directory).

One guard per sessions directory (a lock held for its life; a second one ends at once), root's: only root may
read every QEMU's memory and stop every account's sessions. A session root starts on this machine starts it
unless it runs (session.place.local.start.guarded); it ends once no session of its directory has run for
IDLE_EXIT seconds. Sessions on other hosts are not guarded here: their memory is their host's.
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime

from vmsandbox import paths, pids, ui
from vmsandbox.errors import VmsandboxError
from vmsandbox.session.moments import suspend
from vmsandbox.session.place.hostspec import DEFAULT_KEEP_FREE_MIB
from vmsandbox.session.record import DOMAIN_PREFIX, Record
from vmsandbox.vm import node
from vmsandbox.vm.memory import usage

FLOOR_MIB = DEFAULT_KEEP_FREE_MIB // 2
LOCK = "guard.lock"  # in the sessions directory, beside paths.GUARD_PID and paths.GUARD_LOG
MODULE = "vmsandbox.session.host.guard"  # what the local place starts (session.place.local.start.guarded)
INTERVAL = 1.0
IDLE_EXIT = 60.0  # no session of its directory ran this long: the guard ends (the next session starts one)
IDLE_LOOK = 10.0  # how often it asks whether any does
# a guest's flush before its save, at most (a guest that holds it longer is passed over this round: the guard
# never waits on one guest while the machine runs out)
FLUSH_TIMEOUT = 15.0
STUCK_EVERY = 60.0  # short of memory with nothing it may stop: said this often


@dataclass(frozen=True)
class Held:
    """A running session of this machine and the memory its QEMU holds of its own."""

    name: str
    private_mib: int
    kept: bool  # started with --keep (or made by `create`): `stop` may stop it


def order(held: Iterable[Held]) -> list[Held]:
    """The sessions the guard may stop, in the order it stops them: kept ones, most memory of their own first."""
    return sorted((h for h in held if h.kept), key=lambda h: (-h.private_mib, h.name))


def kernel_available_mib() -> int | None:
    """The kernel's MemAvailable (None: it does not say)."""
    try:
        kib = node.mem_available_kib(usage.PROC.joinpath("meminfo").read_text())
    except OSError:
        return None
    return None if kib is None else kib // usage.KIB_PER_MIB


def available_mib() -> int | None:
    """This machine's MemAvailable less what the holes of the shared memory files its sessions map take back at
    their next save (usage.reserved_mib: a stop that reads them in then leaves what it frees of its own); None:
    the kernel does not say."""
    kernel = kernel_available_mib()
    return None if kernel is None else kernel - usage.reserved_mib()


def running() -> list[Held]:
    """The sessions of this sessions directory whose QEMU runs on this machine now."""
    found = []
    for record in _records():
        used = usage.of_domain(record.domain)
        if used is not None:
            found.append(Held(record.name, used.private_mib, record.keep))
    return found


def _records() -> Iterator[Record]:
    """The sessions of this sessions directory that this machine's libvirt runs a domain of."""
    for domain in _domains():
        try:
            record = Record.load(domain.removeprefix(DOMAIN_PREFIX))
        except VmsandboxError:
            continue  # another directory's session, a reader VM, one being removed
        if record.domain == domain:
            yield record


def _domains() -> list[str]:
    try:
        pids = sorted(usage.LIBVIRT_PIDS.glob(f"{DOMAIN_PREFIX}*.pid"))
    except OSError:
        return []
    return [p.name.removesuffix(".pid") for p in pids]


def relieve(floor_mib: int = FLOOR_MIB, *, among: Iterable[str] | None = None) -> list[str]:
    """Stop sessions (of `among`, when given) while this machine has less than `floor_mib` available; the ones
    stopped. It looks again after each stop."""
    wanted = None if among is None else set(among)
    stopped: list[str] = []
    tried: set[str] = set()
    while True:
        available = available_mib()
        if available is None or available >= floor_mib:
            return stopped
        held = [h for h in order(running()) if (wanted is None or h.name in wanted) and h.name not in tried]
        if not held:
            return stopped
        name = held[0].name
        tried.add(name)
        why = (
            f"stopped by the memory guard at {_now()}: this machine had {available} MiB of memory available, "
            f"under its floor of {floor_mib} MiB"
        )
        ui.warn(f"{_now()} {available} MiB available (floor {floor_mib} MiB): stopping {name}")
        try:
            _stop(name, why)
        except VmsandboxError as exc:  # busy (another command holds it), gone, or its save failed: the next one
            ui.warn(f"could not stop {name}: {exc.message}")
            continue
        stopped.append(name)
        ui.info(f"{name} stopped (`vmsandbox start {name}` resumes it)")


def _now() -> str:
    return f"{datetime.now():%Y-%m-%d %H:%M:%S}"


def _stop(name: str, why: str) -> None:
    suspend.stop(name, why=why, flush_timeout=FLUSH_TIMEOUT)


def watch(floor_mib: int = FLOOR_MIB) -> None:
    """Relieve the machine whenever it is short, until no session of this directory has run for IDLE_EXIT. A
    round is one read of /proc/meminfo; what is reserved (every QEMU's descriptors read) is read again every
    IDLE_LOOK seconds, and whenever the machine looks short with the last figure."""
    last_seen, last_look, said_stuck, reserved = time.monotonic(), -IDLE_LOOK, -STUCK_EVERY, 0
    while True:
        now = time.monotonic()
        if now - last_look >= IDLE_LOOK:
            last_look, reserved = now, usage.reserved_mib()
            if next(_records(), None) is not None:
                last_seen = now
            elif now - last_seen >= IDLE_EXIT:
                return
        kernel = kernel_available_mib()
        if kernel is not None and kernel - reserved < floor_mib:
            try:
                stopped = relieve(floor_mib)
            except Exception as exc:  # noqa: BLE001 - the guard outlives one bad round; the log says what it was
                ui.warn(f"{_now()} the memory guard's round failed: {exc}")
                stopped = []
            available = available_mib()
            if not stopped and available is not None and available < floor_mib and now - said_stuck >= STUCK_EVERY:
                said_stuck = now  # said once a minute, not every round
                ui.warn(f"{_now()} {available} MiB available, and no session the guard may stop (only kept ones)")
        time.sleep(INTERVAL)


def lock() -> int | None:
    """The guard's lock of this sessions directory, held (None: another guard holds it); its pid file written."""
    root = paths.sessions_dir()
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    paths.write_atomically(root / paths.GUARD_PID, f"{os.getpid()} {pids.process_start(os.getpid())}\n")
    return fd


def main() -> int:
    fd = lock()
    if fd is None:
        return 0
    ui.info(f"{_now()} the memory guard of {paths.sessions_dir()} watches (pid {os.getpid()})")
    try:
        watch()
    finally:
        os.close(fd)
    ui.info(f"{_now()} no session ran for {IDLE_EXIT:.0f} s: the memory guard ends")
    return 0


if __name__ == "__main__":
    sys.exit(main())
