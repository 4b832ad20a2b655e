"""The end of a session, in one place: reviewing what the guest changed, and then removing the session — but
never with unreviewed work. Whatever is left unsynced when the VM goes is exported to the outbox first, and a
session holding work is never removed silently. `run`'s end, `pull`, `recover`, `destroy` and `gc`
(session.end.gc) all go through here.

The review itself is data (sync.review.plan): this module gathers the plan and carries out decisions; whoever asks
the person (the CLI) sits outside.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import vmsandbox.sync.review.gather
import vmsandbox.sync.review.plan
from vmsandbox import failpoint, paths, proc, ui
from vmsandbox.confine import pool
from vmsandbox.egress import control
from vmsandbox.errors import VmsandboxError
from vmsandbox.session.end import diskreader
from vmsandbox.session.place import chain, choose, pins
from vmsandbox.session.place.hostspec import HostSpec
from vmsandbox.session.place.interface import VM
from vmsandbox.session.record import Record, domain_name
from vmsandbox.sync.fetch import volume
from vmsandbox.sync.git.repository import Repository
from vmsandbox.sync.git.review import drop_leftover
from vmsandbox.sync.land import outbox
from vmsandbox.sync.review import frozen
from vmsandbox.sync.review.gather import Gathered
from vmsandbox.sync.review.plan import Decisions, Outcome, Plan
from vmsandbox.sync.review.threeway import Change
from vmsandbox.vm.node import UnreachableError

log = logging.getLogger(__name__)


def gather(record: Record, *, limit: int, vm: VM | None = None) -> Gathered:
    """The guest's changes, from wherever they are now (outbox, running VM, or a dead VM's disk); `vm`: the
    session's VM on the connection the caller's operation holds."""
    with diskreader.source(record, vm) as (endpoint, disk):
        return vmsandbox.sync.review.gather.gather(record.target(), endpoint=endpoint, limit=limit, disk=disk)


def review(record: Record, *, limit: int, only: list[str] | None = None, freeze: bool = True) -> Plan:
    """What a review shows and asks about (a mass change past the user's own thresholds:
    sync/review/mass.py), frozen host-side before anything shows it (sync.review.frozen): an apply takes exactly
    this review."""
    from vmsandbox.session import settings
    from vmsandbox.sync.review import mass

    config = settings.load()  # the user's file only: the project may be what the guest just changed
    limits = mass.Limits(config.mass_change_files, config.mass_change_size_mib * 1024**2)
    made = vmsandbox.sync.review.plan.make(gather(record, limit=limit), only, limits=limits)
    return frozen.freeze(made) if freeze else made  # (a review only read, never applied: `diff`)


def reviewed(record: Record, review_id: str) -> Plan:
    """The review `review_id` of the session, as it was shown (nothing is fetched from the guest again)."""
    return frozen.load(record.target(), review_id)


def decide(record: Record, plan: Plan, decisions: Decisions) -> Outcome:
    """Carry out a person's (or --yes's) decisions on a frozen review, once; the record remembers how much is
    left."""
    try:
        outcome = vmsandbox.sync.review.plan.carry_out(plan, decisions)
    finally:
        frozen.consume(plan)
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
    left = vmsandbox.sync.review.gather.pending(gathered)
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
    """Hand the session's ending to a process of its own (session.end.teardown; its output goes to the state dir's
    teardown.log)."""
    paths.state_dir().mkdir(parents=True, exist_ok=True)
    argv = proc.own_module("vmsandbox.session.end.teardown", record.name)
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
    here with `discard` only (gc removes it there once the host answers). Whether a run that drives the session
    lets it go is the core's rule (core.sessions.not_driven), asked before."""
    if discard or not record.files.baseline_manifest.exists():
        remove(record, forget_unreachable=discard)
        return End()
    try:
        g, left = pending(record, limit)
    except UnreachableError as exc:
        if not choose.abilities(record.libvirt_uri).elsewhere:
            raise
        raise VmsandboxError(
            f"host {record.host} does not answer, so the changes of session {record.name} cannot be read: "
            f"{exc.message}",
            hint=f"try again once it answers; `vmsandbox rm {record.name} --discard` forgets the session here "
            "(its unsynced changes too) and `vmsandbox rm --stale` removes its VM and volumes there when the host is "
            "back",
        ) from exc
    if left and not force:
        listing = ", ".join(c.path for c in left[:5]) + (" …" if len(left) > 5 else "")
        raise VmsandboxError(
            f"session {record.name} holds {len(left)} unsynced change(s): {listing}",
            hint=f"review them with `vmsandbox pull {record.name}`; `vmsandbox rm -f` keeps them in the session's "
            "outbox first, `vmsandbox rm --discard` throws them away",
        )
    return finish(record, g)


