"""What the review page says of an item: what will happen to it if applied and if left (the badge beside its
choice says the one that is selected, in words, never a bare status), why it is held, and the facts beside.

A held item's words when left name the hold and the way to take it ("held: ignored by the project (.gitignore)
— pick to apply"); a conflict's when applied say where the guest's version goes ("kept beside the file").
"""

from __future__ import annotations

from dataclasses import dataclass

from vmsandbox.core.views import FILE, Item, Status

Badge = tuple[str, str]  # (css class, words)


@dataclass(frozen=True)
class Words:
    hold: str | None  # the first reason it is held (sync/review/outline.py's order), None for a source change
    on_apply: Badge  # what applying it does
    on_skip: Badge  # what leaving it does
    facts: list[Badge]  # the rest: other holds, overlapping hunks, notes


def hold(item: Item, key: str | None) -> str | None:
    """The words of the hold that puts the item in its group (`key`, outline.hold_of), None when it is not held."""
    if key is None:
        return None
    if key.startswith("mass-"):
        return "part of a mass change"
    own = {"secret": item.secret, "risky": item.risky and f"quarantined: {item.risky}", "ignored": item.ignored,
           "binary": "binary" if item.binary else None}  # fmt: skip
    return own.get(key) or "a new directory that holds only what is held"


def on_apply(item: Item) -> Badge:
    c = item.first
    if c.status is Status.MERGED:
        return "merged", "will merge with the host's edits"
    if c.status is Status.CONFLICT:
        if c.guest is None or c.guest.kind != FILE:
            return "conflict", "the host's version stays (conflict)"
        if c.merge is not None and not c.merge.clean:
            return "conflict", "your edit written, or untouched: kept beside the file (conflict)"
        return "conflict", "kept beside the file (conflict)"
    return "apply", "will delete" if item.kind == "deleted" else "will apply"


def words(item: Item, key: str | None) -> Words:
    """Everything the page says of an item held in group `key` (None: a source change)."""
    c = item.first
    held = hold(item, key)
    if held is not None:
        skip = ("held", f"held: {held} — pick to apply")
    elif c.status is Status.CONFLICT:
        skip = ("conflict", "conflict: left pending — pick to decide")
    else:
        skip = ("pending", "left pending")
    facts: list[Badge] = []
    if item.secret:
        facts.append(("secret", item.secret))
    if item.risky:
        facts.append(("risky", f"quarantined: {item.risky}"))
    if item.ignored:
        facts.append(("held", item.ignored))
    if item.binary:
        facts.append(("binary", "binary"))
    if c.merge is not None and not c.merge.clean:
        facts.append(("conflict", f"{c.merge.conflicts} overlapping hunk(s)"))
    facts = [f for f in facts if f[1] != held] + [("note", n) for n in c.notes]
    return Words(held, on_apply(item), skip, facts)
