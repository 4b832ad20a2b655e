"""The extension's JSON (`/vmsandbox/v1/…`): what E2B has no word for. camelCase like E2B's; pydantic models
that check what comes in, shape what goes out and give openapi.py its schemas."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from vmsandbox.api.plane.controlwire import MAX_ENVS, MAX_METADATA, MAX_TIMEOUT, Key, Value
from vmsandbox.core.sandbox import model

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


class HunkOut(Wire):
    id: str
    old_start: int
    old_lines: list[str]
    new_start: int
    new_lines: list[str]


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


class ReviewOut(Wire):
    id: str
    session: str
    made_at: datetime
    items: list[ItemOut] = Field(description="one page of the review's items, in its order")
    total: int = Field(description="how many items the review holds")
    next_token: str | None = Field(description="the nextToken of the next page; null: this was the last")
    refused: list[str]


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
    return ReviewOut(
        id=r.id.value,
        session=r.session.value,
        made_at=r.made_at,
        items=items,
        total=len(r.items),
        next_token=str(at) if at < len(r.items) else None,
        refused=list(r.refused),
    )


def _size(i: model.ReviewItem) -> int:
    """What an item's lines weigh in an answer (a bound from below of their JSON)."""
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
            )
            for h in (i.hunks if shown else ())
        ],
        hunks_shown=shown,
        hunk_count=len(i.hunks),
    )


def applied(a: model.Applied) -> AppliedOut:
    return AppliedOut(
        applied=[t.value for t in a.applied],
        refused=[RefusalOut(item=r.item.value, reason=r.reason) for r in a.refused],
        left=a.left,
    )
