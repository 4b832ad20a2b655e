"""A review as data: the plan of what the guest changed (grouped as a person reads it), the decisions that
come back from whoever reviews it (a person at a terminal, `--yes`, later a web page), and carrying them out.

The core never asks anything: the CLI shows the plan, asks, and hands back Decisions.
"""

from __future__ import annotations

import dataclasses
import shutil
from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from vmsandbox import failpoint
from vmsandbox.errors import VmsandboxError
from vmsandbox.sync.git import fetch as commitfetch
from vmsandbox.sync.git import refs
from vmsandbox.sync.land import write as apply
from vmsandbox.sync.review import gather as changes
from vmsandbox.sync.review import mass
from vmsandbox.sync.review.compare import Change, Status
from vmsandbox.sync.review.gather import Gathered
from vmsandbox.sync.review.risk import nested_git_dir
from vmsandbox.sync.review.take import Take
from vmsandbox.sync.tree.manifest import DIR, FILE

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
        """Why --yes leaves it: not reviewable source (holds.py)."""
        return self.first.held

    @property
    def binary(self) -> bool:
        return any(c.binary for c in self.changes)

    @property
    def secret(self) -> str | None:
        """What looks like a credential in it (never applied by --yes)."""
        return next((c.secret for c in self.changes if c.secret), None)


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
    mass: str | None = None  # why it is a mass change (mass.py): shown grouped, never applied by --yes alone
    id: str = ""  # the frozen review's (sync.frozen): what a front end names when it hands back a choice

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


def make(g: Gathered, only: list[str] | None = None, *, limits: mass.Limits | None = None) -> Plan:
    shown = select_paths(g.changes, g.project, only or [])
    in_view = {c.path for c in shown}
    todo = [c for c in changes.pending(g) if c.path in in_view]
    return Plan(g, shown, grouped(todo), (limits or mass.Limits()).judge(todo))


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
    massed: tuple[Item, ...] = ()  # a mass change's items, left pending by --yes (mass.py)
    secret: tuple[Item, ...] = ()  # changes holding what looks like a credential: never applied by --yes
    contents: Mapping[str, bytes] = field(default_factory=dict)  # path -> what to write instead of the guest's
    # version (the hunks a person chose, their edit of a merge); a merged change without one gets its merge

    @classmethod
    def safe(cls, plan: Plan, take: Take) -> Decisions:
        """`--yes`: every safe, reviewable change (quarantined and ignored ones too if `take` says so) and the
        commits."""
        if plan.mass is not None and not take.mass:  # nothing of it lands unseen
            return cls(massed=tuple(plan.todo), take_commits=plan.gathered.refs_changed, commit_take=take)
        held: list[Item] = []
        ignored: list[Item] = []
        binary: list[Item] = []
        accept: list[Item] = []
        secret: list[Item] = []
        for i in plan.todo:  # one pass: the first reason that holds an item back is the one it is reported by
            if i.quarantined and not take.risky:
                held.append(i)
            elif i.held and not take.ignored:
                ignored.append(i)
            elif i.binary and not take.binary:
                binary.append(i)
            elif i.secret:  # whatever else is taken: no flag takes it
                secret.append(i)
            else:
                accept.append(i)
        # nothing held is half-applied: a new directory that holds only what waits, waits with it
        buckets = [held, ignored, binary, secret]
        for shell, below in empty_shells(accept, plan.todo):
            accept.remove(shell)
            next(b for b in buckets if any(x is below for x in b)).append(shell)
        return cls(
            tuple(accept), tuple(held), plan.gathered.refs_changed, tuple(ignored), take, tuple(binary),
            secret=tuple(secret),
        )  # fmt: skip


def empty_shells(accept: list[Item], todo: list[Item]) -> list[tuple[Item, Item]]:
    """The accepted new directories that only hold changes left pending, deepest first, each with the first item
    below it: applied alone, each would make an empty shell on the host of what was held back (a `__pycache__`
    of held bytecode)."""
    ordered = sorted(todo, key=lambda i: i.first.path)  # what is below a directory is one run of this order
    keys = [i.first.path for i in ordered]
    taken = {id(i) for i in accept}
    shells = []
    new_dirs = [i for i in accept if i.kind == "added" and i.first.guest is not None and i.first.guest.kind == DIR]
    for i in sorted(new_dirs, key=lambda i: -i.first.path.count("/")):  # deepest first: a shell's parent may be one
        prefix = i.first.path + "/"
        below = []
        for item in ordered[bisect_left(keys, prefix) :]:
            if not item.first.path.startswith(prefix):
                break
            below.append(item)
        if below and not any(id(item) in taken for item in below):
            taken.discard(id(i))
            shells.append((i, below[0]))  # (a shell below it comes first in this list: placed before it)
    return shells


@dataclass
class Outcome:
    applied: list[str] = field(default_factory=list)
    merged: list[str] = field(default_factory=list)  # both sides' edits, merged (or as a person resolved them)
    conflicts: list[str] = field(default_factory=list)  # guest copy kept beside the file
    quarantined: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  # not reviewable source: left pending by --yes
    binary: list[str] = field(default_factory=list)  # binary files left pending by --yes
    massed: str | None = None  # a mass change left pending by --yes: why it is one
    secrets: list[str] = field(default_factory=list)  # what looks like a credential, left pending by --yes
    skipped: list[str] = field(default_factory=list)
    already: list[str] = field(default_factory=list)  # accepted, but dealt with since (another review's apply)
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
    out.massed = plan.mass if decisions.massed else None
    out.secrets = [f"{i.label} ({i.secret})" for i in decisions.secret]
    decided = {
        id(i)
        for i in (
            *decisions.accept,
            *decisions.held,
            *decisions.ignored,
            *decisions.binary,
            *decisions.massed,
            *decisions.secret,
        )
    }
    out.skipped = [i.label for i in plan.todo if id(i) not in decided]
    still = {c.path for c in changes.pending(g)}  # another review's apply may have dealt with some since
    accepted = [c for i in decisions.accept for c in i.changes]
    out.already = [c.path for c in accepted if c.path not in still]
    execute(g, [c for c in accepted if c.path in still], out, decisions.contents)
    if decisions.take_commits:
        try:
            fetched = commitfetch.fetch_commits(g, take=decisions.commit_take)
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


def chosen_content(c: Change, contents: Mapping[str, bytes]) -> bytes | None:
    """What is written instead of the guest's version: the person's choice, else a clean merge."""
    data = contents.get(c.path)
    if data is None and c.status is Status.MERGED and c.merge is not None:
        return c.merge.text
    return data if c.guest is not None and c.guest.kind == FILE else None


def execute(g: Gathered, accepted: list[Change], out: Outcome, contents: Mapping[str, bytes] | None = None) -> None:
    """Apply the accepted changes in a safe order (merges and chosen contents written as given); conflicts
    nobody resolved keep the guest version beside the file."""
    owner = apply.Owner(g.target.uid, g.target.gid)
    check_space(g, accepted)
    done: list[Change] = []
    try:
        for c in apply.order(accepted):
            failpoint.hit("pull.apply")
            try:
                data = chosen_content(c, contents or {})
                if data is not None:
                    apply.write_content(g.project, c, data, owner)
                    (out.merged if c.status in (Status.MERGED, Status.CONFLICT) else out.applied).append(c.path)
                elif c.status is Status.CONFLICT:
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
