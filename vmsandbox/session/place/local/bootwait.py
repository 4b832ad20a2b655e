"""Waiting for a booting VM — a session's (until sshd answers) or a warm-start template's (until it waits for
its identity) — with the stage on the spinner, a stalled early boot reset, and a failed boot explained."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vmsandbox import ui
from vmsandbox.errors import VmsandboxError
from vmsandbox.session.place import console
from vmsandbox.vm import accel
from vmsandbox.vm.node import gone
from vmsandbox.vm.virt import Hypervisor

BOOT_TAIL_LINES = 15
Alive = Callable[[], str | None]  # None while the VM runs, else why it stopped


@dataclass(frozen=True)
class Booting:
    domain: str
    console: Path
    name: str  # the failed boot's console is kept under this name
    accel: str
    title: str


def wait(b: Booting, hv: Hypervisor, boot_timeout: int, until: Callable[[Alive], float]) -> float:
    """Run `until(alive)` (it polls `alive` and returns the seconds it waited) while watching the boot."""
    if b.accel == accel.Accel.TCG.value and (busy := console.busy_warning()):
        ui.warn(busy)
    watch = console.Watch(b.console, hv.cpu_seconds(b.domain) or 0.0, boot_timeout)
    with ui.step(b.title) as detail:

        def alive() -> str | None:
            if gone(hv.info(b.domain)):
                return "the VM powered off or crashed"
            if (stage := watch.advanced()) is not None:
                detail(stage.name.lower())
            if starving := watch.starving(hv.cpu_seconds(b.domain)):
                ui.warn(f"the boot is slow: {starving}")
            if (last := watch.stalled()) is not None:
                silent = f"{watch.stall_limit:.0f} s without output after {last!r}"
                if watch.resets >= console.RESETS:  # three stalls in a row: the rest of the timeout changes nothing
                    raise VmsandboxError(f"the guest stopped early in each of its {watch.resets + 1} boots ({silent})")
                ui.warn(
                    f"the guest stopped early in its boot ({silent}); resetting the VM "
                    f"(boot {watch.resets + 2} of {console.RESETS + 1})"
                )
                hv.reset(b.domain)
                watch.was_reset()
            return None

        try:
            return until(alive)
        except VmsandboxError as exc:
            raise failed(b, exc, watch, watch.cpu(hv.cpu_seconds(b.domain))) from exc


def failed(b: Booting, exc: VmsandboxError, watch: console.Watch, cpu: console.Cpu | None) -> VmsandboxError:
    text = console.read(b.console, watch.offset)
    resets = f" (after {watch.resets} reset(s) of a stalled boot)" if watch.resets else ""
    lines = [f"{exc.message}; the boot got as far as: {console.stage_of(text).described}{resets}"]
    if cpu is not None:
        lines.append(f"({cpu.verdict() or cpu.figures})")
    if found := console.trouble(text):
        lines.append("The console reports:\n" + "\n".join(f"  {t}" for t in found))
    lines.append("Last lines of the console:\n" + console.plain(console.tail_of(b.console, lines=BOOT_TAIL_LINES)))
    kept = console.keep(b.console, b.name)
    where = f"the console is kept at {kept}" if kept else "the guest wrote no console"
    hint = f"{where}; on a busy host raise boot_timeout (config) or run fewer sessions at once"
    return VmsandboxError("\n".join(lines), hint=hint)


def marker(console_log: Path, text: str, *, timeout: float, alive: Alive) -> float:
    """Wait until the console shows `text` (a line the guest's own units print); the seconds waited."""
    start = time.monotonic()
    while True:
        if (stopped := alive()) is not None:
            raise VmsandboxError(f"the VM stopped while booting: {stopped}")
        if text in console.read(console_log):
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise VmsandboxError(f"the VM did not reach {text!r} within {timeout:.0f} s")
        time.sleep(0.2)
