"""The person at the terminal (core.person.Person): the summary of a review and its questions, the decisions
(--yes, the person, or none), the report of what was done, the credentials named before boot, a login kept, a
fan-out's table. Everything shown from the guest is escaped."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vmsandbox import ui

if TYPE_CHECKING:
    from collections.abc import Sequence

    from vmsandbox.session.moments.fanout import Outcome as FanOutcome
    from vmsandbox.sync.review.plan import Decisions, Item, Outcome, Plan
    from vmsandbox.sync.review.take import Take
    from vmsandbox.sync.scan.credentials import Finding


def summary_table(plan: Plan) -> Any:
    from rich.table import Column, Table

    from vmsandbox.sync.review import diff
    from vmsandbox.sync.review.compare import Status
    from vmsandbox.sync.review.plan import grouped

    # paths and notes fold onto more lines rather than end in "…": a path is read (and copied) whole
    table = Table(
        Column("STATUS", no_wrap=True),
        Column("CHANGE", no_wrap=True),
        Column("PATH", overflow="fold"),
        Column("NOTE", overflow="fold"),
        box=None,
    )
    for item in grouped(plan.shown):
        c = item.first
        status = {
            "apply": "[green]apply[/]", "merged": "[cyan]merged[/]", "conflict": "[red]conflict[/]",
            "unsafe": "[red]refused[/]",
        }[c.status]  # fmt: skip
        if item.quarantined and c.status in (Status.APPLY, Status.MERGED):
            status = "[yellow]quarantined[/]"
        elif item.held and c.status in (Status.APPLY, Status.MERGED):
            status = "[dim]ignored[/]"
        elif item.secret and c.status in (Status.APPLY, Status.MERGED):
            status = "[red]credential?[/]"
        if item.repository:
            table.add_row(status, "repository", ui.printable(item.label), ui.printable(c.risky or ""))
            continue
        shown = c.notes if c.status is Status.UNSAFE else [*c.notes, diff.describe(c)]  # a refusal names the target
        if c.merge is not None and not c.merge.clean:
            shown.insert(0, f"{c.merge.conflicts} overlapping hunk(s), the rest merged")
        notes = "; ".join(filter(None, [c.secret, c.risky, c.held, "binary" if c.binary else None, *shown]))
        table.add_row(status, c.kind, ui.printable(c.path), ui.printable(notes))
    return table


def _ask(question: str, choices: str) -> str:
    while True:
        answer = ui.err.input(ui.printable(f"{question} [{'/'.join(choices)}] ")).strip()
        if answer in choices:
            return answer
        ui.err.print(f"answer one of: {', '.join(choices)}")


def ask_person(plan: Plan) -> Decisions:
    """Per item: y apply, n skip, d diff, a apply all remaining safe items, q stop; then the commits."""
    from vmsandbox.sync.review import diff
    from vmsandbox.sync.review.compare import Status
    from vmsandbox.sync.review.plan import Decisions

    if plan.mass is not None:
        return _ask_mass(plan)
    SAFE = (Status.APPLY, Status.MERGED)  # noqa: N806
    accepted: list[Item] = []
    apply_rest = False
    for i, item in enumerate(plan.todo, 1):
        c = item.first
        if apply_rest and not (item.risky or item.held or item.binary or item.secret) and c.status in SAFE:
            accepted.append(item)
            continue
        verb = {Status.CONFLICT: "keep the guest version beside it", Status.MERGED: "apply the merge"}.get(
            c.status, "apply"
        )
        why = item.secret or item.risky or item.held or ("binary: apply only what you know" if item.binary else None)
        warn = f" [yellow]⚠ {ui.printable(why)}[/]" if why else ""
        ui.err.print(f"[bold]({i}/{len(plan.todo)})[/] {item.kind} {ui.printable(item.label)} — {c.status.value}{warn}")
        while True:
            answer = _ask(f"  {verb}? y=yes n=no d=diff a=all safe q=quit", "yndaq")
            if answer != "d":
                break
            text = "".join(diff.merge_text(plan.gathered, m) or diff.diff_text(plan.gathered, m) for m in item.changes)
            ui.err.print(ui.printable(text, markup=False), markup=False, highlight=False)
        if answer == "q":
            break
        if answer in "ya":
            accepted.append(item)
        apply_rest = apply_rest or answer == "a"
    name = plan.gathered.target.name
    take = plan.gathered.refs_changed and (
        _ask(f"Fetch the guest's commits into refs/remotes/vmsandbox-{name}/*? y=yes n=no", "yn") == "y"
    )
    return Decisions(tuple(accepted), (), take)


def _ask_mass(plan: Plan) -> Decisions:
    """A mass change is not asked item by item: the safe part of it as a whole, or nothing."""
    from vmsandbox.sync.review.plan import Decisions
    from vmsandbox.sync.review.take import Take

    answer = _ask(
        f"  A mass change ({plan.mass}). a=apply its safe changes (not quarantined, ignored, binary) "
        "n=leave it all pending (review it with `vmsandbox ui`)",
        "an",
    )
    if answer == "a":
        return Decisions.safe(plan, Take(mass=True))
    return Decisions(massed=tuple(plan.todo))


def mass_table(plan: Plan) -> Any:
    from rich.table import Column, Table

    from vmsandbox.sync.review import mass

    table = Table(Column("CHANGES", justify="right"), Column("KIND"), Column("SIZE", justify="right"),
                  Column("UNDER", overflow="fold"), box=None)  # fmt: skip
    groups = mass.grouped(c for i in plan.todo for c in i.changes)
    for g in groups[:MASS_ROWS]:
        table.add_row(str(g.count), g.kind, f"{g.size / 1024**2:.1f} MiB", ui.printable(g.where))
    if len(groups) > MASS_ROWS:
        rest = groups[MASS_ROWS:]
        table.add_row(str(sum(g.count for g in rest)), "…", "", f"{len(rest)} more groups")
    return table


MASS_ROWS = 30


def show(plan: Plan) -> bool:
    """The summary of a plan; False when there is nothing to review."""
    if plan.empty:
        ui.info("No changes in the guest.")
        return False
    if plan.mass is not None:
        ui.err.print(mass_table(plan))
        ui.warn(f"a mass change: {plan.mass}; shown grouped by directory and kind")
    elif plan.shown:
        ui.err.print(summary_table(plan))
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
        from vmsandbox.sync.review.take import Take

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

        if not show(review):
            from vmsandbox.sync.review.plan import Decisions

            return Decisions()
        if self.ask:
            name = review.gathered.target.name
            ui.info(f"[dim]To review in the browser instead (hunks, merges): q, then `vmsandbox ui {name}`[/]")
            return ask_person(review)
        return Nobody(yes=self.yes, take=self.take).decide(review)

    def told(self, review: Plan, outcome: Outcome) -> None:
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
        from vmsandbox.cli.base import columns

        rows = [
            [o.name, "-" if o.code is None else str(o.code), f"{o.seconds:.1f}s", str(o.files), str(o.added),
             str(o.removed), {None: "-", True: "pass", False: "FAIL"}[o.check]]
            for o in outcomes
        ]  # fmt: skip
        columns(["SESSION", "EXIT", "TIME", "FILES", "+", "-", "CHECK"], rows)
        for o in outcomes:
            if o.error:
                ui.warn(f"{o.name}: {o.error}")
        ui.info(
            f"Each command's output: fanout.log in the session's directory. Compare them with `vmsandbox compare "
            f"{' '.join(o.name for o in outcomes)}`, take one with `vmsandbox pull NAME`, then "
            f"`vmsandbox destroy --group {group}`"
        )
