"""The memory guard: when this machine runs short of memory, kept sessions are stopped to disk, never killed.

Sessions of one template share the pages they never wrote, so this machine admits more of them than their memory
adds up to (session.place.room). Should they all wake and write, the kernel's OOM killer would end a QEMU: a
session gone, with whatever its guest had not synced. The guard reads every second what this machine has
available — the kernel's MemAvailable less what is reserved: the holes of the memory files sessions share, which
the next save of one of them reads in (vm.memory.usage.reserved_mib) — and under its floor (half the keep_free
admission leaves: 512 MiB by default) it first gives back the template copies no session maps (a warm start
seals a fresh one when it needs it), then stops kept sessions as `vmsandbox stop` does (memory and devices saved
beside the disks: nothing lost; `vmsandbox start` resumes them), until the floor holds again.

The session holding most memory of its own goes first: its stop frees most, and it is the likeliest to have made
the shortage (a guest cannot look smaller than the anonymous pages the host counts of its QEMU; idleness, which
a guest could feign, is not asked). Only kept sessions no command is attached to are its to stop (a `run --keep`,
a fan-out's worker, the API's sandboxes belong to their command while it runs). One that another command holds
(its lock: never waited for), whose guest does not flush within FLUSH_TIMEOUT, or whose stop fails otherwise, is
passed over for the next and rests REST seconds: the guard never waits on one guest while the machine runs out.
One whose save would read in more of its shared file's holes than the kernel has is not stopped (that save would
be the OOM). Each stop says why in the session's record (`inspect`; `start` says it again) and in the guard's log
(paths.GUARD_LOG, in the sessions directory). What it reads of a holder's or a QEMU's descriptors is read by root's
look helper (vm.memory.foreign), never in the guard's own process: a process of QEMU's account that puts a file
whose close never ends there holds up a keeper of the helper's, never the guard; what was passed over is said in
its log, once. What it cannot see it takes at its worst, never as nothing: a holder it cannot look at holds a file
of its recorded size, all holes, reserved whole; a QEMU it cannot look at maps every held file (all are reserved,
and its own save would read in the largest).

One guard per sessions directory (a lock held for its life; a second one ends at once), root's: only root may
read every QEMU's memory and stop every account's sessions. A session root starts on this machine starts it
unless it runs (session.place.local.start.guarded); it ends once no session of its directory has run for
IDLE_EXIT seconds. Sessions on other hosts are not guarded here: their memory is their host's.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from vmsandbox import filewrite, paths, pids, ui
from vmsandbox.errors import VmsandboxError
from vmsandbox.session.moments import suspend
from vmsandbox.session.place.hostspec import DEFAULT_KEEP_FREE_MIB
from vmsandbox.session.record import DOMAIN_PREFIX, Record
from vmsandbox.vm import node
from vmsandbox.vm.memory import foreign, holders, usage

FLOOR_MIB = DEFAULT_KEEP_FREE_MIB // 2
LOCK = "guard.lock"  # in the sessions directory, beside paths.GUARD_PID and paths.GUARD_LOG
INTERVAL = 1.0
IDLE_EXIT = 60.0  # no session of its directory ran this long: the guard ends (the next session starts one)
IDLE_LOOK = 10.0  # how often it asks whether any does
# a guest's flush before its save, at most: one that holds it longer is passed over for the next session, and
# rests that long before it is asked again (the guard never waits on one guest while the machine runs out)
FLUSH_TIMEOUT = 15.0
SAVE_DEADLINE = 60.0  # a save not ended by then (a QEMU that holds it) is aborted: the session rests, others go on
REST = 300.0
HOLES_MARGIN_MIB = 128  # a session whose save would read in more holes than the kernel has, less this: passed over
SAY_EVERY = 60.0  # the same trouble (nothing to stop, a failed round) said this often
# a guard started while another ends (its pid file gone, its lock not yet let go) waits this long for the lock
LOCK_PATIENCE = 2.0
OOM_SCORE_ADJ = -900


@dataclass(frozen=True)
class Held:
    """A running session of this machine and the memory its QEMU holds of its own."""

    name: str
    own_mib: int  # what stopping it gives back: its QEMU's anonymous pages (usage.Usage.anonymous_mib)
    # stopping it is the guard's to do: kept (started with --keep, or made by `create`) and no command of a person's
    # attached to it (`run --keep`, a fan-out's worker, the API: record.owner_alive)
    stoppable: bool
    holes_mib: int = 0  # the holes of the shared file it maps, which its save reads in (usage.SharedFile)


def order(held: Iterable[Held]) -> list[Held]:
    """The sessions the guard may stop, in the order it stops them: stoppable ones, most memory of their own
    first."""
    return sorted((h for h in held if h.stoppable), key=lambda h: (-h.own_mib, h.name))


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
    held = usage.held_files()  # the holes of these alone: a QEMU may make up a memfd of any size, to be passed over
    for record in _records():
        pid = usage.qemu_pid(record.domain)
        used = None if pid is None else usage.of_process(pid)
        if pid is not None and used is not None:
            holes = held.holes_of(usage.seen_files(pid))  # (one root cannot see: the worst held file)
            stoppable = record.keep and not record.owner_alive()
            found.append(Held(record.name, used.anonymous_mib, stoppable, holes))
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


def relieve(
    floor_mib: int = FLOOR_MIB, *, among: Iterable[str] | None = None, resting: dict[str, float] | None = None
) -> list[str]:
    """Stop sessions (of `among`, when given) while this machine has less than `floor_mib` available; the ones
    stopped. It looks again after each stop. One that could not be stopped rests REST seconds (`resting`: name ->
    until when, on the monotonic clock, kept by the caller from round to round)."""
    wanted = None if among is None else set(among)
    resting = {} if resting is None else resting
    stopped: list[str] = []
    tried: set[str] = set()
    given_back = among is not None  # (told which sessions it may stop: nothing else is touched)
    while True:
        available = available_mib()
        if available is None or available >= floor_mib:
            return stopped
        if not given_back:  # memory no session uses goes before any session is stopped
            given_back = True
            if _give_back():
                continue
        now = time.monotonic()
        held = [
            h for h in order(running())
            if (wanted is None or h.name in wanted) and h.name not in tried and resting.get(h.name, 0.0) <= now
        ]  # fmt: skip
        if not held:
            return stopped
        h = held[0]
        tried.add(h.name)
        kernel = kernel_available_mib() or 0
        if h.holes_mib >= kernel - HOLES_MARGIN_MIB:
            ui.warn(
                f"{_now()} not stopping {h.name}: its save would read in {h.holes_mib} MiB of the memory file it "
                f"shares, and the kernel has {kernel} MiB"
            )
            continue
        ui.warn(f"{_now()} {available} MiB available (floor {floor_mib} MiB): stopping {h.name}")
        why = (
            f"stopped by the memory guard at {_now()}: this machine had {available} MiB of memory available, "
            f"under its floor of {floor_mib} MiB"
        )
        try:
            _stop(h.name, why)
        except Exception as exc:  # noqa: BLE001 - busy, gone, a guest that holds its flush, a save that failed: the next
            said = exc.message if isinstance(exc, VmsandboxError) else f"{type(exc).__name__}: {exc}"
            ui.warn(f"{_now()} could not stop {h.name} (it rests {REST:.0f} s): {said}")
            resting[h.name] = time.monotonic() + REST
            continue
        stopped.append(h.name)
        ui.info(f"{_now()} {h.name} stopped (`vmsandbox start {h.name}` resumes it)")


def _give_back() -> bool:
    """The template copies no session maps given back (holders.give_back), each said: whether any was."""
    try:
        freed = holders.give_back()
    except (OSError, VmsandboxError) as exc:
        ui.warn(f"{_now()} could not give back the template copies no session maps: {exc}")
        return False
    for where, mib in freed:
        ui.warn(f"{_now()} gave back {mib} MiB: the copy of {where}'s memory no session maps")
    return bool(freed)


def _now() -> str:
    return f"{datetime.now():%Y-%m-%d %H:%M:%S}"


def _stop(name: str, why: str) -> None:
    suspend.stop(name, why=why, flush_timeout=FLUSH_TIMEOUT, never_wait=True, save_deadline=SAVE_DEADLINE)


def watch(floor_mib: int = FLOOR_MIB) -> None:
    """Relieve the machine whenever it is short, until no session of this directory has run for IDLE_EXIT. A
    round is one read of /proc/meminfo; what is reserved (every QEMU's descriptors read) is read again every
    IDLE_LOOK seconds, and whenever the machine looks short with the last figure."""
    last_seen, last_look, said, reserved = time.monotonic(), -IDLE_LOOK, -SAY_EVERY, 0
    resting: dict[str, float] = {}
    while True:
        now = time.monotonic()
        try:
            if now - last_look >= IDLE_LOOK:
                last_look, reserved = now, usage.reserved_mib()
                if next(_records(), None) is not None:
                    last_seen = now
                elif now - last_seen >= IDLE_EXIT:
                    return
            kernel = kernel_available_mib()
            if kernel is not None and kernel - reserved < floor_mib:
                stopped = relieve(floor_mib, resting=resting)
                available = available_mib()
                if not stopped and available is not None and available < floor_mib and now - said >= SAY_EVERY:
                    said = now  # said once a minute, not every round
                    ui.warn(f"{_now()} {available} MiB available, and no session the guard may stop now")
        except Exception as exc:  # noqa: BLE001 - the guard outlives one bad round; the log says what it was
            if now - said >= SAY_EVERY:
                said = now
                ui.warn(f"{_now()} the memory guard's round failed: {type(exc).__name__}: {exc}")
        finally:
            for skipped in foreign.unsaid():  # a holder or QEMU root's look passed over (vm.memory.foreign): once
                ui.warn(f"{_now()} {skipped}")
        time.sleep(INTERVAL)


def said(local: bool) -> str:
    """What `host ls` says of the memory guard of a host (`local`: this machine)."""
    if not local:
        return "none there: the guard watches this machine's memory and sessions only"
    if os.geteuid() != 0:
        return "none for this account: it is root's (it reads every QEMU's memory), and guards root's sessions"
    doing = f"stops kept sessions to disk when less than {FLOOR_MIB} MiB is available"
    if pids.runs(paths.sessions_dir() / paths.GUARD_PID, paths.GUARD_MODULE):
        return f"watching: {doing}"
    return f"starts with the next session: then {doing}"


def lock(patience: float = 0.0) -> int | None:
    """The guard's lock of this sessions directory, held (None: another guard held it for `patience` seconds);
    its pid file written."""
    root = paths.sessions_dir()
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    if not filewrite.locked_within(fd, patience):
        os.close(fd)
        return None
    _say_where()
    return fd


def _say_where() -> None:
    """The guard's pid file: "PID START", as pids.runs reads it."""
    filewrite.write_atomically(
        paths.sessions_dir() / paths.GUARD_PID, f"{os.getpid()} {pids.process_start(os.getpid())}\n"
    )


def main() -> int:
    fd = lock(patience=LOCK_PATIENCE)
    if fd is None:
        return 0
    with contextlib.suppress(OSError):  # it has to run just when memory is short: the OOM killer's last choice
        Path("/proc/self/oom_score_adj").write_text(f"{OOM_SCORE_ADJ}\n")
    ui.info(f"{_now()} the memory guard of {paths.sessions_dir()} watches (pid {os.getpid()})")
    try:
        while True:
            watch()
            # a session started while it decided to end found its pid file and started none: with the file gone,
            # the next one starts a guard; this one looks once more before it goes
            (paths.sessions_dir() / paths.GUARD_PID).unlink(missing_ok=True)
            if next(_records(), None) is None:
                break
            _say_where()
    finally:
        os.close(fd)
    ui.info(f"{_now()} no session ran for {IDLE_EXIT:.0f} s: the memory guard ends")
    return 0


if __name__ == "__main__":
    sys.exit(main())
