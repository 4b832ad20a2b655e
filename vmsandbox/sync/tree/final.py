"""The project as it will be after a review is applied: at each path, what the host holds now and, where the guest
changed that path, the guest's entry too (a person may take it or leave it). The link judge (review.risk) asks
confine.resolve where a link leads in this tree, with every link already on the host and every link of the
guest's, each component resolved, and names compared the way the project's file system compares them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import chain

from vmsandbox.confine import resolve
from vmsandbox.confine.resolve import Node, Verdict
from vmsandbox.sync.tree.manifest import DIR, SYMLINK, Entry

UNDECIDED: Mapping[str, Entry | None] = {}


def node(entry: Entry | None) -> Node | None:
    if entry is None:
        return None
    if entry.kind == SYMLINK:
        return Node(resolve.LINK, entry.target)
    return Node(resolve.DIR if entry.kind == DIR else resolve.OTHER)


class Final:
    """`baseline`, `host` and `guest`: the three trees of a comparison (the host's may be read path by path:
    tree.views.Lookup). `fold`: the project's file system compares names case-insensitively
    (confine.beneath.Root.folds); then each tree that can be listed is looked up by folded names (one that
    cannot, the host's, is asked by the folded name and answers as its file system does). `kept`: paths where
    the host's entry stays whatever the person decides (changes that can never be written)."""

    def __init__(
        self,
        baseline: Mapping[str, Entry],
        host: Mapping[str, Entry],
        guest: Mapping[str, Entry],
        *,
        fold: bool,
        kept: Iterable[str] = (),
    ) -> None:
        self.trees = (baseline, host, guest)
        self.name = resolve.fold if fold else resolve.exact
        self.folded: list[dict[str, list[Entry]] | None] = [self._folded(t) for t in self.trees] if fold else []
        self.kept = {self.key(p) for p in kept}  # paths where the host's entry stays (changes never written)

    def key(self, path: str) -> str:
        """A path as the project's file system compares it."""
        return "/".join(self.name(p) for p in path.split("/"))

    def _folded(self, tree: Mapping[str, Entry]) -> dict[str, list[Entry]] | None:
        try:
            listed = list(tree.items())
        except TypeError:  # read path by path: its file system folds by itself
            return None
        found: dict[str, list[Entry]] = {}
        for path, entry in listed:
            found.setdefault(self.key(path), []).append(entry)
        return found

    def _entries(self, which: int, key: str) -> list[Entry | None]:
        index = self.folded[which] if self.folded else None
        if index is not None:
            return list(index.get(key, [None]))
        return [self.trees[which].get(key)]

    def choices(self, key: str, decided: Mapping[str, Entry | None] = UNDECIDED) -> list[Node | None]:
        """What `key` may hold once the review is applied: what `decided` says (a change judged as taken), else the
        host's entry, and the guest's too where it differs from the baseline."""
        if key in decided:
            return [node(decided[key])]
        if key in self.kept:
            return self.now(key)
        base, host, guest = (self._entries(i, key) for i in range(3))
        changed = [g for g in guest if g not in base]
        return [node(e) for e in chain(host, changed)]

    def now(self, key: str) -> list[Node | None]:
        """What `key` holds on the host now (nothing of the review taken)."""
        return [node(e) for e in self._entries(1, key)]

    def leads(self, at: str, target: str, decided: Mapping[str, Entry | None] = UNDECIDED) -> Verdict:
        """Where the link at `at` leads once the review is applied (decided: paths whose choice is fixed)."""
        return resolve.leads(at, target, lambda key: self.choices(key, decided), name=self.name)

    def leads_now(self, at: str, target: str) -> Verdict:
        """Where the link at `at` leads on the host as it is."""
        return resolve.leads(at, target, self.now, name=self.name)
