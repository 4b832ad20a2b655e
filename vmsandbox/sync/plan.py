"""A review as data: the plan of what the guest changed (grouped as a person reads it), the decisions that
come back from whoever reviews it (a person at a terminal, `--yes`, later a web page), and carrying them out.

The core never asks anything: the CLI shows the plan, asks, and hands back Decisions.
"""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from vmsandbox import confine, failpoint
from vmsandbox.errors import VmsandboxError
from vmsandbox.sync import apply, changes, commitreview, commits, refs
from vmsandbox.sync.changes import BUNDLE, Gathered, Origin
from vmsandbox.sync.compare import Change, Status
from vmsandbox.sync.risk import nested_git_dir
from vmsandbox.sync.take import Take
from vmsandbox.sync.tree import FILE

FREE_SPACE_RESERVE = 256 * 1024**2  # a pull never fills the project's filesystem to the last byte


@dataclass(frozen=True)
class Item:
    """What a person decides on at once: one change, or a whole repository nested in the project."""

    label: str
    changes: tuple[Change, ...]
    repository: bool = False  # the internals of a repository nested in the project

    @property
    def first(self) -> Change:
        return self.changes[0]

    @property
    def kind(self) -> str:
        return "repository" if self.repository else self.first.kind

    @property
    def risky(self) -> str | None:
        return self.first.risky

    @property
    def quarantined(self) -> bool:
        return self.risky is not None and self.first.status is not Status.UNSAFE

    @property
    def held(self) -> str | None:
        """Why --yes leaves it: not reviewable source (reviewable.py)."""
        return self.first.held

    @property
    def binary(self) -> bool:
        return any(c.binary for c in self.changes)


def grouped(found: list[Change]) -> list[Item]:
    """One item per change, except that everything inside a repository nested in the project (a `.git` below
    the top level) is one item, `DIR/.git/ (N paths)`. In path order."""
    order: list[str] = []
    members: dict[str, list[Change]] = {}
    for c in found:
        key = nested_git_dir(c.path)
        key = c.path if key is None else key + "/"
        if key not in members:
            order.append(key)
            members[key] = []
        members[key].append(c)
    return [
        Item(f"{key} ({len(members[key])} paths)", tuple(members[key]), repository=True)
        if key.endswith("/")
        else Item(key, tuple(members[key]))
        for key in order
    ]


def select_paths(found: list[Change], project: Path, wanted: list[str]) -> list[Change]:
    """Keep changes at or below the given paths (relative to the project, or absolute inside it)."""
    if not wanted:
        return found
    rels = []
    for w in wanted:
        p = Path(w)
        rel = p.relative_to(project) if p.is_absolute() and p.is_relative_to(project) else p
        rels.append(str(rel).strip("/"))
    return [c for c in found if any(r in ("", ".") or c.path == r or c.path.startswith(r + "/") for r in rels)]


@dataclass
class Plan:
    gathered: Gathered
    shown: list[Change]  # every change in view (PATHS), pending or not, refused included
    todo: list[Item]  # what is waiting for a decision

    @property
    def refused(self) -> list[str]:
        """One line per thing that can never be written, and why (the guest's repository included)."""
        lines = [f"{c.path}: {c.notes[0]}" for c in self.shown if c.status is Status.UNSAFE]
        if self.gathered.git_refused is not None:
            lines.append(f"the guest's commits: {self.gathered.git_refused}")
        return lines

    @property
    def empty(self) -> bool:
        return not self.shown and not self.gathered.refs_changed and self.gathered.git_refused is None


def make(g: Gathered, only: list[str] | None = None) -> Plan:
    shown = select_paths(g.changes, g.project, only or [])
    in_view = {c.path for c in shown}
    return Plan(g, shown, grouped([c for c in changes.pending(g) if c.path in in_view]))


@dataclass(frozen=True)
class Decisions:
    """What to do with a plan: the items to apply (conflicts: keep the guest's copy beside the file), the
    ones held back on purpose (quarantine; not reviewable source), and whether to fetch the guest's commits."""

    accept: tuple[Item, ...] = ()
    held: tuple[Item, ...] = ()
    take_commits: bool = False
    ignored: tuple[Item, ...] = ()
    commit_take: Take = field(default_factory=Take)  # what the guest's commits may touch and still be fetched
    binary: tuple[Item, ...] = ()  # binary files left for an explicit choice

    @classmethod
    def safe(cls, plan: Plan, take: Take) -> Decisions:
        """`--yes`: every safe, reviewable change (quarantined and ignored ones too if `take` says so) and the
        commits."""
        held: list[Item] = []
        ignored: list[Item] = []
        binary: list[Item] = []
        accept: list[Item] = []
        for i in plan.todo:  # one pass: the first reason that holds an item back is the one it is reported by
            if i.quarantined and not take.risky:
                held.append(i)
            elif i.held and not take.ignored:
                ignored.append(i)
            elif i.binary and not take.binary:
                binary.append(i)
            else:
                accept.append(i)
        return cls(tuple(accept), tuple(held), plan.gathered.refs_changed, tuple(ignored), take, tuple(binary))


@dataclass
class Outcome:
    applied: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)  # guest copy kept beside the file
    quarantined: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  # not reviewable source: left pending by --yes
    binary: list[str] = field(default_factory=list)  # binary files left pending by --yes
    skipped: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    commits: list[str] = field(default_factory=list)
    left: int = 0  # changes still pending afterwards among those in view (PATHS)
    left_total: int = 0  # changes still pending afterwards in the whole session


