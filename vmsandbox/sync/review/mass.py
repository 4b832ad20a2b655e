"""The mass-change guard: a change too large for a person to read item by item is shown grouped, and `--yes`
does not apply it.

An agent that runs a formatter over a monorepo, vendors a dependency tree or rewrites line endings returns
thousands of files; a review of 40,000 lines is not read, and `--yes` would apply it unseen. Past a threshold
(files or bytes, the user's `mass_change_files` / `mass_change_size`) the review groups the changes by directory
and kind, and `--yes` leaves them pending (they wait with the session, its outbox once the VM is gone) and says
how to review them: the web review, a pull by parts, or `--include-mass`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from vmsandbox.sync.review.threeway import Change
from vmsandbox.sync.tree.manifest import FILE

GROUP_DEPTH = 2  # changes are grouped by their first two directory levels


@dataclass(frozen=True)
class Limits:
    files: int = 1000
    size: int = 1024**3  # bytes the guest's files add up to

    def judge(self, changes: Iterable[Change]) -> str | None:
        """Why these changes are a mass change, or None."""
        found = list(changes)
        size = sum(c.guest.size for c in found if c.guest is not None and c.guest.kind == FILE)
        if len(found) > self.files:
            return f"{len(found)} changed paths, more than mass_change_files ({self.files})"
        if size > self.size:
            return f"{size / 1024**2:.0f} MiB of changed files, more than mass_change_size ({self.size // 1024**2} MiB)"
        return None


@dataclass(frozen=True)
class Group:
    where: str  # a directory (its first levels), "." for the top
    kind: str  # added, modified, deleted, …
    count: int
    size: int  # bytes of the guest's files


def place(path: str) -> str:
    """The directory a change is counted under: its first GROUP_DEPTH levels (`a/b/`), "." for the top."""
    parts = path.split("/")[:-1][:GROUP_DEPTH]
    return "/".join(parts) + "/" if parts else "."


def grouped(changes: Iterable[Change]) -> list[Group]:
    """The changes counted by directory (first GROUP_DEPTH levels) and kind, largest groups first."""
    counts: dict[tuple[str, str], list[int]] = {}
    for c in changes:
        key = (place(c.path), c.kind)
        entry = counts.setdefault(key, [0, 0])
        entry[0] += 1
        entry[1] += c.guest.size if c.guest is not None and c.guest.kind == FILE else 0
    groups = [Group(where, kind, n, size) for (where, kind), (n, size) in counts.items()]
    return sorted(groups, key=lambda g: (-g.count, g.where, g.kind))
