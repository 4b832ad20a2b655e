"""`vmsandbox stop` and `start`: a kept session's VM saved to disk (its memory and devices, beside its disks) so
it holds no CPU and no RAM, then restored where it was — its processes, files, egress and published ports.

A stopped session is a file in its directory (one on another host: a volume in that host's pool, see
remote/save.py), not a libvirt domain: it survives a libvirtd restart and a host reboot. Before the save the
guest flushes its file systems, so `pull` and `diff` of a stopped session read its workspace disk (a copy of
it: the guest will mount the original again) without starting it.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from pathlib import Path

from vmsandbox import paths, ui
from vmsandbox.egress import control
from vmsandbox.errors import SaveInFlightError, VmsandboxError
from vmsandbox.guest import commands, freeze, ssh
from vmsandbox.session import lock
from vmsandbox.session.place import choose
from vmsandbox.session.place.interface import VM, SavedVM
from vmsandbox.session.record import Record, State
from vmsandbox.session.start import create
from vmsandbox.session.state import down, status, where
from vmsandbox.vm.node import gone

SYNC_TIMEOUT = 120
HELD_STILL = "memory-held-still"  # (held_still)


def stop(
    name: str,
    *,
    why: str = "",
    flush_timeout: float = SYNC_TIMEOUT,
    never_wait: bool = False,
    save_deadline: float | None = None,
) -> Record:
    """Save session `name`'s VM to disk, its file systems flushed first (within `flush_timeout`: else an error,
    and it runs on); `why`: the reason, when no person stopped it (record.stop_note); `never_wait`: not even for
    a teardown (lock.held); `save_deadline`: a save not ended by then is aborted, and it runs on."""
    record = Record.load(name)
    files = record.files
    with lock.held(files, name, "stopping", never_wait=never_wait), choose.host_of(record) as host:
        record = Record.load(name)
        vm = host.vm(record)
        current = status(vm).state
        if current is State.STOPPED:
            raise VmsandboxError(f"session {name} is already stopped", hint=f"`vmsandbox start {name}` resumes it")
        if not record.keep:
            raise VmsandboxError(
                f"session {name} belongs to a running `vmsandbox run` (it ends with that command)",
                hint="only sessions started with --keep can be stopped",
            )
        if current not in (State.RUNNING, State.PAUSED):
            raise VmsandboxError(
                f"session {name} is {current}: only a running session can be stopped",
                hint="`vmsandbox ls` shows what each session is doing",
            )
        with ui.step("Flushing the guest's file systems"):
            commands.run_as_root(record.endpoint(), "sync", timeout=flush_timeout)
        control.stop(files)
        try:
            vm.saved.take(deadline=save_deadline)
        except SaveInFlightError as exc:  # it may yet stop the VM: its file is kept until the save says
            threading.Thread(target=_settle, args=(name, why, exc.outcome), name="settle", daemon=True).start()
            raise
        except VmsandboxError:
            _not_saved(record, vm)
            raise
        record.saved = True
        record.stop_note = why
        record.save()
    return record


def _not_saved(record: Record, vm: VM) -> None:
    record.files.saved_memory.unlink(missing_ok=True)  # what a failed save left: never a stopped session's memory
    if record.wants_daemon and not gone(vm.info()):  # it runs on: give it its door back
        create.open_egress(record)


def _settle(name: str, why: str, outcome: Callable[[], bool]) -> None:
    """A save that outlived its deadline and its abort, settled once it ends (in the memory guard's process, which
    runs while the session's VM does): saved — the VM stopped, its file all there is of its memory — or not, and
    the VM runs on with its door back. Until then the session is running, its file kept."""
    saved = outcome()
    try:
        with (
            lock.held(paths.session_paths(name), name, "settling the save of", wait=True),
            choose.vm_of(Record.load(name)) as vm,
        ):
            record = vm.record  # (as it is now, read under the lock)
            if saved and gone(vm.info()):
                record.saved, record.stop_note = True, why
                record.save()
            else:
                _not_saved(record, vm)
    except VmsandboxError as exc:
        ui.warn(f"session {name}: its save ended ({'saved' if saved else 'not saved'}), then: {exc.message}")
        return
    ui.info(f"session {name}: its save ended after all: {'stopped' if saved else 'it runs on'}")


def where_saved(record: Record) -> str:
    """What `stop` kept, and where, in words."""
    with choose.vm_of(record) as vm:
        size, there = vm.saved.size(), where(vm.host)
    return f"{size / 1024**2:.0f} MiB of memory saved{there}" if size else f"its memory saved{there}"


def start(name: str) -> Record:
    record = Record.load(name)
    files = record.files
    with lock.held(files, name, "starting"), choose.host_of(record) as host:
        record = Record.load(name)
        vm = host.vm(record)
        if status(vm).state is not State.STOPPED:
            raise VmsandboxError(f"session {name} is not stopped", hint="`vmsandbox ls` shows its state")
        if record.stop_note:
            ui.info(f"session {name} was {record.stop_note}")
        still = held_still(files)  # its memory is a live checkpoint's, whose rollback failed (checkpoint._resume)
        thaw = thawing(record) if still.exists() else None
        resume(vm, vm.saved.memory(), f"Restoring {record.domain} where it was{where(host)}", restored=thaw)
        still.unlink(missing_ok=True)
        vm.saved.discard()
        record.saved = False
        record.stop_note = ""
        record.save()
    return record


def held_still(files: paths.SessionPaths) -> Path:
    """Where a session left stopped on a live checkpoint's memory (its workspace frozen in it) says so to `start`."""
    return files.root / HELD_STILL


def thawing(record: Record) -> Callable[[], None]:
    """For a VM restored from memory saved live (a checkpoint's): its workspace thawed and the SSH sessions it was
    restored with ended (guest.freeze.end_restored), before its egress link is made (the one restored holds the
    guest's proxy port); what could not be done is said."""

    def thaw() -> None:
        with ui.step("Thawing the workspace the saved memory held still"):
            try:
                freeze.end_restored(record.endpoint(), record.project)
            except VmsandboxError as exc:
                ui.warn(f"session {record.name}: {exc.message}")

    return thaw


def resume(vm: VM, memory: SavedVM, title: str, *, restored: Callable[[], None] | None = None) -> None:
    """Restore the session's VM from a save image (`stop`'s, or a checkpoint's) over the session's system disk
    as the record names it now, wait for its sshd, step its clock (its egress daemon does, if it has one) and
    open its egress. `restored` is called once sshd answers, before the egress daemon starts."""
    record = vm.record
    with ui.step(title):
        vm.saved.restore(memory)
        # the egress daemon waits for the guest's sshd by itself: it starts while the guest comes back, and
        # steps the guest's clock when it connects (one SSH login, not two)
        daemon = record.wants_daemon
        spawned = control.spawn(create.daemon_spec(record), record.files) if daemon and restored is None else None
        ssh.wait_for_banner(record.ssh_port, timeout=60, alive=functools.partial(down, vm))
        if not daemon:
            commands.run_as_root(record.endpoint(), f"date -s @{time.time():.3f} >/dev/null", timeout=60)
    if restored is not None:
        restored()
        spawned = control.spawn(create.daemon_spec(record), record.files) if daemon else None
    if spawned is not None:
        with ui.step("Opening the guest's egress proxy"):
            control.wait_open(create.daemon_spec(record), record.files, spawned)
