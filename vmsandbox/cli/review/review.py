"""`vmsandbox pull|recover|diff|push`: a session's plan (sync.plan) reviewed at the terminal (prompts.py), or
shown as a diff. Everything shown from the guest is escaped."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import typer

from vmsandbox import ui
from vmsandbox.cli.base import (
    EXIT_PENDING,
    ApplySafe,
    IncludeBinary,
    IncludeIgnored,
    IncludeMass,
    IncludeRisky,
    SessionName,
    app,
    sync_limit,
)
from vmsandbox.cli.prompts import Terminal, show
from vmsandbox.errors import UsageError

if TYPE_CHECKING:
    from vmsandbox.sync.review.take import Take


def review_session(name: str, *, yes: bool, take: Take, dry_run: bool = False, only: list[str]) -> int:
    """pull/recover: the review put to the person at this terminal (or --yes), through the core; the number of
    changes left (0 for a dry run)."""
    from vmsandbox.core import reviews

    if dry_run:
        plan = reviews.review(name, only=only)
        if show(plan):
            ui.info(f"Dry run: {len(plan.todo)} change(s) pending; nothing written.")
        return 0
    settled = reviews.pull(name, Terminal(yes=yes, take=take), only=only)
    if settled.removed:
        ui.info(f"Every change of session {name} is dealt with; the session is removed.")
    return settled.outcome.left


Paths = Annotated[list[str] | None, typer.Argument(help="Only these paths (files or directories).", metavar="PATH")]


@app.command()
def pull(
    name: SessionName,
    only: Paths = None,
    yes: ApplySafe = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what would happen; write nothing.")] = False,
    include_risky: IncludeRisky = False,
    include_ignored: IncludeIgnored = False,
    include_binary: IncludeBinary = False,
    include_mass: IncludeMass = False,
) -> None:
    """Review the guest's changes and apply the ones you accept to the project.

    Review the guest's changes and sync the accepted ones into the project (three-way).

    Exit code 0 when everything is synced, 3 when changes remain (quarantined, ignored, binary, skipped, or
    unapplied).

    Example: `vmsandbox pull exp1 --dry-run`, then `vmsandbox pull exp1 --yes src/`
    """
    from vmsandbox.sync.review.take import Take

    take = Take(risky=include_risky, ignored=include_ignored, binary=include_binary, mass=include_mass)
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
    include_mass: IncludeMass = False,
) -> None:
    """Review the changes of a session whose VM is gone.

    Review and apply a session's unsynced changes after its VM is gone (from its outbox or its disk).

    Example: `vmsandbox recover exp1 --yes`"""
    from vmsandbox.sync.review.take import Take

    take = Take(risky=include_risky, ignored=include_ignored, binary=include_binary, mass=include_mass)
    if review_session(name, yes=yes, take=take, only=[]):
        raise typer.Exit(EXIT_PENDING)


@app.command()
def push(name: SessionName) -> None:
    """Send host edits made during a session into its guest.

    Send host edits made during the session into the guest, never over a change the guest made.

    Example: `vmsandbox push exp1`"""
    from vmsandbox.session import lock, state
    from vmsandbox.session.record import Record
    from vmsandbox.sync.inward import push as pushing

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
    """Show what the guest changed, as a diff.

    What the guest changed against the session's baseline: text diffs, binaries summarised. Control
    characters are shown as \\xNN unless --raw: a pipe often ends in a terminal (`| cat`, `| less -R`).

    Examples: `vmsandbox diff exp1 --stat` · `vmsandbox diff exp-1 --against exp-2`"""
    from vmsandbox.core import reviews
    from vmsandbox.sync.review import diff as diffs

    def shown(text: str) -> str:  # guest content never reaches a terminal with its escape sequences
        return text if raw else ui.printable(text, markup=False)

    if against is not None:
        from vmsandbox.session.moments import compare as across

        if only or stat:
            raise UsageError("--against shows whole trees: it takes no PATHS and no --stat")
        theirs, ours = across.fetch(against, limit=sync_limit()), across.fetch(name, limit=sync_limit())
        sys.stdout.write(shown(across.diff_between(ours, theirs)))
        return
    plan = reviews.review(name, only=only or [], freeze=False)

    for c in plan.shown:
        if stat:
            print(shown(f"{c.kind:13} {c.path}  {diffs.describe(c)}".rstrip()))
        else:
            sys.stdout.write(shown(diffs.diff_text(plan.gathered, c)))
