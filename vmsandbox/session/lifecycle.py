"""The end of a session, in one place: reviewing what the guest changed, and then removing the session — but
never with unreviewed work. Whatever is left unsynced when the VM goes is exported to the outbox first, and a
session holding work is never removed silently. `run`'s end, `pull`, `recover`, `destroy` and `gc` all go
through here.

The review itself is data (sync.plan): this module gathers the plan and carries out decisions; whoever asks
the person (the CLI) sits outside.
"""

from __future__ import annotations

import functools
import logging
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from vmsandbox import confine, failpoint, paths, proc, ui
from vmsandbox.egress import control
from vmsandbox.errors import VmsandboxError
from vmsandbox.session import chain, diskreader, lock, pins, places
from vmsandbox.session.hostspec import HostSpec
from vmsandbox.session.place import Tidy
from vmsandbox.session.record import Phase, Record, State, domain_name, names
from vmsandbox.session.state import status
from vmsandbox.sync import changes, commitreview, outbox, plan
from vmsandbox.sync.changes import Gathered
from vmsandbox.sync.compare import Change
from vmsandbox.sync.plan import Decisions, Outcome, Plan
from vmsandbox.vm.node import UnreachableError
from vmsandbox.vm.virt import Hypervisor

log = logging.getLogger(__name__)


def gather(record: Record, *, limit: int) -> Gathered:
    """The guest's changes, from wherever they are now (outbox, running VM, or a dead VM's disk)."""
    with diskreader.source(record) as (endpoint, disk):
        return changes.gather(record.target(), endpoint=endpoint, limit=limit, disk=disk)


def review(record: Record, *, limit: int, only: list[str] | None = None) -> Plan:
    """What a review shows and asks about (a mass change past the user's own thresholds: sync/mass.py)."""
    from vmsandbox.session import config
    from vmsandbox.sync import mass

    settings = config.load()  # the user's file only: the project may be what the guest just changed
    limits = mass.Limits(settings.mass_change_files, settings.mass_change_size_mib * 1024**2)
    return plan.make(gather(record, limit=limit), only, limits=limits)


def decide(record: Record, p: Plan, decisions: Decisions) -> Outcome:
    """Carry out a person's (or --yes's) decisions; the record remembers how much is left."""
    outcome = plan.carry_out(p, decisions)
    record.unsynced = outcome.left_total
    record.save()
    return outcome


def settle(record: Record, outcome: Outcome) -> bool:
    """After `pull`/`recover`: a session whose VM is gone and whose every change is dealt with is removed.
    True if it was."""
    if record.exported and outcome.left_total == 0:
        remove(record)
        return True
    return False


@dataclass(frozen=True)
class End:
    """How a session ended: removed (no outbox), or its VM gone with `left` changes waiting in `outbox`."""

    outbox: Path | None = None
    left: int = 0


def finish(record: Record, gathered: Gathered, *, background: bool = False) -> End:
    """The end of `run` (after its review): export what is left, then destroy the VM — in the background if
    asked (the exit code and the review do not wait for it; gc finishes a teardown that was interrupted)."""
    left = changes.pending(gathered)
    box = outbox.export(gathered) if left else None
    record.ending = "retire" if left else "remove"
    if background:
        record.save()
        _teardown_in_background(record)
    else:
        end_now(record)
    return End(box, len(left))


TEARDOWN_LOG = "teardown.log"


def _teardown_in_background(record: Record) -> None:
    """Hand the session's ending to a process of its own (session.teardown; its output goes to the state dir's
    teardown.log)."""
    paths.state_dir().mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "vmsandbox.session.teardown", record.name]
    proc.spawn_detached(argv, log_file=paths.state_dir() / TEARDOWN_LOG)


def end_now(record: Record) -> None:
    """Carry out the ending `finish` decided: retire (the outbox stays) or remove."""
    if record.ending == "retire":
        retire(record)
    else:
        remove(record)


