"""The person at the terminal (core.person.Person): the summary of a review and its questions, the decisions
(--yes, the person, or none), the report of what was done, the credentials named before boot, a login kept, a
fan-out's table. Everything shown from the guest is escaped."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vmsandbox import ui
from vmsandbox.cli import output
from vmsandbox.cli.output import cut
from vmsandbox.cli.review import writers

if TYPE_CHECKING:
    from collections.abc import Sequence

    from vmsandbox.core.views import Decisions, FanOutcome, Finding, Item, Outcome, Plan, Take


STATUS = {"apply": "[green]apply[/]", "merged": "[cyan]merged[/]", "conflict": "[red]conflict[/]",
          "unsafe": "[red]refused[/]"}  # fmt: skip
NOTE_LEAST = 24  # columns a note keeps beside a long path (it wraps)
REASON_LEAST = 20  # columns a held group's reason keeps before its options go on a line of their own


def _row(item: Item) -> tuple[str, str, str, str]:
    """(status markup, kind, path, note) of one change read on its own."""
    from vmsandbox.core.views import Status, describe

    c = item.first
    if item.repository:
        return STATUS[c.status], "repository", item.label, c.risky or ""
    shown = c.notes if c.status is Status.UNSAFE else [*c.notes, describe(c)]  # a refusal names the target
    if c.merge is not None and not c.merge.clean:
        shown.insert(0, f"{c.merge.conflicts} overlapping hunk(s), the rest merged")
    return STATUS[c.status], c.kind, c.path, "; ".join(filter(None, shown))


def summary_table(plan: Plan, width: int | None = None) -> Any:
    """The changes read one by one, source first and what is refused after (the held ones are group lines:
    held_lines), in `width` columns (the terminal's): a path too long is cut in its middle, whole in
    `vmsandbox diff NAME --stat` and at the prompt."""
    from rich.cells import cell_len
    from rich.markup import escape
    from rich.table import Column, Table

    from vmsandbox.core.views import Status, grouped, keys

    found = grouped(plan.shown)
    items = [i for i in found if i.first.status is not Status.UNSAFE]
    held = keys(items, plan.mass is not None)
    rows = [_row(i) for i, k in zip(items, held, strict=True) if k is None]
    rows += [_row(i) for i in found if i.first.status is Status.UNSAFE]
    paths = [ui.visible(path) for _, _, path, _ in rows]
    kinds = max((len(kind) for _, kind, _, _ in rows), default=6)
    room = (width or ui.err.width) - 8 - len("conflict") - kinds  # 8: the padding of four columns
    notes = max((cell_len(ui.visible(note)) for *_, note in rows), default=0)
    longest = max(map(cell_len, paths), default=4)
    path_width = max(12, min(longest, room - min(notes, NOTE_LEAST) - (notes > 0)))
    table = Table(
        Column("STATUS", no_wrap=True, min_width=len("conflict")), Column("CHANGE", no_wrap=True),
        Column("PATH", no_wrap=True, width=path_width), Column("NOTE", overflow="fold"), box=None,
        caption_justify="left", caption_style="dim",
    )  # fmt: skip
    for (status, kind, _, note), path in zip(rows, paths, strict=True):
        table.add_row(status, kind, escape(cut(path, path_width)), ui.printable(note))
    if longest > path_width:
        table.caption = f"paths cut to fit; whole: `vmsandbox diff {plan.gathered.target.name} --stat`"
    return table


def held_lines(plan: Plan, width: int | None = None) -> list[str]:
    """One line per held group of the plan: how many, why, and what takes them (`--include-*`), in `width`
    columns (the reason cut short where it must; on a narrow terminal the options go on a line of their own)."""
    from rich.markup import escape

    from vmsandbox.core.views import outline

    width = width or ui.err.width
    lines = []
    for g in outline(plan).groups:
        take = " ".join(g.flags) if g.flags else "only `y` at the prompt"
        head = f"  held {len(g.numbers):>3}  "
        room = width - len(head) - len(" · ") - len(take)
        apart = room < REASON_LEAST and len(ui.visible(g.reason)) > room  # the options on the next line
        reason = escape(cut(ui.visible(g.reason), width - len(head) if apart else room, path=False))
        head = head.replace("held", "[yellow]held[/]", 1)
        lines.append(f"{head}{reason}\n{' ' * 13}→ {take}" if apart else f"{head}{reason} · {take}")
    return lines


def _ask(question: str, choices: str) -> str:
    while True:
        answer = ui.err.input(ui.printable(f"{question} [{'/'.join(choices)}] ")).strip()
        if answer in choices:
            return answer
        ui.err.print(f"answer one of: {', '.join(choices)}")


def ask_person(plan: Plan) -> Decisions:
    """The source changes one by one (y apply, n skip, d diff, a apply all remaining safe ones, q stop), then each
    held group as one question (y all of it, n none, e each, q stop); then the commits."""
    from vmsandbox.core.views import Decisions, outline

    if plan.mass is not None:
        return _ask_mass(plan)
    shape = outline(plan)
    accepted: list[Item] = []
    answer = _ask_items(plan, shape.source, accepted, shape.order)
    for g, line in zip(shape.groups, held_lines(plan), strict=True):
        if answer == "q":
            break
        ui.err.print(line, highlight=False)
        answer = _ask(
            f"  apply {'it' if len(g.numbers) == 1 else 'all ' + str(len(g.numbers))}? y=yes n=no e=each q=quit", "yneq"
        )
        if answer == "y":
            accepted += [plan.todo[n] for n in g.numbers]
        elif answer == "e":
            answer = _ask_items(plan, g.numbers, accepted, shape.order, held=True)
    name = plan.gathered.target.name
    take = plan.gathered.refs_changed and (
        _ask(f"Fetch the guest's commits into refs/remotes/vmsandbox-{name}/*? y=yes n=no", "yn") == "y"
    )
    return Decisions(tuple(accepted), (), take)


def _ask_items(plan: Plan, numbers: Sequence[int], accepted: list[Item], order: list[int], held: bool = False) -> str:
    """Ask about each of the plan's items `numbers` (counted in reading `order`; `held`: a held group's, which
    "all safe" never takes); the last answer ("q": stop)."""
    from vmsandbox.core.views import Status, diff_text, merge_text

    apply_rest, answer = False, ""
    for n in numbers:
        item, c = plan.todo[n], plan.todo[n].first
        why = item.secret or item.risky or item.ignored or ("binary: apply only what you know" if item.binary else None)
        safe = not (why or held) and c.status in (Status.APPLY, Status.MERGED)
        if apply_rest and safe:
            accepted.append(item)
            continue
        verb = {Status.CONFLICT: "keep the guest version beside it", Status.MERGED: "apply the merge"}.get(
            c.status, "apply"
        )
        warn = f" [yellow]⚠ {ui.printable(why)}[/]" if why else ""
        place = f"({order.index(n) + 1}/{len(order)})"
        ui.err.print(f"[bold]{place}[/] {item.kind} {ui.printable(item.label)} — {c.status.value}{warn}")
        choices = "yndaq" if not (why or held) else "yndq"
        while True:
            answer = _ask(f"  {verb}? y=yes n=no d=diff{' a=all safe' if 'a' in choices else ''} q=quit", choices)
            if answer != "d":
                break
            for m in item.changes:  # (with who made each hunk beside it)
                writers.print_diff(plan, m, merge_text(plan.gathered, m) or diff_text(plan.gathered, m))
        if answer == "q":
            return answer
        if answer in "ya":
            accepted.append(item)
        apply_rest = apply_rest or answer == "a"
    return answer


def _ask_mass(plan: Plan) -> Decisions:
    """A mass change is not asked item by item: the safe part of it as a whole, or nothing."""
    from vmsandbox.core.views import Decisions, Take

    answer = _ask(
        f"  A mass change ({plan.mass}). a=apply its safe changes (not quarantined, ignored, binary) "
        "n=leave it all pending (review it with `vmsandbox ui`)",
        "an",
    )
    if answer == "a":
        return Decisions.safe(plan, Take(mass=True))
    return Decisions(massed=tuple(plan.todo))


def mass_table(plan: Plan, width: int | None = None) -> Any:
    """A mass change by directory and kind, largest groups first, in `width` columns (directories cut short)."""
    from rich.markup import escape
    from rich.table import Column, Table

    from vmsandbox.core.views import mass

    table = Table(Column("CHANGES", justify="right"), Column("KIND", no_wrap=True), Column("SIZE", justify="right"),
                  Column("UNDER", no_wrap=True), box=None)  # fmt: skip
    groups = mass.grouped(c for i in plan.todo for c in i.changes)
    room = (width or ui.err.width) - 8 - len("CHANGES") - max((len(g.kind) for g in groups), default=4) - 12
    for g in groups[:MASS_ROWS]:
        where = escape(cut(ui.visible(g.where), max(room, 12)))
        table.add_row(str(g.count), g.kind, f"{g.size / 1024**2:.1f} MiB", where)
    if len(groups) > MASS_ROWS:
        rest = groups[MASS_ROWS:]
        table.add_row(str(sum(g.count for g in rest)), "…", "", f"{len(rest)} more groups")
    return table


MASS_ROWS = 30


def show(plan: Plan) -> bool:
    """The summary before the questions, or of a dry run: summary(), then a line per held group and its option."""
    shown = summary(plan)
    for line in held_lines(plan) if shown and plan.mass is None else []:
        ui.err.print(line, highlight=False)
    return shown


def summary(plan: Plan) -> bool:
    """The summary's table (a mass change's by directory and kind); what is held is said by the report after an
    apply (`--yes`), or by show() before the questions. False when there is nothing to review."""
    if plan.empty:
        ui.info("No changes in the guest.")
        return False
    if plan.mass is not None:
        ui.err.print(mass_table(plan))
        ui.warn(f"a mass change: {plan.mass}")
        ui.err.print("  shown by directory and kind; `--yes --include-mass` takes its safe part")
        return True
    table = summary_table(plan)
    if table.rows:
        ui.err.print(table)
    writers.said_once(plan)
    return True


def report(outcome: Outcome, name: str) -> None:
    for label, items, colour in (
        ("applied", outcome.applied, "green"),
        ("merged", outcome.merged, "cyan"),
        ("conflict", outcome.conflicts, "red"),
        ("quarantined", outcome.quarantined, "yellow"),
        ("credential?", outcome.secrets, "red"),
        ("not applied", outcome.skipped, "yellow"),
        ("already applied", outcome.already, "dim"),
        ("refused", outcome.refused, "red"),
        ("failed", outcome.failed, "red"),
    ):
        for item in items:
            ui.err.print(f"  [{colour}]{label}[/] {ui.printable(item)}", highlight=False)
    for line in outcome.commits:
        ui.err.print(f"  [cyan]commit[/] {ui.printable(line)}", highlight=False)
    if outcome.ignored:
        tops = sorted({label.split("/")[0] for label in outcome.ignored})
        where = ", ".join(ui.printable(t) for t in tops[:3]) + (" …" if len(tops) > 3 else "")
        ui.err.print(
            f"  [yellow]ignored[/] {len(outcome.ignored)} change(s) to paths the project ignores ({where}): not "
            f"applied; they wait with the session (its outbox once it ends); `vmsandbox pull {name} "
            "--include-ignored` applies them",
            highlight=False,
        )
    if outcome.binary:
        shown = ", ".join(ui.printable(label) for label in outcome.binary[:3]) + (
            " …" if len(outcome.binary) > 3 else ""
        )
        ui.err.print(
            f"  [yellow]binary[/] {len(outcome.binary)} binary file(s) not applied ({shown}): binary content needs an "
            f"explicit choice — `vmsandbox pull {name} --yes --include-binary`, or `y` at the prompt",
            highlight=False,
        )
    if outcome.massed:
        ui.err.print(
            f"  [yellow]mass change[/] {ui.printable(outcome.massed)}: nothing of it applied by --yes; it waits with "
            f"the session (its outbox once the VM is gone). Review it with `vmsandbox ui {name}`, pull it by "
            f"parts (`vmsandbox pull {name} DIR`), or take it with `vmsandbox pull {name} --yes --include-mass`",
            highlight=False,
        )
    parts = [f"{len(outcome.applied)} applied"]
    if outcome.merged:
        parts.append(f"{len(outcome.merged)} merged")
    if outcome.conflicts:
        parts.append(f"{len(outcome.conflicts)} conflict(s) kept beside their files")
    if outcome.left:
        parts.append(f"{outcome.left} not synced")
    if outcome.left_total > outcome.left:
        parts.append(f"{outcome.left_total - outcome.left} more pending outside the paths shown")
    ui.info("Sync-back: " + ", ".join(parts) + ".")


SHOWN = 10  # files that look like credentials named one per line; the rest counted


class Terminal:
    """The person at this terminal, or `--yes` (`yes`, with what `take` takes) when they said so up front. Without
    a terminal, nothing is asked: what `--yes` did not settle waits."""

    def __init__(self, *, yes: bool = False, take: Take | None = None, ask: bool = True) -> None:
        from vmsandbox.core.views import Take

        self.yes, self.take = yes, take or Take()
        self.ask = ask and not yes and ui.is_interactive()

    def leave_out(self, found: Sequence[Finding]) -> bool:
        ui.warn(f"{len(found)} file(s) of the project look like credentials:")
        for f in found[:SHOWN]:
            ui.err.print(f"    {ui.printable(f.path)}: {ui.printable(f.what)}", highlight=False)
        if len(found) > SHOWN:
            ui.err.print(f"    … and {len(found) - SHOWN} more", highlight=False)
        if not ui.is_interactive():
            return True
        answer = ""
        while answer not in ("y", "n"):
            answer = ui.err.input("  Leave them out of the VM? [Y/n] ").strip().lower()[:1] or "y"
        return answer == "y"

    def decide(self, review: Plan) -> Decisions:
        from vmsandbox.core.person import Nobody

        if not (show(review) if self.ask else summary(review)):  # (without questions the report says what waits)
            from vmsandbox.core.views import Decisions

            return Decisions()
        if self.ask:
            name = review.gathered.target.name
            ui.info(f"[dim]To review in the browser instead (hunks, merges): q, then `vmsandbox ui {name}`[/]")
            return ask_person(review)
        return Nobody(yes=self.yes, take=self.take).decide(review)

    def told(self, review: Plan, outcome: Outcome) -> None:
        if review.empty:
            ui.info("No changes in the guest.")
            return
        report(outcome, review.gathered.target.name)

    def keep_login(self, agent: str, files: Sequence[str]) -> bool:
        import typer

        if not ui.is_interactive():
            return False
        return typer.confirm(
            f"The session signed in to {agent} ({', '.join(files)}). Keep that login for later sessions?",
            default=False,
            err=True,
        )

    def fanned_out(self, group: str, outcomes: Sequence[FanOutcome]) -> None:
        rows = [
            [o.name, "-" if o.code is None else str(o.code), f"{o.seconds:.1f}s", str(o.files), str(o.added),
             str(o.removed), {None: "-", True: "pass", False: "FAIL"}[o.check]]
            for o in outcomes
        ]  # fmt: skip
        output.columns(["SESSION", "EXIT", "TIME", "FILES", "+", "-", "CHECK"], rows)
        for o in outcomes:
            if o.error:
                ui.warn(f"{o.name}: {o.error}")
        first, *others = [o.name for o in outcomes] or ["NAME"]
        against = " ".join(f"--against {n}" for n in others)
        ui.info(
            f"Each command's output: fanout.log in the session's directory. Compare them with `vmsandbox diff {first} "
            f"{against} --stat`, take one with `vmsandbox pull NAME`, then `vmsandbox rm --group {group}`"
        )
