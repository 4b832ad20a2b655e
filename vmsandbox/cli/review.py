"""`vmsandbox pull|recover|diff|push`, and the review at the end of `run`: showing a plan (sync.plan), asking
the person, and printing the outcome. Everything shown from the guest is escaped."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from vmsandbox import ui
from vmsandbox.cli.base import (
    EXIT_PENDING,
    ApplySafe,
    IncludeBinary,
    IncludeIgnored,
    IncludeRisky,
    SessionName,
    app,
    sync_limit,
)
from vmsandbox.errors import VmsandboxError

if TYPE_CHECKING:
    from vmsandbox.session.record import Record
    from vmsandbox.sync.plan import Decisions, Item, Outcome, Plan
    from vmsandbox.sync.take import Take


def summary_table(plan: Plan) -> Any:
    from rich.table import Column, Table

    from vmsandbox.sync import diff
    from vmsandbox.sync.compare import Status
    from vmsandbox.sync.plan import grouped

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
        status = {"apply": "[green]apply[/]", "conflict": "[red]conflict[/]", "unsafe": "[red]refused[/]"}[c.status]
        if item.quarantined and c.status is Status.APPLY:
            status = "[yellow]quarantined[/]"
        elif item.held and c.status is Status.APPLY:
            status = "[dim]ignored[/]"
        if item.repository:
            table.add_row(status, "repository", ui.printable(item.label), ui.printable(c.risky or ""))
            continue
        shown = c.notes if c.status is Status.UNSAFE else [*c.notes, diff.describe(c)]  # a refusal names the target
        notes = "; ".join(filter(None, [c.risky, c.held, "binary" if c.binary else None, *shown]))
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
    from vmsandbox.sync import diff
    from vmsandbox.sync.compare import Status
    from vmsandbox.sync.plan import Decisions

    accepted: list[Item] = []
    apply_rest = False
    for i, item in enumerate(plan.todo, 1):
        c = item.first
        if apply_rest and not item.risky and not item.held and not item.binary and c.status is Status.APPLY:
            accepted.append(item)
            continue
        verb = "keep the guest version beside it" if c.status is Status.CONFLICT else "apply"
        why = item.risky or item.held or ("binary: apply only what you know" if item.binary else None)
        warn = f" [yellow]⚠ {ui.printable(why)}[/]" if why else ""
        ui.err.print(f"[bold]({i}/{len(plan.todo)})[/] {item.kind} {ui.printable(item.label)} — {c.status.value}{warn}")
        while True:
            answer = _ask(f"  {verb}? y=yes n=no d=diff a=all safe q=quit", "yndaq")
            if answer != "d":
                break
            text = "".join(diff.diff_text(plan.gathered, m) for m in item.changes)
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


def decide(plan: Plan, *, yes: bool, take: Take) -> Decisions:
    """The decisions for a plan: --yes, a person at a terminal, or (neither) nothing."""
    from vmsandbox.sync.plan import Decisions

    if yes:
        return Decisions.safe(plan, take)
    if ui.is_interactive():
        return ask_person(plan)
    ui.warn(
        "no terminal to review on and no --yes: nothing applied (rerun with --yes to apply the safe "
        "changes, or on a terminal to choose)"
    )
    return Decisions()


def show(plan: Plan) -> bool:
    """The summary of a plan; False when there is nothing to review."""
    if plan.empty:
        ui.info("No changes in the guest.")
        return False
    if plan.shown:
        ui.err.print(summary_table(plan))
    return True


def report(outcome: Outcome, name: str) -> None:
    for label, items, colour in (
        ("applied", outcome.applied, "green"),
        ("conflict", outcome.conflicts, "red"),
        ("quarantined", outcome.quarantined, "yellow"),
        ("not applied", outcome.skipped, "yellow"),
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
    parts = [f"{len(outcome.applied)} applied"]
    if outcome.conflicts:
        parts.append(f"{len(outcome.conflicts)} conflict(s) kept beside their files")
    if outcome.left:
        parts.append(f"{outcome.left} not synced")
    if outcome.left_total > outcome.left:
        parts.append(f"{outcome.left_total - outcome.left} more pending outside the paths shown")
    ui.info("Sync-back: " + ", ".join(parts) + ".")


def conduct(record: Record, plan: Plan, *, yes: bool, take: Take) -> Outcome:
    """Show the plan, get the decisions (--yes, a person, or none), carry them out, report."""
    from vmsandbox.session import lifecycle
    from vmsandbox.sync.plan import Decisions

    something = show(plan)
    decisions = decide(plan, yes=yes, take=take) if something else Decisions()
    outcome = lifecycle.decide(record, plan, decisions)
    if something:
        report(outcome, record.name)
    return outcome


def review_session(name: str, *, yes: bool, take: Take, dry_run: bool = False, only: list[str]) -> int:
    """pull/recover: review, apply what is decided, report; the number of changes left (0 for a dry run)."""
    from vmsandbox.session import lifecycle, lock
    from vmsandbox.session.record import Record

    record = Record.load(name)
    with lock.held(record.files, name, "reviewing the changes of"):
        record = Record.load(name)  # as the holder before us left it
        plan = lifecycle.review(record, limit=sync_limit(), only=only)
        if dry_run:
            if show(plan):
                ui.info(f"Dry run: {len(plan.todo)} change(s) pending; nothing written.")
            return 0
        outcome = conduct(record, plan, yes=yes, take=take)
        if lifecycle.settle(record, outcome):
            ui.info(f"Every change of session {name} is dealt with; the session is removed.")
        return outcome.left


Paths = Annotated[list[str] | None, typer.Argument(help="Only these paths (files or directories).")]


@app.command()
def pull(
    name: SessionName,
    only: Paths = None,
    yes: ApplySafe = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what would happen; write nothing.")] = False,
    include_risky: IncludeRisky = False,
    include_ignored: IncludeIgnored = False,
    include_binary: IncludeBinary = False,
) -> None:
    """Review the guest's changes and sync the accepted ones into the project (three-way).

    Exit code 0 when everything is synced, 3 when changes remain (quarantined, ignored, binary, skipped, or
    unapplied).

    Example: `vmsandbox pull exp1 --dry-run`, then `vmsandbox pull exp1 --yes src/`
    """
    from vmsandbox.sync.take import Take

    take = Take(risky=include_risky, ignored=include_ignored, binary=include_binary)
    left = review_session(name, yes=yes, take=take, dry_run=dry_run, only=only or [])
    if left:
        raise typer.Exit(EXIT_PENDING)


@app.command()
def recover(
    name: SessionName,
    yes: ApplySafe = False,
    include_risky: IncludeRisky = False,
    include_ignored: IncludeIgnored = False,
    include_binary: IncludeBinary = False,
) -> None:
    """Review and apply a session's unsynced changes after its VM is gone (from its outbox or its disk).

    Example: `vmsandbox recover exp1 --yes`"""
    from vmsandbox.sync.take import Take

    take = Take(risky=include_risky, ignored=include_ignored, binary=include_binary)
    if review_session(name, yes=yes, take=take, only=[]):
        raise typer.Exit(EXIT_PENDING)


@app.command()
def push(name: SessionName) -> None:
    """Send host edits made during the session into the guest, never over a change the guest made.

    Example: `vmsandbox push exp1`"""
    from vmsandbox.session import lock, state
    from vmsandbox.session.record import Record
    from vmsandbox.sync import push as pushing

    record = Record.load(name)
    state.usable(record)
    with lock.held(record.files, name, "pushing into"):
        record = Record.load(name)
        pushed, conflicts = pushing.push(record.target(), record.endpoint(), limit=sync_limit())
    for path in pushed:
        ui.err.print(f"  [green]pushed[/] {ui.printable(path)}")
    for path in conflicts:
        ui.err.print(f"  [red]conflict[/] {ui.printable(path)}: changed in the guest too; left as it is on both sides")
    ui.info(f"Push: {len(pushed)} sent, {len(conflicts)} conflict(s).")
    if conflicts:
        raise typer.Exit(EXIT_PENDING)


@app.command()
def diff(
    name: SessionName,
    only: Paths = None,
    stat: Annotated[bool, typer.Option("--stat", help="One line per changed path.")] = False,
    against: Annotated[
        str | None, typer.Option("--against", help="Diff against another session's tree (a fan-out's, a fork).")
    ] = None,
    raw: Annotated[
        bool, typer.Option("--raw", help="The guest's bytes as they are, control characters too (for `git apply`).")
    ] = False,
) -> None:
    """What the guest changed against the session's baseline: text diffs, binaries summarised. Control
    characters are shown as \\xNN unless --raw: a pipe often ends in a terminal (`| cat`, `| less -R`).

    Examples: `vmsandbox diff exp1 --stat` · `vmsandbox diff exp-1 --against exp-2`"""
    from vmsandbox.session import lifecycle
    from vmsandbox.session.record import Record
    from vmsandbox.sync import diff as diffs

    def shown(text: str) -> str:  # guest content never reaches a terminal with its escape sequences
        return text if raw else ui.printable(text, markup=False)

    if against is not None:
        from vmsandbox.session import across

        if only or stat:
            raise VmsandboxError("--against shows whole trees: it takes no PATHS and no --stat")
        theirs, ours = across.fetch(against, limit=sync_limit()), across.fetch(name, limit=sync_limit())
        sys.stdout.write(shown(across.diff_between(ours, theirs)))
        return
    plan = lifecycle.review(Record.load(name), limit=sync_limit(), only=only or [])

    for c in plan.shown:
        if stat:
            print(shown(f"{c.kind:13} {c.path}  {diffs.describe(c)}".rstrip()))
        else:
            sys.stdout.write(shown(diffs.diff_text(plan.gathered, c)))