def destroy(record: Record, *, force: bool, discard: bool, limit: int) -> End:
    """Destroy a session's VM and files — refused while changes are unsynced, unless `force` (they are
    exported first) or `discard` (they are thrown away). A session whose host does not answer is forgotten
    here with `discard` only (gc removes it there once the host answers)."""
    if record.owner_alive() and not (force or discard):
        raise VmsandboxError(
            f"session {record.name} is in use by `vmsandbox run` (pid {record.owner_pid})",
            hint=f"end that command, or `vmsandbox destroy {record.name} --force`",
        )
    if discard or not record.files.baseline_manifest.exists():
        remove(record, forget_unreachable=discard)
        return End()
    try:
        g, left = _pending(record, limit)
    except UnreachableError as exc:
        raise places.of(record).unanswered(record, exc) from exc
    if left and not force:
        listing = ", ".join(c.path for c in left[:5]) + (" …" if len(left) > 5 else "")
        raise VmsandboxError(
            f"session {record.name} holds {len(left)} unsynced change(s): {listing}",
            hint=f"review them with `vmsandbox pull {record.name}`; `destroy --force` exports them to the session's "
            "outbox first, `destroy --discard` throws them away",
        )
    return finish(record, g)


def remove_damaged(name: str, uri: str) -> Path | None:
    """Remove a session whose record cannot be read: its egress daemon, its VM (found by name at `uri`)
    and its directory. The directory's path, if there was one."""
    files = paths.session_paths(name)
    if not files.root.is_dir():
        return None
    _stop(files, uri, domain_name(name))
    places.release_any(files.root)
    shutil.rmtree(files.root)
    pins.unpin(name)
    return files.root


def _stop(files: paths.SessionPaths, uri: str, domain: str) -> None:
    """The session's egress daemon and its VM, gone."""
    control.stop(files)
    failpoint.hit("destroy.stop")
    with Hypervisor(uri) as hv:
        hv.destroy(domain)
    places.of_uri(uri).forget(files.root, domain)


def _pending(record: Record, limit: int) -> tuple[Gathered, list[Change]]:
    """The session's changes and the ones still pending; the record remembers how many."""
    g = gather(record, limit=limit)
    left = changes.pending(g)
    record.unsynced = len(left)
    record.save()
    return g, left


def remove(record: Record, *, forget_unreachable: bool = False) -> None:
    """Destroy the VM and delete the session directory. With `forget_unreachable`, a session whose host does
    not answer is deleted here all the same (said; `gc` sweeps its VM and volumes there later)."""
    try:
        _stop(record.files, record.libvirt_uri, record.domain)
    except UnreachableError as exc:
        if not forget_unreachable or not places.of(record).forget_unanswered(record, exc):
            raise
    shutil.rmtree(record.files.root, ignore_errors=True)
    pins.unpin(record.name)
    _drop_staged_refs(record)


def _drop_staged_refs(record: Record) -> None:
    """The refs a killed pull left staged for the session in the project go with it (never fatal)."""
    try:
        who = confine.invoking_user(record.uid, record.gid)
        if commitreview.drop_leftover(Path(record.project), who, record.name):
            log.info("session %s: dropped the refs a killed pull left staged in %s", record.name, record.project)
    except (VmsandboxError, OSError) as exc:
        ui.warn(f"the refs staged for session {record.name} in {record.project} stay: {exc}")


def retire(record: Record) -> None:
    """Destroy the VM and everything but what a later `recover` needs: the record, the baseline, the decisions
    and the outbox of unsynced changes."""
    _stop(record.files, record.libvirt_uri, record.domain)
    files = record.files
    doomed = [files.workspace_disk, files.client_key, files.client_key.with_suffix(".pub")]
    doomed += [files.root / name for name in chain.present(files.root)]  # the VM's and its checkpoints'
    for f in doomed:
        f.unlink(missing_ok=True)
    for d in (files.fwcfg_dir, files.guest_tree, files.checkpoints):
        shutil.rmtree(d, ignore_errors=True)
    record.exported = True
    record.ending = None
    record.save()
    pins.unpin(record.name)  # its disks are gone: it rests on no image any more


def _state_at(record: Record, here: Hypervisor) -> State:
    """A session's state, asked of its place's libvirt (`here`, when that is this machine's)."""
    with places.of(record).connected(here) as hv:
        return status(record, hv).state


