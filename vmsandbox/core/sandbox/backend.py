"""The one implementation of the API's interface (interface.Backend) over the core: a sandbox is a session, made
as `vmsandbox create` makes one (on a project, or on an empty one of its own), paused and resumed as `stop` and
`start` do, ended as `rm --force` (its unreviewed changes kept in its outbox), reviewed and applied through the
core's reviews, so the contract holds here as everywhere: a choice names an item of a frozen review with what
was shown of it. What E2B keeps of a sandbox beside the session (its end, environment, metadata) is a file in
the session's directory."""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
from collections.abc import Collection, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from vmsandbox import filewrite, paths
from vmsandbox.core import listing, moments, reviews, sessions, views
from vmsandbox.core.listing import State, Status
from vmsandbox.core.person import Nobody
from vmsandbox.core.sandbox import model
from vmsandbox.core.sandbox.files import GuestFiles
from vmsandbox.core.sandbox.interface import ConflictError, NotFoundError, NotRunningError
from vmsandbox.core.sandbox.names import CheckpointLabel, Digest, SessionName, SnapshotRef, Token
from vmsandbox.core.sandbox.processes import GuestProcesses
from vmsandbox.core.sessions import Record, RunFlags
from vmsandbox.core.views import Decisions, Plan, madeby
from vmsandbox.errors import VmsandboxError

AGAIN = "ask for a new review (POST /vmsandbox/v1/sessions/{0}/reviews) and choose from it"
STATES = {State.RUNNING: model.State.RUNNING, State.STOPPED: model.State.PAUSED}


def _kept(record: Record) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads((record.files.root / paths.SESSION_SANDBOX).read_text())
    except (OSError, ValueError):
        data = {}
    return data


def _keep(record: Record, **values: Any) -> None:
    data = {**_kept(record), **values}
    filewrite.write_atomically(record.files.root / paths.SESSION_SANDBOX, json.dumps(data, default=str))


NO_END = model.NO_END  # a session made outside the API ends when a person ends it


def _when(text: object) -> datetime:
    """A sandbox's end as kept; a session the API did not make, or given no timeout, has none (the reaper never
    ends what a person started at the terminal)."""
    try:
        return datetime.fromisoformat(str(text)) if text else NO_END
    except ValueError:
        return NO_END


