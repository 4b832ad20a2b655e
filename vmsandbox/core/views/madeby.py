"""Who made each change of a review, as every front end shows it: each hunk of a change with the processes the
guest's journal named as its writers (views.made_by), the session's steps in the order they ran, the review grouped
by the step that made each hunk (`vmsandbox diff --by step`, the page's timeline and its take or leave per step),
and a maker or a step said in one short line.

Provenance is the guest's word, but for a step's command, times and exit code (the host kept those): every argv,
executable, role and egress line is shown escaped (ui.visible, and a newline as `\\n`) and cut short, and none of
it decides what is held or applied. A step's command is escaped too: an agent typed it.
"""

from __future__ import annotations

import shlex
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from vmsandbox import ui
from vmsandbox.core import views
from vmsandbox.sync.provenance.model import OUTSIDE, UNTRACED, Maker, Provenance, Step

__all__ = ["GUEST_WORD", "OUTSIDE", "UNTRACED", "Group", "Made", "Maker", "Provenance", "Step"]

GUEST_WORD = "who made each change is the guest's word (its journal's): shown, never a reason to apply or hold"
GUEST = views.GUEST_HOW  # how a step only the guest registered was made (no command, times or exit code the host kept)
ARGV_SHOWN = 120  # characters of a writer's argv (or a command) in one line
EGRESS_SHOWN = 200  # characters of one egress line
MOST_MAKERS = 8  # makers named beside one hunk; the rest counted
MOST_STEPS = 200  # steps a front end lists (the newest, and every step a maker it shows names)
EGRESS_LINES = 50  # egress lines a front end shows per step; the rest counted
ARGV_WORDS = 20  # words of a writer's argv a front end's data gives (each at most ARGV_WORD characters)
ARGV_WORD = 200


@dataclass(frozen=True)
class Made:
    """A hunk of a change (None: the change as a whole, not shown as hunks) and who made it (none: not traced)."""

    change: views.Change
    hunk: views.Hunk | None
    makers: tuple[Maker, ...]


@dataclass(frozen=True)
class Group:
    """What one step made (or what was written outside any step, or what no writer was named for)."""

    key: str  # a step's id, OUTSIDE or UNTRACED
    step: Step | None
    number: int | None  # the step's place in the order the steps started, from 1
    made: tuple[Made, ...]


def steps(plan: views.Plan) -> tuple[Step, ...]:
    """The session's steps in the order they started (those only the guest registered, which have no time, last),
    each with the egress requests of its time."""
    return _ordered(views.steps(plan))


def numbers(plan: views.Plan) -> dict[str, int]:
    """Each step's place in that order, from 1, by its id (the proxy's log is not read for it)."""
    found = views.provenance(plan)
    return {s.id: n for n, s in enumerate(_ordered(() if found is None else found.steps), 1)}


def _ordered(found: Iterable[Step]) -> tuple[Step, ...]:
    return tuple(sorted(found, key=lambda s: (s.how == GUEST, s.started)))


def listed(ordered: Sequence[Step], named: Collection[str] = (), most: int = MOST_STEPS) -> list[tuple[int, Step]]:
    """The steps a front end lists, each with its place in `ordered` (from 1): the newest `most`, and every one
    whose id is `named` (the steps of the makers it shows), in order."""
    first = len(ordered) - most
    return [(n, s) for n, s in enumerate(ordered, 1) if n > first or s.id in named]


def hunks(plan: views.Plan, c: views.Change) -> list[views.Hunk]:
    """The change's hunks as the review numbers them ([]: taken or left whole)."""
    try:
        both = views.texts(plan, c)
    except views.ChangedError:
        return []
    return [] if both is None else views.hunks_of(*both)


def made(plan: views.Plan, c: views.Change) -> list[Made]:
    """Each hunk of a change with its makers, or the change whole when it has no hunks."""
    found = hunks(plan, c)
    if not found:
        return [Made(c, None, views.made_by(plan, c, None))]
    return [Made(c, h, views.made_by(plan, c, h)) for h in found]


def writers(plan: views.Plan, changes: Iterable[views.Change]) -> tuple[Maker, ...]:
    """Every writer of these changes (a nested repository's many paths), each once, in the order first seen."""
    return tuple(dict.fromkeys(m for c in changes for m in views.made_by(plan, c, None)))