def carry_out(plan: Plan, decisions: Decisions) -> Outcome:
    """Apply what was accepted (in a safe order), fetch the commits if asked; report everything else."""
    g = plan.gathered
    out = Outcome(refused=plan.refused)
    out.quarantined = [f"{i.label} ({i.risky})" for i in decisions.held]
    out.ignored = [i.label for i in decisions.ignored]
    out.binary = [i.label for i in decisions.binary]
    decided = {id(i) for i in (*decisions.accept, *decisions.held, *decisions.ignored, *decisions.binary)}
    out.skipped = [i.label for i in plan.todo if id(i) not in decided]
    execute(g, [c for i in decisions.accept for c in i.changes], out)
    if decisions.take_commits:
        try:
            fetched = fetch_commits(g, take=decisions.commit_take)
            out.commits = fetched.commits
            out.quarantined += fetched.held
            if fetched.refused is not None:
                out.refused.append(f"the guest's commits: {fetched.refused}")
        except refs.Refused as exc:
            out.refused.append(f"the guest's commits: {exc.message}")
        except VmsandboxError as exc:
            out.failed.append(f"git history: {exc.message}")
    remaining = changes.pending(g)
    in_view = {c.path for c in plan.shown}
    out.left = sum(1 for c in remaining if c.path in in_view)
    out.left_total = len(remaining)
    return out


def conflict_copy_name(path: str, session: str) -> str:
    return f"{path}.vmsandbox-{session}"


def _keep_conflict(g: Gathered, c: Change, owner: apply.Owner) -> str | None:
    if c.guest is None or c.guest.kind != FILE:
        return None
    beside = conflict_copy_name(c.path, g.target.name)
    not_executable = dataclasses.replace(c.guest, mode=c.guest.mode & 0o666)
    apply.copy_verified(g.source, g.project, c.path, not_executable, owner, dest=beside)
    return beside


def check_space(g: Gathered, accepted: list[Change]) -> None:
    """Before anything is written: the accepted files fit the sync budget and the project's filesystem (with a
    reserve). Otherwise nothing is applied."""
    need = sum(c.guest.size for c in accepted if c.guest is not None and c.guest.kind == FILE)
    if need > g.limit:
        raise VmsandboxError(
            f"the accepted changes add up to {need / 1024**2:.0f} MiB, more than the {g.limit // 1024**2} MiB "
            "a sync takes at once; nothing was applied",
            hint=f"pull part of it (`vmsandbox pull {g.target.name} PATHS`), or raise `sync_limit` in "
            "~/.config/vmsandbox/config.yaml",
        )
    free = shutil.disk_usage(g.project).free
    if need + FREE_SPACE_RESERVE > free:
        raise VmsandboxError(
            f"the accepted changes need {need / 1024**2:.0f} MiB and {g.project} has {free / 1024**2:.0f} MiB free "
            f"(keeping {FREE_SPACE_RESERVE // 1024**2} MiB in reserve); nothing was applied",
            hint="free space there, or pull part of it (`vmsandbox pull NAME PATHS`)",
        )


def execute(g: Gathered, accepted: list[Change], out: Outcome) -> None:
    """Apply the accepted changes in a safe order; conflicts keep the guest version beside the file."""
    owner = apply.Owner(g.target.uid, g.target.gid)
    check_space(g, accepted)
    done: list[Change] = []
    try:
        for c in apply.order(accepted):
            failpoint.hit("pull.apply")
            try:
                if c.status is Status.CONFLICT:
                    beside = _keep_conflict(g, c, owner)
                    kept = f" (guest version: {beside})" if beside else " (deleted in the guest)"
                    out.conflicts.append(c.path + kept)
                else:
                    apply.apply_one(g.project, g.source, c, owner)
                    out.applied.append(c.path)
                done.append(c)
            except VmsandboxError as exc:
                out.failed.append(f"{c.path}: {exc.message}")
            except OSError as exc:
                out.failed.append(f"{c.path}: {exc.strerror}")
    finally:
        changes.mark(g.target.files, done)


@dataclass(frozen=True)
class Fetched:
    commits: list[str]  # one line per new commit under refs/remotes/vmsandbox-<name>/
    held: list[str]  # one line per branch or tag held back: its commits touch risky, ignored or binary paths
    refused: str | None = None  # refs that could not be fetched at all, and why


def fetch_commits(g: Gathered, *, take: Take, keep_staged: bool = False) -> Fetched:
    """The guest's new or moved branches and tags, fetched into a staging namespace (commits.py; from an outbox,
    from the bundle exported earlier), reviewed like files and promoted to refs/remotes/vmsandbox-<name>/*
    where they touch nothing held back (risky, ignored, binary; unless `take` takes that kind: commitreview.py).
    `keep_staged`: every staged ref stays (the outbox bundles them all, held ones too; the caller drops them)."""
    t = g.target
    if not g.refs_changed or not refs.is_real_dir(t.project / ".git"):
        return Fetched([], [])
    refused = None
    if g.origin is not Origin.OUTBOX:
        refused = commits.fetch(t.project, g.source, t.files.baseline, t.name, t.uid, t.gid)
    else:
        commits.fetch_bundle(t.project, t.files.outbox / BUNDLE, t.name, t.uid, t.gid)
    who = confine.invoking_user(t.uid, t.gid)
    try:
        promoted, held = commitreview.promote(t.project, who, t.name, take=take)
    finally:
        if not keep_staged:
            commitreview.drop_staged(t.project, who, t.name)
    lines = commits.new_commits(t.project, who, commits.remote_prefix(t.name)) if promoted else []
    return Fetched(lines, held, refused)
