"""A boot that explains itself: how far the guest got (read from its serial console), whether this host gave
its VM the CPU it needed, and a copy of the console that outlives the failed session.

The console is the guest's own output: it is read bounded, stripped of escape sequences, and only ever
shown escaped (ui.printable); it informs a diagnosis, never a decision.
"""

from __future__ import annotations

import enum
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from vmsandbox import paths

READ_BYTES = 2 * 1024 * 1024  # boot markers come in the first tens of KiB
KEEP_BYTES = 1024 * 1024  # of a failed boot's console: this much of its start and of its end
PANIC = b"Kernel panic - not syncing"
PANIC_BYTES = 64 * 1024  # of the console's end, where a panic is looked for
KEEP_FAILED = 20  # failed boots' consoles kept in the state directory
STARVED_SHARE = 0.5  # QEMU ran less than half of one core's time...
BUSY_LOAD = 1.5  # ...while the host's load per CPU was above this
IDLE_SHARE = 0.05  # QEMU barely ran although the host had room: the guest waits on something
SLOW_AFTER = 45.0  # a boot still waited for after this long is checked (once) for a starved host
# Under TCG a guest kernel very rarely stops early in its boot and never goes on (seen ~1 boot in 300 here,
# silent for the rest of the 300 s timeout; a lost inter-processor interrupt, most likely). No console output
# for this long before systemd starts, when a normal kernel and initramfs print every second or so, is such a
# stall: the VM is reset (the guest starts over in the same QEMU, nothing of it has been used yet).
STALL_MIN, STALL_MAX = 20.0, 60.0  # the stall limit: boot_timeout / 5, within these bounds
RESETS = 2
CONSOLE_TAIL_LINES = 30
CONSOLE_TAIL_BYTES = 64 * 1024  # the guest writes the console: read only its end