def _gc_session(name: str, hv: Hypervisor, uri: str, limit: int, tidy: Tidy) -> Iterator[str]:
    """gc of one session: removed if its VM is gone or its `run` died, unless it holds work."""
    files = paths.session_paths(name)
    try:
        record = Record.load(name)
    except VmsandboxError as exc:
        if files.workspace_disk.exists():  # it may hold the guest's work: a person decides
            yield f"kept damaged session {name}: {exc.message}; `vmsandbox destroy {name} --discard` removes it"
        elif time.time() - files.root.stat().st_mtime > 60:  # not one being created right now
            yield tidy("remove", f"damaged session directory {files.root}", lambda: remove_damaged(name, uri))
        return
    try:
        state = _state_at(record, hv)
    except UnreachableError as exc:  # another host that does not answer: its sessions wait for it
        yield f"skipped session {name}: host {record.host} does not answer ({exc.message})"
        return
    if state not in (State.EXITED, State.ORPHANED, State.ENDING):
        return
    if tidy.dry:  # what a gc would do, said without the lock and without reading the guest's changes
        yield _would_collect(record, state)
        return
    try:
        with lock.held(files, name, "cleaning up"):
            yield _collect(Record.load(name), state, limit)  # read again: a teardown may have run
    except lock.BusyError as exc:
        yield f"skipped {exc.message}"
    except lock.GoneError:  # it ended meanwhile (its teardown finished)
        return
    except VmsandboxError as exc:  # one session's trouble never stops the clean-up of the others
        yield f"could not check session {name}: {exc.message}"


def gc(uri: str, *, limit: int, hosts: tuple[HostSpec, ...] = (), dry: bool = False) -> Iterator[str]:
    """Remove sessions whose VM is gone or whose `vmsandbox run` died — unless they hold unsynced work (a
    stopped VM's work is exported to its outbox, and the session kept) —, finish teardowns that were
    interrupted, and destroy vmsandbox domains whose session directory is gone. Yields a line per thing done;
    with `dry`, a line per thing it would do, and does nothing."""
    mine = paths.sessions_dir().resolve()
    tidy = Tidy(dry=dry)
    with Hypervisor(uri) as hv:
        for name in names():
            yield from _gc_session(name, hv, uri, limit, tidy)
        yield from diskreader.sweep(mine, hv, tidy)
        for session in pins.collect(dry=dry):
            yield f"{'would remove' if dry else 'removed'} the pin of session {session} (its directory is gone)"
    for place in places.every(uri, hosts):
        yield from place.sweep(mine, tidy)
    yield from _stale_captures(mine, tidy)


def _stale_captures(sessions: Path, tidy: Tidy) -> Iterator[str]:
    """The captures of fan-outs killed before they cleaned up."""
    for staging in sessions.glob(paths.FANOUT_CAPTURE_PREFIX + "*"):
        if time.time() - staging.stat().st_mtime > STALE_CAPTURE_SECONDS:
            what = f"{staging} (the capture of a fan-out that did not finish)"
            yield tidy("remove", what, functools.partial(shutil.rmtree, staging, ignore_errors=True))


STALE_CAPTURE_SECONDS = 3600  # a fan-out copies its capture as its sessions start: one this old is left over


def _collect(record: Record, state: State, limit: int) -> str:
    """gc of one stopped, orphaned or ending session (its lock held): what was done."""
    if record.ending is not None:  # its background teardown was interrupted: finish it
        end_now(record)
        return f"finished the teardown of session {record.name}"
    kept = _keeps_work(record, state, limit)
    if kept is not None:
        return f"kept session {record.name} ({state}): {kept}"
    remove(record)
    return f"removed session {record.name} ({state})"


def _would_collect(record: Record, state: State) -> str:
    if record.ending is not None:
        return f"would finish the teardown of session {record.name}"
    if record.status is Phase.READY and record.files.baseline_manifest.exists() and record.unsynced != 0:
        known = "" if record.unsynced is None else f", {record.unsynced} at the last count"
        return f"would keep session {record.name} ({state}) if it holds unsynced changes{known}, else remove it"
    return f"would remove session {record.name} ({state})"


def _keeps_work(record: Record, state: State, limit: int) -> str | None:
    """Why gc keeps this session (its unsynced changes), or None. A session that never got ready never ran a
    command: nothing in it is anyone's work."""
    if record.status is not Phase.READY or not record.files.baseline_manifest.exists():
        return None
    g, left = _pending(record, limit)
    if not left:
        return None
    if state is State.EXITED and not record.exported:
        outbox.export(g)
        retire(record)
    return f"{len(left)} unsynced change(s); `vmsandbox pull {record.name}` or `vmsandbox recover {record.name}`"