def by_step(plan: views.Plan, changes: Sequence[views.Change]) -> list[Group]:
    """What each step made, in the order the steps started (a step that made none of these changes too), then what
    was written outside any step, then what no writer was named for. A hunk two steps wrote is under both; a step
    the host does not know (the guest named it) counts as outside any step."""
    ordered = steps(plan)
    into: dict[str, list[Made]] = {s.id: [] for s in ordered}
    outside: list[Made] = []
    untraced: list[Made] = []
    for c in changes:
        for m in made(plan, c):
            if not m.makers:
                untraced.append(m)
            for key in dict.fromkeys(k.step if k.step in into else OUTSIDE for k in m.makers):
                into.get(key, outside).append(m)
    found = [Group(s.id, s, n, tuple(into[s.id])) for n, s in enumerate(ordered, 1)]
    found += [Group(OUTSIDE, None, None, tuple(outside))] if outside else []
    return found + ([Group(UNTRACED, None, None, tuple(untraced))] if untraced else [])


def incomplete(plan: views.Plan) -> str | None:
    """What a front end says once of a review whose provenance is partial (None: complete, or none at all)."""
    found = views.provenance(plan)
    if found is None or found.incomplete is None:
        return None
    return f"provenance incomplete: {line(found.incomplete, 300)}"


def line(text: str, most: int = ARGV_SHOWN) -> str:
    """Guest text as one line: every character that could hide or restyle text escaped (ui.visible), newlines and
    tabs too, at most `most` characters, then `…`."""
    said = ui.visible(text[: most * 2]).replace("\n", "\\n").replace("\t", "\\t")
    return said if len(said) <= most and len(text) <= most * 2 else said[: most - 1] + "…"


def argv(maker: Maker, most: int = ARGV_SHOWN) -> str:
    """A writer's argv as a shell would read it (its executable when the journal kept no argv), one escaped line."""
    words: list[str] = []
    used = 0
    for word in maker.argv:
        quoted = shlex.quote(word[: most + 1])
        words.append(quoted)
        used += len(quoted) + 1
        if used > most:
            break
    said = " ".join(words) or maker.exe[: most + 1] or "an unnamed process"
    return line(said + (" …" if len(words) < len(maker.argv) else ""), most)


def own(maker: Maker) -> bool:
    """Whether the writer is its step's own command (as typed: nothing else to say of it)."""
    return bool(maker.command) and len(maker.argv) <= len(maker.command) and shlex.join(maker.argv) == maker.command


def step_words(maker: Maker, number: int | None) -> str:
    """`step 2 (sed -i … a.txt)`, or `outside any step`: where a maker belongs, escaped."""
    if maker.step == OUTSIDE or number is None:
        return "outside any step"
    return f"step {number} ({line(maker.command, ARGV_SHOWN // 2)})"


def badge_words(maker: Maker) -> list[str]:
    """Each of its badges with whom it names: `install script: node postinstall.js`."""
    return [f"{b}: {argv(maker, 60)}" for b in maker.badges]


def duration(step: Step) -> str:
    if step.how == GUEST:
        return "no time kept"
    if step.ended is None:
        return "not ended"
    seconds = max(step.ended - step.started, 0.0)
    return f"{seconds:.1f}s" if seconds < 60 else f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def exit_words(step: Step) -> str:
    return "no exit code" if step.exit is None else f"exit {step.exit}"


def egress(step: Step, most: int = EGRESS_LINES) -> list[str]:
    """A step's egress lines (the proxy logged them while it ran: what the guest asked for), escaped, at most
    `most` of them, then how many more."""
    shown = [line(e, EGRESS_SHOWN) for e in step.egress[:most]]
    return shown + ([f"… {len(step.egress) - most} more"] if len(step.egress) > most else [])


def requests(step: Step) -> str:
    n = len(step.egress)
    return f"{n} egress request{'' if n == 1 else 's'}"


def step_line(step: Step, number: int) -> str:
    """`step 2  sed -i s/a/b/ a.txt  exit 0  0.4s  3 egress requests`, escaped."""
    return f"step {number}  {line(step.command)}  {exit_words(step)}  {duration(step)}  {requests(step)}"


def step_json(step: Step, number: int) -> dict[str, object]:
    """A step as data (the guest's egress lines as they were logged), with its place in the order."""
    return {"number": number, **step.as_json()}
