"""Who made each change, as the review page shows it: a badge per hunk (or per file without hunks) with its step
and writer, and the session's steps as a timeline (command, start, duration, exit code, the egress requests made
while it ran), each with a take-all and a leave-all that tick or untick the hunks it made in the page's form (ui.js;
they change the person's ticks, never apply anything, and a step's take-all never ticks a held file).

Provenance is the guest's word (core.views.madeby): each name is one escaped line, cut short, and the template escapes
it again for HTML. The step ids written into the page are the session's steps' ([a-z0-9]{1,32}: the host's, or
those only the guest registered, as its journal's answer was checked, never `outside` or `untraced`); a writer
that names a step neither knows counts as outside any step."""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from markupsafe import Markup, escape

from vmsandbox.core import views
from vmsandbox.core.views import Plan, madeby
from vmsandbox.core.views.madeby import Maker


def shown(text: str) -> Markup:
    """Text already made one escaped line (madeby.line: ui.visible and more) as HTML: escaped for HTML only, so
    the page's own escaping does not escape its `…` a second time."""
    return escape(text)


@dataclass(frozen=True)
class MakerView:
    step: Markup  # `step 2 (npm install)`, or `outside any step`
    argv: Markup | None  # the writer's argv, where it is not the step's own command
    badges: tuple[Markup, ...]  # `install script: node postinstall.js`


@dataclass
class Made:
    """Who made a hunk or a file: the makers shown, how many more, and the known steps among them (for ui.js)."""

    makers: list[MakerView] = field(default_factory=list)
    more: int = 0
    steps: str = ""  # the ids of the host's steps among its makers, space-separated
    traced: bool = True


@dataclass(frozen=True)
class StepView:
    id: str  # the host's ([a-z0-9]{1,32})
    number: int
    command: Markup
    started: str
    duration: str
    exit: str
    egress: list[Markup]
    requests: str


numbers = madeby.numbers  # (each step's place in the order they started, by its id)


def made(plan: Plan, c: views.Change, hunk: views.Hunk | None, numbers: dict[str, int]) -> Made:
    found = views.made_by(plan, c, hunk)
    return of(found, numbers)


def whole(plan: Plan, changes: Sequence[views.Change], numbers: dict[str, int]) -> Made:
    """Who wrote these changes (an item shown whole: every change of a nested repository's)."""
    return of(madeby.writers(plan, changes), numbers)


def of(found: tuple[Maker, ...], numbers: dict[str, int]) -> Made:
    makers = [
        MakerView(
            shown(madeby.step_words(m, numbers.get(m.step))),
            None if madeby.own(m) else shown(madeby.argv(m)),
            tuple(map(shown, madeby.badge_words(m))),
        )
        for m in found[: madeby.MOST_MAKERS]
    ]
    steps = " ".join(dict.fromkeys(m.step for m in found if m.step in numbers))
    return Made(makers, max(len(found) - madeby.MOST_MAKERS, 0), steps, bool(found))


def steps(plan: Plan, named: Collection[str] = ()) -> list[StepView]:
    """The session's steps in the order they started: the newest madeby.MOST_STEPS, and every step whose id is
    `named` (those of the makers the page shows), each with at most madeby.EGRESS_LINES egress lines."""
    return [
        StepView(
            s.id, n, shown(madeby.line(s.command)), _started(s),
            madeby.duration(s), madeby.exit_words(s), list(map(shown, madeby.egress(s))), madeby.requests(s),
        )
        for n, s in madeby.listed(madeby.steps(plan), named)
    ]  # fmt: skip


def _started(s: madeby.Step) -> str:
    if s.how == madeby.GUEST:
        return "registered in the guest, at a time it did not say"
    return "started " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.started))


def notes(plan: Plan) -> list[str]:
    """What the page says once of the review's provenance (nothing when it has none)."""
    if views.provenance(plan) is None:
        return []
    partial = madeby.incomplete(plan)
    return [madeby.GUEST_WORD, *([partial] if partial else [])]