# whole sequences, and the halves systemd leaves where it shortens a line in the middle of one ("\x1b[…", "…[0m")
_CSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b\[?[0-9;]*(?=…)|(?<=…)\[?[0-9;]*m")


class Stage(enum.IntEnum):
    FIRMWARE = 0
    KERNEL = 1
    INITRAMFS = 2
    INIT = 3
    IDENTITY = 4
    SSHD = 5

    @property
    def described(self) -> str:
        return _DESCRIBED[self]


_DESCRIBED = {
    Stage.FIRMWARE: "firmware: the kernel printed nothing",
    Stage.KERNEL: "the kernel started; the initramfs did not run",
    Stage.INITRAMFS: "the initramfs ran; systemd did not start",
    Stage.INIT: "systemd started; the session's identity was not applied",
    Stage.IDENTITY: "the session's identity was applied; sshd did not start",
    Stage.SSHD: "sshd started, but did not answer on the forwarded port",
}
# the latest stage first: the first marker found in the console names how far the boot got
_MARKERS: tuple[tuple[Stage, tuple[str, ...]], ...] = (
    (Stage.SSHD, ("Started ssh.service",)),
    (Stage.IDENTITY, ("vmsandbox-boot: identity applied",)),
    (Stage.INIT, ("Welcome to ", "systemd[1]: ")),
    (Stage.INITRAMFS, ("Loading, please wait", "Run /init")),
    (Stage.KERNEL, ("Linux version ",)),
)
_TROUBLE = (
    "Kernel panic",
    "emergency mode",
    "Failed to start",
    "Dependency failed",
    "BUG: ",
    "Oops",
    "soft lockup",
    "self-detected stall",
    "blocked for more than",
    "I/O error",
    "Out of memory",
)


def plain(text: str) -> str:
    """The console without its colour and cursor escape sequences."""
    return _CSI.sub("", text)


def read(console: Path, offset: int = 0) -> str:
    """The start of a console log (from `offset`: where the current boot began), as plain text."""
    try:
        with console.open("rb") as f:
            f.seek(offset)
            return plain(f.read(READ_BYTES).decode(errors="replace"))
    except OSError:
        return ""


def size_of(console: Path) -> int:
    try:
        return console.stat().st_size
    except OSError:
        return 0


def stage_of(text: str) -> Stage:
    for stage, markers in _MARKERS:
        if any(m in text for m in markers):
            return stage
    return Stage.KERNEL if text.strip() else Stage.FIRMWARE


def panicked(console: Path) -> str | None:
    """ "its kernel panicked" when the end of the console says so (a guest that panics spins on; its domain runs),
    else None."""
    try:
        end = _end_of(console, PANIC_BYTES)
    except OSError:
        return None
    return "its kernel panicked (its console says so)" if PANIC in end else None


def _end_of(path: Path, size: int) -> bytes:
    """The last `size` bytes of a file (OSError if it cannot be read)."""
    with path.open("rb") as f:
        f.seek(max(f.seek(0, os.SEEK_END) - size, 0))
        return f.read(size)  # (however much the guest has written since)


def trouble(text: str, limit: int = 5) -> list[str]:
    """Console lines that name a failure (a panic, a unit that failed, a stall), the last `limit`."""
    found = [line.strip() for line in text.splitlines() if any(t in line for t in _TROUBLE)]
    return found[-limit:]


@dataclass(frozen=True)
class Cpu:
    """What the host gave a VM while it booted."""

    seconds: float  # CPU time QEMU used
    wall: float  # time waited
    load: float  # the host's 1-minute load average at the end
    host_cpus: int

    @property
    def share(self) -> float:
        return self.seconds / self.wall if self.wall > 0 else 0.0

    @property
    def starved(self) -> bool:
        return self.share < STARVED_SHARE and self.load > BUSY_LOAD * self.host_cpus

    @property
    def figures(self) -> str:
        return (
            f"QEMU used {self.seconds:.0f} s of CPU in {self.wall:.0f} s ({self.share:.0%} of one core); "
            f"host load {self.load:.1f} on {self.host_cpus} CPU(s)"
        )

    def verdict(self) -> str | None:
        """Why the boot was slow, when the numbers say it: a starved host, or a guest waiting on nothing."""
        if self.starved:
            return f"this host is short of CPU: {self.figures}"
        if self.share < IDLE_SHARE:
            return f"the guest sat idle, waiting on something: {self.figures}"
        return None


@dataclass
class Watch:
    """A boot being waited for: the furthest stage its console shows, and what the host gave it so far."""

    console: Path
    cpu_start: float
    boot_timeout: float = 300.0
    started: float = field(default_factory=time.monotonic)
    stage: Stage = Stage.FIRMWARE
    checked: bool = False
    offset: int = 0  # where the current boot's output starts in the console (it moves at a reset)
    size: int = 0
    grew: float = field(default_factory=time.monotonic)  # when the console last grew
    resets: int = 0

    def advanced(self) -> Stage | None:
        """The stage the boot reached since the last look, if it moved on."""
        size = size_of(self.console)
        if size == self.size:
            return None  # nothing new: the stage cannot have moved
        self.size, self.grew = size, time.monotonic()
        now = stage_of(read(self.console, self.offset))
        if now == self.stage:
            return None
        self.stage = now
        return now

    @property
    def stall_limit(self) -> float:
        return min(STALL_MAX, max(STALL_MIN, self.boot_timeout / 5))

    def stalled(self) -> str | None:
        """When the boot stopped before systemd (no console output for the stall limit): the last line it
        printed. The VM is reset then, or given up on once RESETS resets have stalled too."""
        if self.stage >= Stage.INIT:
            return None
        if time.monotonic() - self.grew < self.stall_limit:
            return None
        lines = [line.strip() for line in read(self.console, self.offset).splitlines() if line.strip()]
        return lines[-1] if lines else "(nothing)"

    def was_reset(self) -> None:
        """The VM was reset: its new boot's output starts at the console's current end."""
        self.resets += 1
        self.offset = self.size = size_of(self.console)
        self.stage, self.grew = Stage.FIRMWARE, time.monotonic()

    def cpu(self, cpu_now: float | None) -> Cpu | None:
        """What the host gave the VM so far (None once the VM is gone)."""
        if cpu_now is None:
            return None
        load, cpus = host_load()
        return Cpu(cpu_now - self.cpu_start, time.monotonic() - self.started, load, cpus)

    def starving(self, cpu_now: float | None) -> str | None:
        """Once, when the boot is still waited for after SLOW_AFTER seconds: why, if the host starves it."""
        if self.checked or time.monotonic() - self.started < SLOW_AFTER:
            return None
        self.checked = True
        cpu = self.cpu(cpu_now)
        return cpu.verdict() if cpu is not None and cpu.starved else None


def host_load() -> tuple[float, int]:
    return os.getloadavg()[0], os.cpu_count() or 1


def busy_warning() -> str | None:
    """Said before a software-emulated boot on a host already busier than its CPUs."""
    load, cpus = host_load()
    if load > 2 * cpus:
        return (
            f"this host is busy (load {load:.1f} on {cpus} CPU(s)); under TCG every instruction is emulated, "
            "so this boot will be slow"
        )
    return None


def keep(console: Path, name: str) -> Path | None:
    """Copy a failed boot's console (its first and last MiB) where it outlives the session; the oldest
    copies beyond KEEP_FAILED go. Returns the copy, or None when there was no console."""
    try:
        with console.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(0)
            head = f.read(KEEP_BYTES)
            tail = b""
            if size > 2 * KEEP_BYTES:
                f.seek(size - KEEP_BYTES)
                tail = b"\n[... %d bytes left out ...]\n" % (size - 2 * KEEP_BYTES) + f.read(KEEP_BYTES)
            else:
                tail = f.read()
    except OSError:
        return None
    where = paths.failed_boots_dir()
    where.mkdir(mode=0o700, parents=True, exist_ok=True)
    kept = where / f"{time.strftime('%Y%m%dT%H%M%S')}-{name}.console.log"
    kept.write_bytes(head + tail)
    for old in sorted(where.glob("*.console.log"))[:-KEEP_FAILED]:
        old.unlink(missing_ok=True)
    return kept


def tail_of(log_file: Path, lines: int = CONSOLE_TAIL_LINES) -> str:
    """The last lines of a console log (raw: the caller escapes or strips them)."""
    try:
        text = _end_of(log_file, CONSOLE_TAIL_BYTES).decode(errors="replace")
    except OSError:
        return "(no console output)"
    tail = [line.rstrip() for line in text.splitlines() if line.strip()][-lines:]
    return "\n".join(tail) or "(no console output)"
