"""The extension's JSON (`/vmsandbox/v1/…`): what E2B has no word for. camelCase like E2B's; pydantic models
that check what comes in, shape what goes out and give openapi.py its schemas."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from vmsandbox.api.plane.controlwire import MAX_ENVS, MAX_METADATA, MAX_TIMEOUT, Key, Value
from vmsandbox.core.sandbox import model
from vmsandbox.core.views import madeby
from vmsandbox.core.views.madeby import Maker, Step

MAX_CHOICES = 10_000
# A review's answer comes in pages (the guest decides how many items and lines there are): at most
# REVIEW_PAGE items, and no more than PAGE_BYTES of their lines unless one item alone is more; an item whose lines
# pass ITEM_BYTES is listed without them (taken or left whole; `vmsandbox diff NAME` shows it).
REVIEW_PAGE = 100
PAGE_BYTES = 1024**2
ITEM_BYTES = 4 * 1024**2


class Wire(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class NewSession(Wire):
    """A session on a project of this machine, captured as `vmsandbox run PROJECT` captures it."""

    project: str = Field(max_length=4096, description="the project's absolute path on this machine")
    blueprint: str = Field(default="base", max_length=40)
    name: str | None = Field(default=None, max_length=40, description="default: BLUEPRINT-xxxxxxxx")
    timeout: int | None = Field(default=None, ge=1, le=MAX_TIMEOUT, description="seconds (default 300)")
    envs: dict[Key, Value] = Field(default_factory=dict, max_length=MAX_ENVS)
    metadata: dict[Key, Value] = Field(default_factory=dict, max_length=MAX_METADATA)


class ChoiceIn(Wire):
    item: str = Field(max_length=64)
    digest: str = Field(max_length=128, description="the item's digest as the review gave it")
    hunks: list[str] | None = Field(default=None, max_length=MAX_CHOICES, description="default: the whole item")


Take = Literal["quarantined", "ignored", "binary", "secret", "mass"]  # the holds a choice must take (model.TAKES)


class ApplyIn(Wire):
    choices: list[ChoiceIn] = Field(max_length=MAX_CHOICES)
    include: list[Take] = Field(
        default_factory=list,
        max_length=len(model.TAKES),
        description="the holds the chosen items may carry (the terminal's --include-risky, --include-ignored, "
        "--include-binary, --include-mass; a secret is taken only so): a chosen item held for one not named here "
        "is refused with a 400 and nothing is applied",
    )


class CheckpointIn(Wire):
    label: str | None = Field(default=None, max_length=40)


class RollbackIn(Wire):
    label: str = Field(max_length=40)


class ForkIn(Wire):
    label: str | None = Field(default=None, max_length=40, description="default: from the session as it is now")
    name: str | None = Field(default=None, max_length=40)
    timeout: int | None = Field(default=None, ge=1, le=MAX_TIMEOUT)


class SessionOut(Wire):
    name: str
    blueprint: str
    state: str
    project: str | None
    started_at: datetime
    end_at: datetime
    cpus: int
    memory_mib: int
    disk_mib: int
    metadata: dict[str, str]


class CheckpointOut(Wire):
    snapshot_id: str = Field(alias="snapshotID")
    session: str
    label: str
    taken_at: datetime


class HoldOut(Wire):
    badge: str
    reason: str


class MakerOut(Wire):
    """A process that wrote a hunk or a file, as the guest's journal named it: the guest's word (but for the step's
    command), never a reason to apply."""

    step: str = Field(description="the id of the step it ran in (see the review's steps), or `outside`")
    command: str = Field(description="that step's command, as the host kept it (empty outside any step)")
    argv: list[str] = Field(
        description="the writer's argv, as the guest said (empty: not known), at most 20 words of 200 characters"
    )
    argv_more: int = Field(default=0, description="how many more words its argv had (not sent)")
    exe: str = Field(description="the writer's executable, as the guest said")
    badges: list[str] = Field(description="why to look twice: install script, git hook, outside any step, …")


class StepOut(Wire):
    """A command the session was asked to run (exec, run, shell, an API or MCP command), as the host kept it; its
    egress lines are what the proxy logged while it ran."""

    step: str
    number: int = Field(description="its place in the order the steps started, from 1")
    command: str
    started: float = Field(description="epoch seconds")
    ended: float | None = Field(description="epoch seconds; null: still running")
    exit: int | None
    how: str = Field(description="exec, run, shell, api, mcp or agent")
    egress: list[str] = Field(description="at most 50 of the requests the proxy logged while it ran")
    egress_more: int = Field(default=0, description="how many more it logged (not sent)")


class ProvenanceOut(Wire):
    guest_word: bool = Field(description="always true: who made what is as the guest's journal reported it")
    incomplete: str | None = Field(description="why it is partial; null: complete")


class HunkOut(Wire):
    id: str
    old_start: int
    old_lines: list[str]
    new_start: int
    new_lines: list[str]
    made_by: list[MakerOut] = Field(
        default_factory=list, description="who wrote it (empty: not traced), at most 8 writers"
    )
    made_by_more: int = Field(default=0, description="how many more writers it had (not sent)")


class ItemOut(Wire):
    id: str
    path: str
    kind: str
    status: str
    digest: str
    entry_type: str | None = Field(description="what lands: file, dir, symlink or other; null: deleted (or many)")
    mode: str | None = Field(description="its permission bits as they land, in octal (`0755`); null: none land")
    target: str | None = Field(description="a symbolic link's target as it lands; null: not a link")
    holds: list[HoldOut]
    hunks: list[HunkOut]
    hunks_shown: bool = Field(description="false: its lines are too many to send; it is taken or left whole")
    hunk_count: int
    made_by: list[MakerOut] = Field(
        default_factory=list,
        description="its writers (its hunks say which wrote what), at most 8; empty: not traced",
    )
    made_by_more: int = Field(default=0, description="how many more writers it had (not sent)")


class ReviewOut(Wire):
    id: str
    session: str
    made_at: datetime
    items: list[ItemOut] = Field(description="one page of the review's items, in its order")
    total: int = Field(description="how many items the review holds")
    next_token: str | None = Field(description="the nextToken of the next page; null: this was the last")
    refused: list[str]
    steps: list[StepOut] = Field(
        default_factory=list,
        description="the session's steps, in the order they started: the newest 200, and every step a maker of "
        "this page names (`number` is each one's place among all of them)",
    )
    steps_more: int = Field(default=0, description="how many steps are not listed")
    provenance: ProvenanceOut | None = Field(default=None, description="null: who made what is not known")


class RefusalOut(Wire):
    item: str
    reason: str


class AppliedOut(Wire):
    applied: list[str]
    refused: list[RefusalOut]
    left: int


def session(s: model.Sandbox) -> SessionOut:
    return SessionOut(
        name=s.name.value,
        blueprint=s.blueprint,
        state=s.state.value,
        project=s.project,
        started_at=s.started_at,
        end_at=s.end_at,
        cpus=s.cpus,
        memory_mib=s.memory_mib,
        disk_mib=s.disk_mib,
        metadata=dict(s.metadata),
    )


def checkpoint(c: model.Checkpoint) -> CheckpointOut:
    ref = c.snapshot
    return CheckpointOut(snapshotID=str(ref), session=ref.session.value, label=ref.label.value, taken_at=c.taken_at)


def review(r: model.Review, start: int = 0, most: int = REVIEW_PAGE) -> ReviewOut:
    """One page of a review: items from `start`, at most `most` of them and PAGE_BYTES of their lines (one
    item at least, so every page moves on)."""
    items: list[ItemOut] = []
    used = 0
    at = start
    while at < len(r.items) and len(items) < most:
        item = r.items[at]
        size = _size(item)
        shown = size <= ITEM_BYTES
        if items and shown and used + size > PAGE_BYTES:
            break
        items.append(_item(item, shown))
        used += size if shown else 0
        at += 1
    named = {m.step for i in items for h in i.hunks for m in h.made_by} | {m.step for i in items for m in i.made_by}
    listed = madeby.listed(r.steps, named)
    return ReviewOut(
        id=r.id.value,
        session=r.session.value,
        made_at=r.made_at,
        items=items,
        total=len(r.items),
        next_token=str(at) if at < len(r.items) else None,
        refused=list(r.refused),
        steps=[_step(s, n) for n, s in listed],
        steps_more=len(r.steps) - len(listed),
        provenance=ProvenanceOut(guest_word=True, incomplete=r.incomplete) if r.traced else None,
    )


def _step(s: Step, number: int) -> StepOut:
    most = madeby.EGRESS_LINES
    return StepOut(step=s.id, number=number, command=s.command, started=s.started, ended=s.ended, exit=s.exit,
                   how=s.how, egress=list(s.egress[:most]), egress_more=max(len(s.egress) - most, 0))  # fmt: skip


def _makers(found: tuple[Maker, ...]) -> list[MakerOut]:
    """At most madeby.MOST_MAKERS of a hunk's or an item's makers, each argv cut (the guest chooses its size)."""
    return [
        MakerOut(
            step=m.step, command=m.command, argv=[a[: madeby.ARGV_WORD] for a in m.argv[: madeby.ARGV_WORDS]],
            argv_more=max(len(m.argv) - madeby.ARGV_WORDS, 0), exe=m.exe[: madeby.ARGV_WORD], badges=list(m.badges),
        )
        for m in found[: madeby.MOST_MAKERS]
    ]  # fmt: skip


def _more(found: tuple[Maker, ...]) -> int:
    return max(len(found) - madeby.MOST_MAKERS, 0)


def _size(i: model.ReviewItem) -> int:
    """What an item's lines weigh in an answer (a bound from below of their JSON). Its makers do not count: they
    are cut to a bounded size, and the guest's argv must not decide whether its hunks are shown."""
    lines = sum(len(line) for h in i.hunks for line in (*h.old_lines, *h.new_lines))
    return lines + 64 * len(i.hunks) + len(i.target or "")


def _item(i: model.ReviewItem, shown: bool = True) -> ItemOut:
    return ItemOut(
        id=i.id.value,
        path=i.path,
        kind=i.kind,
        status=i.status,
        digest=i.digest.value,
        entry_type=i.entry_type,
        mode=None if i.mode is None else f"{i.mode:04o}",
        target=i.target,
        holds=[HoldOut(badge=h.badge.value, reason=h.reason) for h in i.holds],
        hunks=[
            HunkOut(
                id=h.id.value,
                old_start=h.old_start,
                old_lines=list(h.old_lines),
                new_start=h.new_start,
                new_lines=list(h.new_lines),
                made_by=_makers(h.made_by),
                made_by_more=_more(h.made_by),
            )
            for h in (i.hunks if shown else ())
        ],
        hunks_shown=shown,
        hunk_count=len(i.hunks),
        made_by=_makers(i.made_by if shown else ()),
        made_by_more=_more(i.made_by) if shown else 0,
    )


def applied(a: model.Applied) -> AppliedOut:
    return AppliedOut(
        applied=[t.value for t in a.applied],
        refused=[RefusalOut(item=r.item.value, reason=r.reason) for r in a.refused],
        left=a.left,
    )
