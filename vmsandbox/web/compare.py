"""A fan-out side by side: the sessions' changes to the same files in columns; one session's version picked per
file is applied (each by its own session's review and apply code), then the rest of the sessions are destroyed
(their unpicked changes exported to their outboxes first: nothing is lost).

Each session's review is frozen when the page is drawn (sync.review.frozen); the form names each review by its id and
each pick by the session, the item's number in its review and the hash of all the page showed of it
(core/views.fingerprint). The apply takes those reviews: nothing is fetched from a guest again, and nothing is
matched by its label."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vmsandbox.core import views
from vmsandbox.core.views import Decisions, Plan
from vmsandbox.errors import VmsandboxError
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

    @property
    def held(self) -> bool:
        """Some session's change to it is held (ignored, binary, quarantined, …): read after the source."""
        return any(c.view is not None and c.view.group is not None for c in self.cells)


def groups(rows: list[dict[str, Any]]) -> dict[str, list[str]]:
    """The fan-outs among the sessions listed: group name → its sessions."""
    found: dict[str, list[str]] = {}
    for r in rows:
        if r.get("group"):
            found.setdefault(str(r["group"]), []).append(str(r["name"]))
    return found


def _plans(names: list[str]) -> dict[str, Plan]:
    from vmsandbox.core import reviews

    if not 2 <= len(names) <= MOST or len(set(names)) != len(names):
        raise VmsandboxError(f"compare 2 to {MOST} different sessions", hint="e.g. /compare?s=exp-1&s=exp-2")
    return {name: reviews.review(name) for name in names}


@dataclass
class View:
    lines: list[Line]  # where the sessions differ first (source, then held), then where they all agree
    reviews: dict[str, str]  # session -> the id of its review frozen for this page

    @property
    def differ(self) -> list[tuple[int, Line]]:
        """The lines where the sessions differ, each with its number in the form."""
        return [(k, line) for k, line in enumerate(self.lines) if not line.agree]

    @property
    def agree(self) -> list[tuple[int, Line]]:
        """The lines where every session made the same change: folded on the page."""
        return [(k, line) for k, line in enumerate(self.lines) if line.agree]


def view(names: list[str]) -> View:
    """Every path any of the sessions changed, with each session's change to it (or none): where they differ
    first, the source before what is held; where they all agree last."""
    plans = _plans(names)
    per_session = {name: {v.label: v for v in _all_views(plan)} for name, plan in plans.items()}
    paths = sorted({label for views in per_session.values() for label in views})
    lines = [Line(p, [Cell(name, per_session[name].get(p)) for name in names]) for p in paths]
    lines.sort(key=lambda line: (line.agree, line.held))  # (stable: in path order within each)
    return View(lines, {name: plan.id for name, plan in plans.items()})


def _all_views(plan: Plan) -> list[review.FileView]:
    pages = -(-len(plan.todo) // review.PAGE_ITEMS)
    return [v for n in range(pages) for v in review.files(plan, n)]


def pick(cell: Cell) -> str:
    """The value a pick of this cell sends: the session, the item's number in its review, and its hash."""
    return "" if cell.view is None else f"{cell.session}:{cell.view.id}:{cell.view.digest}"


@dataclass
class Applied:
    applied: dict[str, list[str]]  # session → paths taken from it
    failed: list[str]
    destroyed: list[str]


def apply(fields: dict[str, str]) -> Applied:
    """Fields `r-<session>` (the id of the session's review the page showed), `c<k>` (a pick: pick(cell), or ""
    for none), `destroy` ("rest")."""
    from vmsandbox.core import reviews, sessions

    given = {key[2:]: value for key, value in fields.items() if key.startswith("r-")}
    wanted: dict[str, dict[int, str]] = {}
    for key, value in fields.items():
        if key.startswith("c") and value:
            session, _, rest = value.partition(":")
            number, _, digest = rest.partition(":")
            if session not in given or not (number.isascii() and number.isdigit()):
                raise VmsandboxError(f"a pick names no review the page showed ({value[:80]!r})", hint=_AGAIN)
            wanted.setdefault(session, {})[int(number)] = digest
    done = Applied({}, [], [])
    if fields.get("destroy") == "rest":  # (a session another command drives is refused before anything is applied)
        for name in given:
            sessions.not_driven(sessions.record(name))
    for name, chosen in wanted.items():  # every review and pick checked before anything of any is applied
        plan = reviews.reviewed(name, given[name])
        for index, digest in sorted(chosen.items()):
            if index >= len(plan.todo) or views.fingerprint(plan.todo[index]) != digest:
                raise VmsandboxError(
                    f"{name}: item {index} is not what the page showed; nothing was applied", hint=_AGAIN
                )
    for name, chosen in wanted.items():

        def picked(plan: Plan, chosen: dict[int, str] = chosen) -> Decisions:
            return Decisions(accept=tuple(plan.todo[index] for index in sorted(chosen)))

        outcome = reviews.apply(name, given[name], picked).outcome
        done.applied[name] = outcome.applied + outcome.merged + outcome.conflicts
        done.failed += outcome.failed
    if fields.get("destroy") == "rest":
        for name in given:
            sessions.destroy(name, force=True)
            done.destroyed.append(name)
    return done


_AGAIN = "reload the side-by-side page and pick again"
