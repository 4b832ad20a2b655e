"""Where a link leads beneath a root, asked of a tree that need not exist yet (a review's tree as it will be).

A tree is given as a function from a path beneath the root to what may be there: a link and its target, a
directory, something else, or nothing — several at once where the tree is not decided (after a review, a path
the guest changed holds the guest's entry or the host's, as the person chooses). Every choice is followed.

The rules are the kernel's, made strict:
- an absolute target, a `..` above the top, more than MAX_HOPS links in one lookup, or more than MAX_STEPS
  steps over all the choices lead out (a loop can never be judged inside);
- a component that nothing holds as a directory or a link, with more of the path to follow, is *unresolved*:
  the kernel stops there today, and what will be there later is not known. The walk goes on past it as if it
  were a directory (the way `x/..` reads), so a link that leads out once `x` is made a directory is seen now,
  and told apart (OUT_ONCE_MADE) from one that leads out through what exists (OUT);
- names compare as the root's file system compares them: `fold` where it folds (ext4 casefold: a Unicode
  case-fold of the canonical decomposition).
"""

from __future__ import annotations

import enum
import unicodedata
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

LINK, DIR, OTHER = "link", "dir", "other"
MAX_HOPS = 40  # like the kernel's limit on links followed in one lookup
MAX_STEPS = 4096  # work bound over all choices


@dataclass(frozen=True)
class Node:
    """What a path holds, as far as resolving a name through it goes."""

    kind: str  # LINK, DIR or OTHER (a file, a FIFO, a device...)
    target: str | None = None  # a link's


Lookup = Callable[[str], Collection[Node | None]]  # what a path may hold (None: nothing there)


class Reach(enum.IntEnum):
    INSIDE = 0  # every way of following it stays beneath the root
    OUT_ONCE_MADE = 1  # it leads out once a component nobody has yet is made (a directory, or a link)
    OUT = 2  # it leads out through what is there


@dataclass
class Verdict:
    reach: Reach = Reach.INSIDE
    why: str | None = None  # how it leads out
    unresolved: str | None = None  # the first component nothing holds, with more of the path after it
    through: set[str] = field(default_factory=set)  # every path looked up on the way, every choice


def fold(name: str) -> str:
    """A name as a case-folding file system compares it (ext4's casefold: NFD, then a full Unicode case fold)."""
    return unicodedata.normalize("NFD", unicodedata.normalize("NFD", name).casefold())


def exact(name: str) -> str:
    return name


def leads(at: str, target: str, lookup: Lookup, *, name: Callable[[str], str] = exact) -> Verdict:
    """Where the link at `at` (a path beneath the root) with `target` leads, following the tree `lookup`
    describes; `name` compares names (`fold` on a file system that folds)."""
    walk = _Walk(lookup, name)
    if target.startswith("/"):
        walk.escape(f"it points to an absolute path ({target})", None)
    else:
        walk.follow([name(p) for p in at.split("/")[:-1]], target.split("/"), 1, None)
    return walk.verdict


class _Walk:
    def __init__(self, lookup: Lookup, name: Callable[[str], str]) -> None:
        self.lookup = lookup
        self.name = name
        self.steps = 0
        self.verdict = Verdict()

    def escape(self, why: str, missing: str | None) -> None:
        reach = Reach.OUT if missing is None else Reach.OUT_ONCE_MADE
        if reach > self.verdict.reach:
            self.verdict.reach = reach
            self.verdict.why = why if missing is None else f"{why}, once {missing} exists"

    def follow(self, base: list[str], todo: list[str], hops: int, missing: str | None) -> None:
        """Resolve `todo` from the directory `base`; a link met is followed in a walk of its own (a choice)."""
        at = 0
        while at < len(todo):
            self.steps += 1
            if self.steps > MAX_STEPS:
                self.escape("too many links to follow", None)
                return
            part = todo[at]
            at += 1
            if part in ("", "."):
                continue
            if part == "..":
                if not base:
                    self.escape("it leads above the project", missing)
                    return
                base = base[:-1]
                continue
            here = [*base, self.name(part)]
            key = "/".join(here)
            self.verdict.through.add(key)
            more = any(p not in ("", ".") for p in todo[at:])
            kinds = set()
            for node in set(self.lookup(key)):
                if node is None or node.kind != LINK:
                    kinds.add(None if node is None else node.kind)
                    continue
                if hops + 1 > MAX_HOPS:
                    self.escape("too many levels of symlinks", missing)
                elif (node.target or "").startswith("/"):
                    self.escape(f"it leads to {node.target} through {key}", missing)
                else:
                    self.follow(list(base), [*(node.target or "").split("/"), *todo[at:]], hops + 1, missing)
            if not kinds:  # a link in every choice: each was followed
                return
            if more and DIR not in kinds and missing is None:
                missing = key
                self.verdict.unresolved = self.verdict.unresolved or key
            base = here
