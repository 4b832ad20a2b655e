"""`vmsandbox create --from NAME --name NEW` (a fork): an independent session made from another one's state — now
(a checkpoint is taken for it and dropped after) or at one of its checkpoints — with its processes, files and disks.

The fork gets copies, never shared files: its system disk is one overlay holding everything the source's
overlays held above their image (`qemu-img convert -B`), its workspace disk a copy (a reflink where the file
system can), its baseline the same captured project (so its review compares against the same starting point).
Its identity is its own: SSH host key and client key, hostname, egress daemon and policy, secret placeholders
and session CA, no published ports; the restored guest, which still holds the source's, is handed it
(moments/handover.py). Processes that ran in the source run on in the fork (with the source's environment: new
logins get the fork's). A session on another host is forked there, from its checkpoint's volumes (how the
disks are copied and the VM restored is the place's: session.place).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import threading
import time

from vmsandbox import paths, pids, ui
from vmsandbox.confine import access, accounts
from vmsandbox.egress import control
from vmsandbox.errors import VmsandboxError
from vmsandbox.session import lock
from vmsandbox.session.end import lifecycle
from vmsandbox.session.moments import checkpoint, handover
from vmsandbox.session.place import checkpoints, choose, console, pins
from vmsandbox.session.place.checkpoints import Checkpoint
from vmsandbox.session.place.interface import VM, Sharing
from vmsandbox.session.record import Phase, Record, validate_name
from vmsandbox.session.start import create
from vmsandbox.session.state import where
from vmsandbox.sync.fetch import delta
from vmsandbox.sync.inward import capture

LINE_SHOWN = 200  # characters of a console line a failed fork's error shows (escaped at the edge, as all it says)


def fork(name: str, new: str, *, label: str | None = None) -> Record:
    new = validate_name(new)
    source = Record.load(name)
    if source.disk is not None:
        raise VmsandboxError(f"session {name} builds an image: it cannot be forked")
    with lock.held(source.files, name, f"forking {new} from"), choose.host_of(source) as host:
        source = Record.load(name)
        vm = host.vm(source)
        if label is not None:
            at = checkpoints.find(source.files, name, label)
            with vm.forks.share(at) as how:
                ui.info(f"  memory: {ui.printable(_shared(how))}")  # (it may quote a save image's names)
                return _make(vm, at, new, at=label)
        checkpoint.must_run(vm, "forked")
        _name_free(new)  # before the source is saved for it
        checkpoint.check_room(vm)  # the checkpoint taken for the fork may leave an overlay
        label = f"fork-{new}-{os.getpid()}"
        taken = checkpoint.live(vm, label, listed=False)  # the source runs on: paused for its save's last pass only
        live = taken is not None
        cp = taken if taken is not None else checkpoint.freeze(vm, label)
        failed: list[BaseException] = []
        try:
            # the fork maps the memory saved (one copy, where the place can); a source that was saved resumes on
            # the same copy while the fork is made (two guests come back at once: under TCG, on two CPUs)
            with vm.forks.share(cp) as how:
                ui.info(f"  memory: {ui.printable(_shared(how, live=live))}")  # (it may quote a save's names)
                if live:
                    return _make(vm, cp, new, at=None)
                waking = threading.Thread(target=_wake, args=(source, cp, failed))
                waking.start()
                try:
                    return _make(vm, cp, new, at=None)
                finally:
                    waking.join()
        finally:
            shutil.rmtree(cp.path, ignore_errors=True)
            host.vm(Record.load(name)).snapshots.drop(cp.label, live=True)
            for exc in failed:
                ui.warn(f"session {name} did not resume after the fork: {exc}")


def _name_free(new: str) -> None:
    if paths.session_paths(new).root.exists():
        raise VmsandboxError(f"a session named {new} already exists", hint="pick another name")


def _shared(how: Sharing, *, live: bool = False) -> str:
    """What the forks and their source share of a checkpoint's memory, in words (`live`: the source runs on its
    own, the fork alone maps it)."""
    if how.mapped is not None and live:
        return f"{how.mapped / 1024**2:.0f} MiB mapped copy-on-write by the fork (its source runs on its own)"
    if how.mapped is not None:
        return f"{how.mapped / 1024**2:.0f} MiB mapped copy-on-write, one copy for all"
    return f"each restores a copy ({how.unshared})"


def _wake(source: Record, cp: Checkpoint, failed: list[BaseException]) -> None:
    # its own connection: meanwhile the operation makes the fork on its connection, in the thread that waits here
    with ui.quiet(source.name), choose.vm_of(source) as vm:
        try:
            checkpoint.wake(vm, cp)
        except Exception as exc:  # noqa: BLE001 - reported by the thread that waits for this one
            failed.append(exc)


def _make(vm: VM, cp: Checkpoint, new: str, *, at: str | None) -> Record:
    """The fork NEW of the source session (`vm`) from `cp` (one of its checkpoints `at`, or None: one taken for
    this fork)."""
    source, files = vm.record, paths.session_paths(new)
    there = where(vm.host)
    accounts.state_dirs()
    try:
        files.root.mkdir(mode=0o700)
    except FileExistsError:
        raise VmsandboxError(f"a session named {new} already exists", hint="pick another name") from None
    accounts.private_dir(files.root)
    if os.geteuid() != 0:
        access.inherit_for_me(files.root)
    record = _record(vm, new, at, there)
    made: VM | None = None
    try:
        record.save()
        pins.pin(new, record.image_version, record.template)
        with ui.step(f"Copying session {source.name}'s state{there}"):
            _copy_state(vm, cp, record)
        with ui.step("Preparing the fork (keys, identity, egress policy)"):
            handover.prepare(source, record)
        started = time.monotonic()
        with ui.step(f"Restoring {record.domain} from it") as detail:
            made = vm.forks.restore(cp, record)
            detail("its own identity")
            record.identity_port = handover.hand_over(source, made)
            spawned = control.spawn(create.daemon_spec(record), record.files) if record.wants_daemon else None
            handover.check(made)
        record.boot_seconds = round(time.monotonic() - started, 1)
        if spawned is not None:
            with ui.step("Opening the fork's egress proxy"):
                control.wait_open(create.daemon_spec(record), record.files, spawned)
        record.status, record.owner_pid, record.owner_start = Phase.READY, None, None
        record.save()
    except BaseException as exc:
        try:
            if isinstance(exc, VmsandboxError) and made is not None and made.host.abilities.elsewhere:
                handover.fetch_console(made)  # another host's: here, for _undo to keep
        finally:
            _undo(record, exc)
        raise
    return record


def _record(vm: VM, new: str, at: str | None, there: str) -> Record:
    """The fork's record, as it is while the fork is made: the source's (`vm`'s), with a name, keys, a port, an
    overlay and a status of its own; no published port, no fan-out, no account yet."""
    source = vm.record
    return dataclasses.replace(
        source,
        name=new,
        created=time.time(),
        keep=True,
        owner_pid=os.getpid(),  # (while it is made: gc and `rm --stale` leave it be; none once it is ready)
        owner_start=pids.process_start(os.getpid()),
        status=Phase.CREATING,
        unsynced=None,
        saved=False,
        publish=(),
        overlays=[paths.SESSION_OVERLAY],
        ssh_port=vm.forks.ssh_port(),
        start="fork",
        start_note=f"forked from {source.name}" + (f" at checkpoint {at}" if at else "") + there,
        forked_from=f"{source.name}@{at}" if at else source.name,
        group=None,  # a fork of a fan-out's session is not one of the fan-out's
        boot_seconds=None,
        account=None,
    )


def _undo(record: Record, exc: BaseException) -> None:
    """A fork that failed: removed, whatever happens here. Once its VM ran, its console is kept where it outlives
    the fork (console.keep), and what it says of a failure (a panic, an oops: the guest's lines, cut and escaped)
    goes into the error (`exc`, which keeps its type)."""
    try:
        if isinstance(exc, VmsandboxError) and console.size_of(record.files.console_log):
            kept = console.keep(record.files.console_log, record.name)
            if kept is not None:
                lines = console.trouble(console.read(kept))
                found = "".join(f"\n  {ui.printable(line[:LINE_SHOWN], markup=False)}" for line in lines)
                exc.message += f"\nThe fork's console reports:{found}" if found else ""
                exc.hint = f"the fork's console is kept at {kept}" + (f"; {exc.hint}" if exc.hint else "")
    except OSError as failed:  # (a full disk, say: the fork goes all the same)
        ui.warn(f"the fork's console could not be kept: {failed.strerror or failed}")
    finally:
        lifecycle.remove(record)


def _copy_state(vm: VM, cp: Checkpoint, record: Record) -> None:
    """The fork's (`record`) disks, baseline and (a fresh) mirror, copied from the source (`vm`) at the
    checkpoint."""
    src, files = vm.record.files, record.files
    workspace = vm.forks.copy_disks(cp, record)  # None: the place made it, with the system disk
    capture.copy_from(src, files, workspace)
    for f in (src.decisions, src.hashes("project")):
        if f.exists():
            shutil.copyfile(f, files.root / f.name)
    # the guest's tree is not the baseline's any more: with no record of the mirror, the first pull walks it
    delta.forget(files.root)
