"""A Backend for the API's tests, in memory and under tmp (fakeguest.py: the guest's files and processes).

Pausing stops a session's processes (SIGSTOP) and resuming continues them: they survive, as a real backend's
must. A project session copies the project into its guest at the same absolute path and keeps a baseline; a
review compares guest and baseline (and the host, for conflicts), frozen with the guest's content; apply checks
each choice against that review and refuses an item whose guest side changed since. Checkpoints copy the guest's
files (processes are not kept: the fake has no memory to save).
"""

from __future__ import annotations

import hashlib
import secrets
import shutil
import signal as signals
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from tests.unit.fakeguest import FakeFiles, FakeProcesses, Guest
from vmsandbox.core.sandbox.interface import ConflictError, NotFoundError, NotRunningError
from vmsandbox.core.sandbox.model import (
    NO_END,
    Applied,
    Badge,
    Checkpoint,
    Choice,
    Hold,
    Hunk,
    Refusal,
    Review,
    ReviewItem,
    Sandbox,
    SandboxSpec,
    State,
    check_taken,
)
from vmsandbox.core.sandbox.names import BlueprintName, CheckpointLabel, Digest, SessionName, SnapshotRef, Token
from vmsandbox.sync.review import hunks

QUARANTINED = (".envrc", ".gitattributes")


@dataclass
class Session:
    sandbox: Sandbox
    guest: Guest
    processes: FakeProcesses
    baseline: Path | None = None
    checkpoints: dict[str, Checkpoint] = field(default_factory=dict)
    reviews: dict[str, tuple[Review, dict[str, bytes | None]]] = field(default_factory=dict)

    @property
    def project(self) -> Path | None:
        return Path(self.sandbox.project) if self.sandbox.project else None

    def guest_project(self) -> Path:
        assert self.project is not None
        return self.guest.root / str(self.project).lstrip("/")


def files_of(top: Path) -> dict[str, bytes]:
    return {str(p.relative_to(top)): p.read_bytes() for p in sorted(top.rglob("*")) if p.is_file()}


def digest(content: bytes | None) -> Digest:
    return Digest(hashlib.sha256(b"-" if content is None else b"+" + content).hexdigest()[:32])


