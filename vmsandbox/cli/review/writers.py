"""Who made each change, at the terminal: the lines beside each hunk of a diff a person reads at `pull`'s prompt,
`vmsandbox diff NAME --by step` (the changes under the step that made them, in the order the steps ran), and the
JSON of `diff --json`. Provenance is the guest's word (core.views.madeby): every name it gives is shown escaped, on one
line, cut short, and said once to be the guest's."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from vmsandbox import ui

if TYPE_CHECKING:
    from vmsandbox.core.views import Change, Hunk, Plan
    from vmsandbox.core.views.madeby import Made, Maker

HEADER = re.compile(r"@@ -(\d{1,9})(?:,(\d{1,9}))? \+(\d{1,9})(?:,(\d{1,9}))? @@")  # (bounded: never a huge int)
UNIFIED = "--- "  # how a unified diff the host made starts (a three-way text is the guest's own lines: not parsed)
PATH_SHOWN = 4096


def ranges(h: Hunk) -> str:
    """A hunk's lines as a unified diff counts them: `-3,0 +3,2`."""
    return f"-{h.old_start + 1},{h.old_end - h.old_start} +{h.new_start + 1},{h.new_end - h.new_start}"


def maker_markup(maker: Maker, number: int | None) -> str:
    """One maker beside a hunk, as rich markup: `made by step 2 (sed …)`, dim, the writer's argv where it is not the
    step's own command, and its badges in yellow (all of the guest's words escaped)."""
    from rich.markup import escape

    from vmsandbox.core.views import madeby

    said = f"[dim]made by {escape(madeby.step_words(maker, number))}"
    if not madeby.own(maker):
        said += f" · {escape(madeby.argv(maker))}"
    said += "[/]"
    for badge in madeby.badge_words(maker):
        said += f" [yellow]{escape('[' + badge + ']')}[/]"
    return said


def beside(made: Made, numbers: dict[str, int]) -> list[str]:
    """The lines said beside a hunk (rich markup): one per maker, at most MOST_MAKERS, or that none was named."""
    from vmsandbox.core.views import madeby

    if not made.makers:
        return ["[dim]made by: not traced (the guest's journal named no writer)[/]"]
    lines = [maker_markup(m, numbers.get(m.step)) for m in made.makers[: madeby.MOST_MAKERS]]
    more = len(made.makers) - madeby.MOST_MAKERS
    return lines + ([f"[dim]… and {more} more writer(s)[/]"] if more > 0 else [])


def print_diff(plan: Plan, c: Change, text: str) -> None:
    """A change's diff for a person (stderr), with who made each hunk under the hunk's header: a hunk of the review
    lies in the unified hunk whose old lines hold it; one no header holds is named after. Only a unified diff's
    headers are read (split at newlines only, each number at most 9 digits): a three-way text is the guest's lines,
    never parsed, and a header not understood leaves its hunks named after, never an error."""
    from vmsandbox.core import views
    from vmsandbox.core.views import madeby

    if views.provenance(plan) is None:
        ui.err.print(ui.printable(text, markup=False), markup=False, highlight=False)
        return
    numbers = madeby.numbers(plan)
    left = madeby.made(plan, c)
    chunk: list[str] = []

    def flush() -> None:
        if chunk:
            ui.err.print(ui.printable("".join(chunk), markup=False).rstrip("\n"), markup=False, highlight=False)
            chunk.clear()

    unified = text.startswith(UNIFIED)
    for row in text.split("\n"):
        chunk.append(row + "\n")
        found = HEADER.match(row) if unified else None
        if found is None:
            continue
        start, count = int(found[1]), int(found[2] or "1")
        low = start - 1 if count else start
        inside = [(m, h) for m in left if (h := m.hunk) is not None and low <= h.old_start and h.old_end <= low + count]
        if inside:
            flush()
        for m, h in inside:
            head = f"  [dim]h{h.index} ({ranges(h)})[/] " if len(inside) > 1 else "  "
            for said in beside(m, numbers):
                ui.err.print(head + said, highlight=False)
            left.remove(m)
    flush()
    for m in left:
        where = f"h{m.hunk.index} ({ranges(m.hunk)})" if m.hunk is not None else "the whole change"
        for said in beside(m, numbers):
            ui.err.print(f"  [dim]{where}:[/] {said}", highlight=False)


def said_once(plan: Plan) -> None:
    """What a review says once of its provenance (stderr): that it is the guest's word, and what is missing."""
    from vmsandbox.core import views
    from vmsandbox.core.views import madeby

    if views.provenance(plan) is None:
        return
    ui.info(f"[dim]{madeby.GUEST_WORD}[/]")
    partial = madeby.incomplete(plan)
    if partial is not None:
        ui.warn(partial)


