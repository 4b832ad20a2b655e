"""A fan-out side by side: the sessions' changes to the same files in columns; one session's version picked per
file is applied (each by its own session's review and apply code), then the rest of the sessions are destroyed
(their unpicked changes exported to their outboxes first: nothing is lost)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vmsandbox.errors import VmsandboxError
from vmsandbox.sync.plan import Decisions, Plan
from vmsandbox.web import review

MOST = 8  # sessions side by side


@dataclass
class Cell:
    session: str
    view: review.FileView | None  # None: this session left the file alone


@dataclass
class Line:
    path: str
    cells: list[Cell] = field(default_factory=list)

    @property
    def agree(self) -> bool:
        """Every session that changed it made the same change."""
        digests = {c.view.digest for c in self.cells if c.view is not None}
        return len(digests) == 1 and all(c.view is not None for c in self.cells)


def groups(rows: list[dict[str, Any]]) -> dict[str, list[str]]:
    """The fan-outs among the sessions listed: group name → its sessions."""
    found: dict[str, list[str]] = {}
    for r in rows:
        if r.get("group"):
            found.setdefault(str(r["group"]), []).append(str(r["name"]))
    return found


def _plans(names: list[str]) -> dict[str, Plan]:
    from vmsandbox.session import config, lifecycle, lock
    from vmsandbox.session.record import Record

    if not 2 <= len(names) <= MOST:
        raise VmsandboxError(f"compare 2 to {MOST} sessions", hint="e.g. /compare?s=exp-1&s=exp-2")
    limit = config.sync_limit()
    plans: dict[str, Plan] = {}
    for name in names:
        record = Record.load(name)
        with lock.held(record.files, name, "reviewing the changes of"):
            plans[name] = lifecycle.review(Record.load(name), limit=limit)
    return plans


def view(names: list[str]) -> list[Line]:
    """Every path any of the sessions changed, with each session's change to it (or none)."""
    plans = _plans(names)
    per_session = {name: {v.label: v for v in _all_views(plan)} for name, plan in plans.items()}
    paths = sorted({label for views in per_session.values() for label in views})
    return [Line(p, [Cell(name, per_session[name].get(p)) for name in names]) for p in paths]


def _all_views(plan: Plan) -> list[review.FileView]:
    pages = -(-len(plan.todo) // review.PAGE_ITEMS)
    return [v for n in range(pages) for v in review.files(plan, n)]


@dataclass
class Applied:
    applied: dict[str, list[str]]  # session → paths taken from it
    failed: list[str]
    destroyed: list[str]


def apply(fields: dict[str, str]) -> Applied:
    """Fields `p<k>` (a path) and `c<k>` (the session whose version to take, or ""), `destroy` ("rest")."""
    from vmsandbox.session import config, lifecycle, lock
    from vmsandbox.session.record import Record

    names = [n for n in fields.get("sessions", "").split(",") if n]
    wanted: dict[str, set[str]] = {}
    for key, path in fields.items():
        if key.startswith("p") and fields.get("c" + key[1:]) in names:
            wanted.setdefault(fields["c" + key[1:]], set()).add(path)
    limit = config.sync_limit()
    done = Applied({}, [], [])
    for name, chosen in wanted.items():
        record = Record.load(name)
        with lock.held(record.files, name, "reviewing the changes of"):
            record = Record.load(name)
            plan = lifecycle.review(record, limit=limit)
            items = tuple(i for i in plan.todo if i.label in chosen)
            outcome = lifecycle.decide(record, plan, Decisions(accept=items))
        done.applied[name] = outcome.applied + outcome.merged + outcome.conflicts
        done.failed += outcome.failed
    if fields.get("destroy") == "rest":
        for name in names:
            record = Record.load(name)
            with lock.held(record.files, name, "destroying"):
                lifecycle.destroy(Record.load(name), force=True, discard=False, limit=limit)
            done.destroyed.append(name)
    return done