class FakeBackend:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.sessions: dict[str, Session] = {}
        self.ended: list[str] = []

    def _session(self, name: SessionName) -> Session:
        found = self.sessions.get(name.value)
        if found is None:
            raise NotFoundError(f"no session {name}", hint="`Sandbox.list()` lists the sessions")
        return found

    def _make(self, spec: SandboxSpec, source: Guest | None = None) -> Sandbox:
        if spec.name.value in self.sessions:
            raise ConflictError(f"a session {spec.name} exists")
        guest = Guest(self.root / spec.name.value / "fs")
        if source is not None:
            shutil.copytree(source.root, guest.root, dirs_exist_ok=True, symlinks=True)
        now = datetime.now(UTC)
        project = str(spec.project.value) if spec.project else None
        sandbox = Sandbox(spec.name, spec.blueprint.value, State.RUNNING, now, spec.end_at, 2, 2048, 10240,
                          dict(spec.metadata), project)  # fmt: skip
        session = Session(sandbox, guest, FakeProcesses(guest, dict(spec.envs)))
        if spec.project is not None and source is None:
            session.baseline = self.root / spec.name.value / "baseline"
            shutil.copytree(spec.project.value, session.baseline)
            shutil.copytree(spec.project.value, session.guest_project())
        self.sessions[spec.name.value] = session
        return sandbox

    def create(self, spec: SandboxSpec) -> Sandbox:
        return self._make(spec)

    def adopt(self, name: SessionName) -> Sandbox:
        """A session a person started at the terminal, as the real backend lists it: no end kept for it."""
        spec = SandboxSpec(name, BlueprintName("base"), None, NO_END)
        made = self._make(spec)
        self._session(name).sandbox = replace(made, timed=False)
        return self.sandbox(name)

    def sandboxes(self) -> Sequence[Sandbox]:
        return [s.sandbox for s in self.sessions.values()]

    def sandbox(self, name: SessionName) -> Sandbox:
        return self._session(name).sandbox

    def born(self, name: SessionName) -> datetime | None:
        found = self.sessions.get(name.value)
        return None if found is None else found.sandbox.started_at

    def kill(self, name: SessionName) -> None:
        session = self._session(name)
        session.processes.end()
        del self.sessions[name.value]
        self.ended.append(name.value)

    def _state(self, session: Session, state: State) -> None:
        session.sandbox = replace(session.sandbox, state=state)

    def pause(self, name: SessionName) -> None:
        session = self._session(name)
        if session.sandbox.state is State.PAUSED:
            raise ConflictError(f"session {name} is paused already")
        session.processes.each(signals.SIGSTOP)
        self._state(session, State.PAUSED)
        session.sandbox = replace(session.sandbox, end_at=NO_END)  # (a paused sandbox has no end)

    def resume(self, name: SessionName) -> Sandbox:
        session = self._session(name)
        session.processes.each(signals.SIGCONT)
        self._state(session, State.RUNNING)
        return session.sandbox

    def set_end(self, name: SessionName, end_at: datetime) -> None:
        session = self._session(name)
        if not session.sandbox.timed:
            raise ConflictError(
                f"session {name} was started at the terminal: the API keeps no end for it",
                hint=f"end it with `vmsandbox rm {name}` when it is done",
            )
        session.sandbox = replace(session.sandbox, end_at=end_at)

    def checkpoint(self, name: SessionName, label: CheckpointLabel | None) -> Checkpoint:
        session = self._session(name)
        label = label or CheckpointLabel(f"cp-{len(session.checkpoints) + 1}")
        if label.value in session.checkpoints:
            raise ConflictError(f"session {name} has a checkpoint {label}", hint="pick another label")
        shutil.copytree(session.guest.root, self.root / name.value / "checkpoints" / label.value, symlinks=True)
        found = Checkpoint(SnapshotRef(name, label), datetime.now(UTC))
        session.checkpoints[label.value] = found
        return found

    def checkpoints(self, name: SessionName | None) -> Sequence[Checkpoint]:
        chosen = [self._session(name)] if name is not None else list(self.sessions.values())
        return [c for s in chosen for c in s.checkpoints.values()]

    def _checkpoint_dir(self, name: SessionName, label: CheckpointLabel) -> Path:
        if label.value not in self._session(name).checkpoints:
            raise NotFoundError(f"session {name} has no checkpoint {label}")
        return self.root / name.value / "checkpoints" / label.value

    def rollback(self, name: SessionName, label: CheckpointLabel) -> Sandbox:
        session, saved = self._session(name), self._checkpoint_dir(name, label)
        shutil.rmtree(session.guest.root)
        shutil.copytree(saved, session.guest.root, symlinks=True)
        return session.sandbox

    def fork(self, name: SessionName, label: CheckpointLabel | None, new: SessionName, end_at: datetime) -> Sandbox:
        session = self._session(name)
        source = Guest(self._checkpoint_dir(name, label)) if label is not None else session.guest
        spec = SandboxSpec(
            new,
            BlueprintName(session.sandbox.blueprint),
            None,
            end_at,
            session.processes.envs,
            session.sandbox.metadata,
        )
        made = self._make(spec, source)
        forked = self.sessions[new.value]
        forked.sandbox = replace(made, project=session.sandbox.project)
        forked.baseline = session.baseline
        return forked.sandbox

    def review(self, name: SessionName) -> Review:
        session = self._session(name)
        if session.baseline is None or session.project is None:
            raise ConflictError(f"session {name} has no project", hint="make it with POST /vmsandbox/v1/sessions")
        base, now, host = files_of(session.baseline), files_of(session.guest_project()), files_of(session.project)
        items, contents = [], {}
        for n, path in enumerate(sorted(set(base) | set(now))):
            old, new = base.get(path), now.get(path)
            if old == new:
                continue
            holds = [Hold(Badge.QUARANTINED, "a file that runs on the host later")] if path in QUARANTINED else []
            if host.get(path) != old:
                holds.append(Hold(Badge.CONFLICT, "the host changed it too"))
            kind = "added" if old is None else "deleted" if new is None else "modified"
            found = hunks.hunks(old, new) if old is not None and new is not None else []
            lines_old, lines_new = hunks.lines(old or b""), hunks.lines(new or b"")
            shown = tuple(
                Hunk(
                    Token(f"h{h.index}"),
                    h.old_start + 1,
                    tuple(x.decode() for x in lines_old[h.old_start : h.old_end]),
                    h.new_start + 1,
                    tuple(x.decode() for x in lines_new[h.new_start : h.new_end]),
                )
                for h in found
            )
            status = "conflict" if any(h.badge is Badge.CONFLICT for h in holds) else "apply"
            mode = None if new is None else (session.guest_project() / path).stat().st_mode & 0o775
            items.append(
                ReviewItem(
                    Token(f"i{n}"), path, kind, status, digest(new), tuple(holds), shown,
                    entry_type=None if new is None else "file", mode=mode,
                )
            )  # fmt: skip
            contents[f"i{n}"] = new
        review = Review(Token(secrets.token_hex(8)), name, datetime.now(UTC), tuple(items))
        session.reviews[review.id.value] = (review, contents)
        return review

    def reviewed(self, name: SessionName, review: Token) -> Review:
        found = self._session(name).reviews.get(review.value)
        if found is None:
            raise NotFoundError(f"session {name} has no review {review}", hint="read one with POST …/reviews")
        return found[0]

    def apply(
        self, name: SessionName, review: Token, choices: Sequence[Choice], include: Collection[Badge] = ()
    ) -> Applied:
        session = self._session(name)
        shown, contents = session.reviews.get(review.value) or (None, {})
        if shown is None:
            raise NotFoundError(f"session {name} has no review {review}")
        assert session.project is not None and session.baseline is not None
        check_taken(shown.items, choices, include)  # (the core's rule, as the real backend applies it)
        items = {i.id.value: i for i in shown.items}
        done, refused = [], []
        for choice in choices:
            item = items.get(choice.item.value)
            reason = self._refusal(session, item, choice, contents)
            if reason is not None or item is None:
                refused.append(Refusal(choice.item, reason or "not in this review"))
                continue
            new = contents[item.id.value]
            target = session.project / item.path
            if new is None:
                target.unlink(missing_ok=True)
            else:
                if choice.hunks is not None:
                    chosen = {int(h.value[1:]) for h in choice.hunks}
                    new = hunks.compose((session.baseline / item.path).read_bytes(), new, chosen)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(new)
            done.append(item.id)
        return Applied(tuple(done), tuple(refused), len(items) - len(done))

    def _refusal(
        self, session: Session, item: ReviewItem | None, choice: Choice, contents: dict[str, bytes | None]
    ) -> str | None:
        if item is None:
            return "not in this review"
        if choice.digest != item.digest:
            return "not the digest this review showed for it"
        now = session.guest_project() / item.path
        if digest(now.read_bytes() if now.is_file() else None) != digest(contents[item.id.value]):
            return "the guest changed it after the review was read"
        if any(h.badge is Badge.CONFLICT for h in item.holds):
            return "the host changed it too"
        if choice.hunks is not None and not {h.id for h in item.hunks} >= set(choice.hunks):
            return "a hunk that is not in this item"
        return None

    def processes(self, name: SessionName) -> FakeProcesses:
        session = self._session(name)
        if session.sandbox.state is not State.RUNNING:
            raise NotRunningError(f"session {name} is paused", hint=f"resume it with Sandbox.connect({name.value!r})")
        return session.processes

    def files(self, name: SessionName) -> FakeFiles:
        return FakeFiles(self.processes(name).guest)

    def close(self) -> None:
        for session in list(self.sessions.values()):
            session.processes.end()