class SessionBackend:
    """interface.Backend over the core's sessions."""

    def __init__(self) -> None:
        self._processes: dict[str, GuestProcesses] = {}
        self._lock = threading.Lock()

    # -- sessions ------------------------------------------------------------------------------------------------
    def _sandbox(self, status: Status) -> model.Sandbox:
        r = status.record
        kept = _kept(r)
        return model.Sandbox(
            name=SessionName(r.name), blueprint=r.blueprint, state=STATES[status.state],
            started_at=datetime.fromtimestamp(r.created, tz=UTC),
            end_at=_when(kept.get("end_at")) if kept.get("api") else NO_END, timed=bool(kept.get("api")),
            cpus=r.cpus, memory_mib=r.memory_mib, disk_mib=r.disk_mib, metadata=kept.get("metadata") or {},
            project=None if kept.get("own_project") else r.project,
        )  # fmt: skip

    def create(self, spec: model.SandboxSpec) -> model.Sandbox:
        own = spec.project is None  # E2B's own sandboxes: on an empty project of their own
        project = sessions.empty_project(spec.name.value) if spec.project is None else spec.project.value
        record = sessions.create(project, spec.blueprint.value, RunFlags(name=spec.name.value), Nobody())
        _keep(record, api=True, end_at=spec.end_at.isoformat(), envs=dict(spec.envs), metadata=dict(spec.metadata),
              own_project=own)  # fmt: skip
        return self.sandbox(spec.name)

    def sandboxes(self) -> Sequence[model.Sandbox]:
        return [self._sandbox(s) for s in listing.statuses() if s.state in STATES]

    def sandbox(self, name: SessionName) -> model.Sandbox:
        found = next((s for s in self.sandboxes() if s.name == name), None)
        if found is None:
            raise NotFoundError(f"no sandbox {name.value!r} (no running or paused session of that name)",
                                hint="list them with Sandbox.list()")  # fmt: skip
        return found

    def born(self, name: SessionName) -> datetime | None:
        try:
            return datetime.fromtimestamp(sessions.record(name.value).created, tz=UTC)
        except (VmsandboxError, OSError, ValueError):
            return None

    def kill(self, name: SessionName) -> None:
        """Ended: a project session's unreviewed changes wait in its outbox (as `rm --force`, but never from under
        a run that drives it: the core's rule); E2B's own sandbox is gone whole, its empty project with it
        (nothing of a person's was in it)."""
        self.sandbox(name)
        own = bool(_kept(sessions.record(name.value)).get("own_project"))
        self._forget(name)
        with _answered(name):
            sessions.destroy(name.value, force=True, discard=own)
        if own:
            shutil.rmtree(_own_project(name.value), ignore_errors=True)

    def pause(self, name: SessionName) -> None:
        """Stopped with its memory (`vmsandbox stop`); its end forgotten (E2B's rule: a paused sandbox has none),
        so whoever resumes it — a `connect` that gives it a new end, or a person's `vmsandbox start` — is never
        ended by an old one."""
        if self.sandbox(name).state is not model.State.RUNNING:
            raise ConflictError(f"sandbox {name.value} is paused already", hint="connect to it to resume it")
        self._forget(name)
        with _answered(name):
            sessions.stop(name.value)
        _keep(sessions.record(name.value), end_at=None)

    def resume(self, name: SessionName) -> model.Sandbox:
        if self.sandbox(name).state is model.State.PAUSED:
            self._forget(name)  # (it comes back on another port: nothing cached of it holds)
            sessions.start(name.value)
        return self.sandbox(name)

    def set_end(self, name: SessionName, end_at: datetime) -> None:
        if not self.sandbox(name).timed:
            raise ConflictError(
                f"session {name.value} was started at the terminal: the API keeps no end for it",
                hint=f"end it with `vmsandbox rm {name.value}` when it is done",
            )
        _keep(sessions.record(name.value), end_at=end_at.isoformat())

    def _forget(self, name: SessionName) -> None:
        with self._lock:
            self._processes.pop(name.value, None)

    # -- checkpoints and forks -----------------------------------------------------------------------------------
    def checkpoint(self, name: SessionName, label: CheckpointLabel | None) -> model.Checkpoint:
        return _checkpoint(name, moments.take(name.value, label.value if label else None))

    def checkpoints(self, name: SessionName | None) -> Sequence[model.Checkpoint]:
        if name is not None:
            return [_checkpoint(name, cp) for cp in moments.kept(name.value, sized=False)]
        found = []
        for status in listing.statuses():
            with contextlib.suppress(VmsandboxError):  # (a session removed since it was listed has none)
                kept = moments.kept(status.record.name, sized=False)
                found += [_checkpoint(SessionName(status.record.name), cp) for cp in kept]
        return found

    def rollback(self, name: SessionName, label: CheckpointLabel) -> model.Sandbox:
        self._forget(name)
        with _answered(name):
            moments.restore(name.value, label.value)
        return self.sandbox(name)

    def fork(
        self, name: SessionName, label: CheckpointLabel | None, new: SessionName, end_at: datetime
    ) -> model.Sandbox:
        sessions.copy_of(name.value, new.value, label=label.value if label else None)
        source = _kept(sessions.record(name.value))
        _keep(sessions.record(new.value), api=True, end_at=end_at.isoformat(), envs=source.get("envs") or {},
              metadata=source.get("metadata") or {}, own_project=bool(source.get("own_project")))  # fmt: skip
        return self.sandbox(new)

    # -- reviews -------------------------------------------------------------------------------------------------
    def review(self, name: SessionName, *, freeze: bool = True) -> model.Review:
        """A new review of the session, frozen for an apply (`freeze`), or read only (a diff to show: nothing kept,
        so no review frozen earlier is pushed out of the few a session keeps)."""
        with _answered(name):
            if not freeze:
                return _review_of(name, reviews.review(name.value, freeze=False), frozen=False)
            return reviews.look(name.value, lambda plan: _review_of(name, plan))

    def reviewed(self, name: SessionName, review: Token) -> model.Review:
        with _answered(name):
            return reviews.look(name.value, lambda plan: _review_of(name, plan), review_id=review.value)

    def apply(
        self, name: SessionName, review: Token, choices: Sequence[model.Choice], include: Collection[model.Badge] = ()
    ) -> model.Applied:
        chosen: list[tuple[Plan, views.Chosen]] = []
        asked = [  # (ids read before the review is opened, as check_taken reads them: a malformed one spends nothing)
            views.Choice(
                model.number(c.item),
                c.digest.value,
                None if c.hunks is None else [model.number(h, "h") for h in c.hunks],
            )
            for c in choices
        ]

        def decide(plan: Plan) -> Decisions:
            held = [_shown(plan, n) for n in sorted({c.item for c in asked}) if 0 <= n < len(plan.todo)]
            model.check_taken(held, choices, include)  # (raised before anything is applied: the review stays)
            chosen.append((plan, views.decide(plan, asked, again=AGAIN.format(name.value))))
            return chosen[-1][1].decisions

        with _answered(name):
            settled = reviews.apply(name.value, review.value, decide)
        plan, picked = chosen[0]
        landed = set(settled.outcome.applied + settled.outcome.merged + settled.outcome.conflicts)
        numbers = [model.number(c.item) for c in choices]
        applied = [
            c.item for c, n in zip(choices, numbers, strict=True)
            if 0 <= n < len(plan.todo) and all(x.path in landed for x in plan.todo[n].changes)
        ]  # fmt: skip
        pairs = zip(picked.refused_items, picked.refused, strict=True)
        refused = [model.Refusal(Token(f"i{n}"), why) for n, why in pairs]
        for why in settled.outcome.failed:  # (a path the apply could not write: named by the item that holds it)
            n = next(
                (n for n, item in enumerate(plan.todo) if any(why.startswith(f"{c.path}: ") for c in item.changes)),
                None,
            )
            refused.append(model.Refusal(Token("review" if n is None else f"i{n}"), why))
        return model.Applied(tuple(applied), tuple(refused), settled.outcome.left_total)

    # -- a running sandbox's processes and files -----------------------------------------------------------------
    def _running(self, name: SessionName) -> Record:
        if self.sandbox(name).state is not model.State.RUNNING:
            raise NotRunningError(f"sandbox {name.value} was not found running (it is paused)",
                                  hint="connect to it to resume it")  # fmt: skip
        return sessions.record(name.value)

    def processes(self, name: SessionName) -> GuestProcesses:
        record = self._running(name)
        with self._lock:
            found = self._processes.get(name.value)
            if found is None:
                kept = _kept(record)
                found = GuestProcesses(
                    record.endpoint("root"), record.user, kept.get("envs") or {}, _workdir(record), record
                )
                self._processes[name.value] = found
            return found

    def files(self, name: SessionName) -> GuestFiles:
        record = self._running(name)
        return GuestFiles(record.endpoint("root"), record.user, _workdir(record))


