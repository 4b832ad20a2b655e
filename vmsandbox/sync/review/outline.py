"""A review as a person reads it, like a pull request: the source changes first, one by one; then what is held
back for an explicit choice, in groups — credentials, quarantined paths, paths the project ignores, binary files,
a mass change's directories — each one line with its reason and the one choice that takes it (`--include-*` at
the terminal, a checkbox on the page), its items shown on request.

Every front end draws the same outline of the same frozen plan, so the page's choice "apply these 12" names the
same items the page listed under that line (web/review.py checks each by its number and hash).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from vmsandbox.sync.review import holds, mass
from vmsandbox.sync.review.plan import Item, empty_shells

# pull's options that make --yes take what is held, in the order they are named; credentials have none
FLAGS = ("--include-mass", "--include-risky", "--include-ignored", "--include-binary")
ORDER = ("secret", "risky", "ignored", "binary")  # the groups in the order they are shown; a mass change's after


def hold_of(item: Item, massed: bool) -> str | None:
    """The group an item is held in, by its first reason in ORDER; a mass change's other items by directory and
    kind (`mass-<hash>`); None for a change a person reads as source (and `--yes` takes)."""
    if item.secret:
        return "secret"
    if item.quarantined:
        return "risky"
    if item.ignored:
        return "ignored"
    if item.binary:
        return "binary"
    if massed:
        where, kind = _place(item)
        return "mass-" + hashlib.sha256(f"{where}\0{kind}".encode()).hexdigest()[:12]
    return None


def flags_of(item: Item, massed: bool) -> tuple[str, ...]:
    """The `--include-*` options that make `--yes` take the item (none can take a credential: empty)."""
    if item.secret:
        return ()
    needed = (massed, item.quarantined, bool(item.ignored), item.binary)
    return tuple(flag for flag, wanted in zip(FLAGS, needed, strict=True) if wanted)


@dataclass(frozen=True)
class Group:
    key: str  # "secret", "risky", "ignored", "binary" or "mass-<hash>": plain ASCII, a form field's name
    reason: str  # why they are held, one line
    flags: tuple[str, ...]  # what takes them all with --yes; empty: only a person's explicit choice
    numbers: tuple[int, ...]  # the items' indexes in the list outlined (a plan's todo)


@dataclass(frozen=True)
class Outline:
    source: tuple[int, ...]  # the changes read one by one, in the plan's order
    groups: tuple[Group, ...]

    @property
    def order(self) -> list[int]:
        """Every item's index, as a person reads them: source first, then group by group."""
        return [*self.source, *(n for g in self.groups for n in g.numbers)]


def keys(items: Sequence[Item], massed: bool = False) -> list[str | None]:
    """Each item's group (hold_of), and a new directory that holds only what is held goes with it (the group of
    the first item below it), as `--yes` leaves it (plan.empty_shells): applied alone it would be an empty
    shell on the host of what was held back."""
    found = [hold_of(item, massed) for item in items]
    number = {id(item): n for n, item in enumerate(items)}
    for shell, below in empty_shells([i for i, k in zip(items, found, strict=True) if k is None], list(items)):
        found[number[id(shell)]] = found[number[id(below)]]  # (deepest first: a shell below it has its key)
    return found


def outline(items: Sequence[Item], massed: bool = False) -> Outline:
    """The items (a plan's todo; `massed`: it is a mass change) as source changes and held groups."""
    source: list[int] = []
    members: dict[str, list[int]] = {}
    for n, key in enumerate(keys(items, massed)):
        if key is None:
            source.append(n)
        else:
            members.setdefault(key, []).append(n)
    groups = [Group(k, _reason(k, items, ns), _flags(items, ns, massed), tuple(ns)) for k, ns in members.items()]
    rank = {k: i for i, k in enumerate(ORDER)}
    groups.sort(key=lambda g: (rank.get(g.key, len(ORDER)), -len(g.numbers), g.reason))
    return Outline(tuple(source), tuple(groups))


def _place(item: Item) -> tuple[str, str]:
    return mass.place(item.first.path), item.kind


def _reason(key: str, items: Sequence[Item], numbers: list[int]) -> str:
    held = [items[n] for n in numbers]
    if key == "secret":
        return "may hold credentials"
    if key == "risky":
        return "quarantined: " + _distinct(str(i.risky) for i in held)
    if key == "ignored":
        return _ignored(str(i.ignored) for i in held)
    if key == "binary":
        return "binary files"
    where, kind = _place(held[0])
    return f"a mass change: {kind} under {where}"


def _ignored(reasons: Iterable[str]) -> str:
    """What the project ignores, said short: `.gitignore`'s paths, the derived trees by name (holds.py)."""
    found = list(dict.fromkeys(reasons))
    derived = [r.removeprefix("derived (").removesuffix("), not source") for r in found if r.startswith("derived (")]
    parts = ["ignored by .gitignore"] if holds.IGNORED in found else []
    parts += [f"derived, not source: {', '.join(derived)}"] if derived else []
    return "; ".join(parts + [r for r in found if r != holds.IGNORED and not r.startswith("derived (")])


def _distinct(reasons: Iterable[str]) -> str:
    return "; ".join(dict.fromkeys(reasons))


def _flags(items: Sequence[Item], numbers: list[int], massed: bool) -> tuple[str, ...]:
    if any(items[n].secret for n in numbers):
        return ()
    every = {f for n in numbers for f in flags_of(items[n], massed)}
    return tuple(f for f in FLAGS if f in every)