def remove_damaged(name: str, uri: str) -> Path | None:
    """Remove a session whose record cannot be read: its egress daemon, its VM (found by name at `uri`)
    and its directory. The directory's path, if there was one."""
    files = paths.session_paths(name)
    if not files.root.is_dir():
        return None
    _stop(files, choose.spec_at(uri), domain_name(name))
    choose.release(files.root)
    volume.drop(files)  # (its own file system, if it has one, unmounted first: rmtree would not leave it)
    shutil.rmtree(files.root)
    pins.unpin(name)
    return files.root


def _stop(files: paths.SessionPaths, spec: HostSpec, domain: str) -> None:
    """The session's egress daemon and its VM (on the host `spec` names), gone."""
    control.stop(files)
    failpoint.hit("destroy.stop")
    with choose.host(spec) as host:
        host.forget(files.root, domain)


def pending(record: Record, limit: int) -> tuple[Gathered, list[Change]]:
    """The session's changes and the ones still pending; the record remembers how many."""
    g = gather(record, limit=limit)
    left = vmsandbox.sync.review.gather.pending(g)
    record.unsynced = len(left)
    record.save()
    return g, left


def remove(record: Record, *, forget_unreachable: bool = False) -> None:
    """Destroy the VM and delete the session directory. With `forget_unreachable`, a session whose host does
    not answer is deleted here all the same (said; `gc` sweeps its VM and volumes there later)."""
    try:
        _stop(record.files, choose.spec_of(record), record.domain)
    except UnreachableError as exc:
        if not forget_unreachable or not choose.abilities(record.libvirt_uri).elsewhere:
            raise  # this machine's libvirt: start it (the error says how) rather than lose track of a VM
        choose.release(record.files.root)
        ui.warn(
            f"host {record.host} does not answer ({exc.message}): session {record.name} is forgotten here; "
            f"`vmsandbox rm --stale` removes its VM and volumes there once the host answers"
        )
    volume.drop(record.files)
    shutil.rmtree(record.files.root, ignore_errors=True)
    if record.account is not None:
        pool.release(record.account, record.files.root)
    pins.unpin(record.name)
    _drop_staged_refs(record)


def _drop_staged_refs(record: Record) -> None:
    """The refs a killed pull left staged for the session in the project go with it (never fatal)."""
    try:
        repo = Repository.of(Path(record.project), record.uid, record.gid)
        if drop_leftover(repo, record.name):
            log.info("session %s: dropped the refs a killed pull left staged in %s", record.name, record.project)
    except (VmsandboxError, OSError) as exc:
        ui.warn(f"the refs staged for session {record.name} in {record.project} stay: {exc}")


def retire(record: Record) -> None:
    """Destroy the VM and everything but what a later `recover` needs: the record, the baseline, the decisions
    and the outbox of unsynced changes."""
    _stop(record.files, choose.spec_of(record), record.domain)
    files = record.files
    doomed = [files.workspace_disk, files.client_key, files.client_key.with_suffix(".pub")]
    doomed += [files.root / name for name in chain.present(files.root)]  # the VM's and its checkpoints'
    for f in doomed:
        f.unlink(missing_ok=True)
    volume.drop(files)
    for d in (files.fwcfg_dir, files.checkpoints):
        shutil.rmtree(d, ignore_errors=True)
    record.exported = True
    record.ending = None
    account, record.account = record.account, None  # no VM of it runs again: its account may serve another
    record.save()
    if account is not None:
        pool.release(account, files.root)
    pins.unpin(record.name)  # its disks are gone: it rests on no image any more