def _own_project(name: str) -> Path:
    """The empty project an E2B sandbox of its own is made on."""
    return paths.sandbox_projects() / name


def _workdir(record: Record) -> str | None:
    """Where a sandbox's processes start and its relative paths begin: a project session's project directory
    (as `vmsandbox exec` runs), E2B's own sandboxes' home."""
    return None if _kept(record).get("own_project") else record.project


@contextlib.contextmanager
def _answered(name: SessionName) -> Iterator[None]:
    """A review spent or replaced, a session another command holds, or one a run drives (the core's refusal, in
    its words), as the conflicts they are (409): the one place the API answers them."""
    try:
        yield
    except reviews.StaleError as exc:
        raise ConflictError(exc.message, hint=AGAIN.format(name.value)) from exc
    except sessions.BusyError as exc:
        raise ConflictError(exc.message, hint=exc.hint or "try again once the other command is done") from exc
    except sessions.DrivenError as exc:
        raise ConflictError(exc.message, hint=exc.hint) from exc


BADGES = {
    "secret": model.Badge.SECRET, "quarantined": model.Badge.QUARANTINED, "ignored": model.Badge.IGNORED,
    "binary": model.Badge.BINARY, "conflict": model.Badge.CONFLICT, "unsafe": model.Badge.UNSAFE,
}  # fmt: skip


def _checkpoint(name: SessionName, cp: moments.Kept) -> model.Checkpoint:
    return model.Checkpoint(SnapshotRef(name, CheckpointLabel(cp.label)), datetime.fromtimestamp(cp.created, tz=UTC))


def _hunks(plan: Plan, c: views.Change, both: tuple[bytes, bytes] | None) -> tuple[model.Hunk, ...]:
    if both is None:
        return ()
    a, b = views.lines(both[0]), views.lines(both[1])

    def shown(lines: list[bytes]) -> tuple[str, ...]:
        return tuple(x.decode(errors="replace") for x in lines)

    return tuple(
        model.Hunk(
            Token(f"h{h.index}"),
            h.old_start + 1,
            shown(a[h.old_start : h.old_end]),
            h.new_start + 1,
            shown(b[h.new_start : h.new_end]),
            views.made_by(plan, c, h),
        )
        for h in views.hunks_of(*both)
    )


def _shown(plan: Plan, n: int, *, lines: bool = False) -> model.ReviewItem:
    """Item `n` of a review as the API shows it: its holds, what lands beside its content (type, mode, a link's
    target), and, with `lines`, its hunks."""
    item = plan.todo[n]
    both = None
    if lines and not item.repository:
        with contextlib.suppress(views.ChangedError):
            both = views.texts(plan, item.first)
    holds = tuple(model.Hold(BADGES[what], why) for what, why in views.holds(item))
    if plan.mass is not None:
        holds += (model.Hold(model.Badge.MASS, plan.mass),)
    guest = None if item.repository else item.first.guest
    return model.ReviewItem(
        Token(f"i{n}"), item.label, item.kind, item.first.status.value, Digest(views.fingerprint(item)), holds,
        _hunks(plan, item.first, both), entry_type=None if guest is None else guest.kind,
        mode=None if guest is None else views.landed_mode(guest.kind, guest.mode),
        target=None if guest is None else guest.target, made_by=madeby.writers(plan, item.changes),
    )  # fmt: skip


UNFROZEN = "unfrozen"  # the id of a review read only: no apply takes it (none is kept by that id)


def _review_of(name: SessionName, plan: Plan, *, frozen: bool = True) -> model.Review:
    items = tuple(_shown(plan, n, lines=True) for n in range(len(plan.todo)))
    made = Token(plan.id if frozen else UNFROZEN)
    said = views.provenance(plan)
    return model.Review(
        made, name, datetime.now(tz=UTC), items, tuple(plan.refused), madeby.steps(plan), traced=said is not None,
        incomplete=None if said is None else said.incomplete,
    )  # fmt: skip