# -- `vmsandbox diff --json`, `--by step` ------------------------------------------------------------------------


def _hunk_json(m: Made, h: Hunk) -> dict[str, Any]:
    return {"hunk": h.index, "old_start": h.old_start + 1, "old_count": h.old_end - h.old_start,
            "new_start": h.new_start + 1, "new_count": h.new_end - h.new_start,
            "made_by": [k.as_json() for k in m.makers]}  # fmt: skip


def _file_json(plan: Plan, c: Change, made: Sequence[Made]) -> dict[str, Any]:
    """A change as data: its hunks with who made each, and (a change with no hunks) who wrote it."""
    from vmsandbox.core import views

    origin = None if (p := views.provenance(plan)) is None else p.files.get(c.path)
    whole = [k.as_json() for m in made if m.hunk is None for k in m.makers]
    return {"path": c.path, "kind": c.kind, "note": views.describe(c),
            "hunks": [_hunk_json(m, h) for m in made if (h := m.hunk) is not None], "made_by": whole,
            "incomplete": None if origin is None else origin.incomplete}  # fmt: skip


def document(plan: Plan, *, by_step: bool) -> dict[str, Any]:
    """`diff --json`: the review's steps and its files, each hunk with who made it; `--by step`: the files under
    `groups`, one per step in order, then outside any step, then untraced."""
    from vmsandbox.core import views
    from vmsandbox.core.views import madeby

    found = views.provenance(plan)
    said: dict[str, Any] = {
        "session": plan.gathered.target.name,
        "provenance": None if found is None else {"guest_word": found.guest_word, "incomplete": found.incomplete},
        "steps": [madeby.step_json(s, n) for n, s in enumerate(madeby.steps(plan), 1)],
    }
    if not by_step:
        return said | {"files": [_file_json(plan, c, madeby.made(plan, c)) for c in plan.shown]}
    groups = []
    for g in madeby.by_step(plan, plan.shown):
        changes = {m.change.path: m.change for m in g.made}
        files = [_file_json(plan, c, [m for m in g.made if m.change is c]) for c in changes.values()]
        groups.append({"group": g.key, "number": g.number, "files": files})
    return said | {"groups": groups}


def print_document(plan: Plan, *, by_step: bool) -> None:
    """The JSON on stdout (every character past ASCII escaped: nothing of the guest's acts on a terminal)."""
    print(json.dumps(document(plan, by_step=by_step), indent=2))


def print_by_step(plan: Plan) -> None:
    """`vmsandbox diff NAME --by step`: per step a header (its place, command, exit code, duration, egress requests),
    then each file and hunk it made with who wrote it where that is not the step's own command; then what was
    written outside any step, then what no writer was named for. On stdout, escaped; the notes on stderr."""
    from vmsandbox.core import views
    from vmsandbox.core.views import madeby

    said_once(plan)
    if views.provenance(plan) is None:
        ui.warn("this review has no provenance: the guest's journal did not answer (every change is untraced)")
    numbers = madeby.numbers(plan)
    for g in madeby.by_step(plan, plan.shown):
        if g.step is not None and g.number is not None:
            print(madeby.step_line(g.step, g.number))
        else:
            print("outside any step" if g.key == madeby.OUTSIDE else "not traced")
        if not g.made:
            print("  (changed nothing shown here)")
        for m in g.made:
            print("  " + _entry(m, g.key, numbers))


def _entry(m: Made, group: str, numbers: dict[str, int]) -> str:
    """One hunk (or whole file) under its group: its path, where, and the writers that are not the group's step's
    own command, with their badges."""
    from vmsandbox.core import views
    from vmsandbox.core.views import madeby

    what = views.describe(m.change) or m.change.kind
    where = f"h{m.hunk.index} ({ranges(m.hunk)})" if m.hunk is not None else f"whole: {madeby.line(what)}"
    parts = [madeby.line(m.change.path, PATH_SHOWN), where]
    for k in m.makers[: madeby.MOST_MAKERS]:
        mine = k.step == group or (group == madeby.OUTSIDE and k.step not in numbers)
        if not mine:
            parts.append(f"also {madeby.step_words(k, numbers.get(k.step))}")
        elif not madeby.own(k):
            parts.append(f"by {madeby.argv(k)}")
        parts += [f"[{b}]" for b in madeby.badge_words(k)]
    if len(m.makers) > madeby.MOST_MAKERS:
        parts.append(f"… and {len(m.makers) - madeby.MOST_MAKERS} more writer(s)")
    return "  ".join(parts)
