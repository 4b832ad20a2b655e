"""`vmsandbox pull`, `diff` and `push`: a session's changes reviewed at the terminal (prompts.py) and applied, shown
as a diff (or beside other sessions'), and host edits sent the other way. Everything shown from the guest is
escaped."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Annotated

import typer

from vmsandbox import ui
from vmsandbox.cli import complete, output
from vmsandbox.cli.base import (
    EXIT_PENDING,
    ApplySafe,
    IncludeBinary,
    IncludeIgnored,
    IncludeMass,
    IncludeRisky,
    SessionName,
    app,
)
from vmsandbox.cli.review.prompts import Terminal, show
from vmsandbox.errors import UsageError

Paths = Annotated[list[str] | None, typer.Argument(help="Only these paths (files or directories).", metavar="PATH...")]
DiffJson = Annotated[
    bool,
    typer.Option(
        "--json",
        help="One JSON document: `steps` (each step's number, command, started, ended, exit, how, egress) and `files`, "
        "each with its `hunks` (number, old and new lines) and who made each (`made_by`: step, command, argv, exe, "
        "badges); with --by step, `groups` instead of `files` (each step's, then `outside`, then `untraced`). With "
        "--stat: one JSON object a line, a path each.",
    ),
]
ByStep = Annotated[
    str | None,
    typer.Option(
        "--by",
        metavar="step",
        help="step: the changes under the step that made them, steps in the order they ran (its command, exit code, "
        "duration, egress requests), then what was written outside any step, then what is not traced. Who made what "
        "is the guest's word.",
    ),
]


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

    Three ways: what the guest changed against what it started from and what the host has now. It works on a
    running or stopped session, and on one whose VM is gone (from its outbox or its disk). Exit code 0 when
    everything is synced, 3 when changes remain (quarantined, ignored, binary, skipped, or unapplied).

    Examples: `vmsandbox pull exp1 --dry-run` · `vmsandbox pull exp1 --yes src/`"""
    from vmsandbox.core import reviews, views

    take = views.Take(risky=include_risky, ignored=include_ignored, binary=include_binary, mass=include_mass)
    if dry_run:
        plan = reviews.review(name, only=only or [])
        if show(plan):
            ui.info(f"Dry run: {len(plan.todo)} change(s) pending; nothing written.")
        return
    settled = reviews.pull(name, Terminal(yes=yes, take=take), only=only or [])
    if settled.removed:
        ui.info(f"Every change of session {name} is dealt with; the session is removed.")
    if settled.outcome.left:
        raise typer.Exit(EXIT_PENDING)


@app.command()
def push(name: SessionName) -> None:
    """Send host edits made during a session into its guest.

    Edits of the project on this machine since the session began go in, never over a change the guest made (those
    are said, and left as they are on both sides).

    Example: `vmsandbox push exp1`"""
    from vmsandbox.core import sessions

    pushed, conflicts = sessions.push(name)
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
        list[str] | None,
        typer.Option(
            "--against",
            metavar="NAME",
            help="Another session's tree (a fan-out's, a fork): their diff; with --stat, or several, side by side.",
            autocompletion=complete.other_sessions,
        ),
    ] = None,
    as_json: DiffJson = False,
    raw: Annotated[
        bool, typer.Option("--raw", help="The guest's bytes as they are, control characters too (for `git apply`).")
    ] = False,
    by: ByStep = None,
) -> None:
    """Show what the guest changed, as a diff.

    Against the session's baseline: text diffs, binaries summarised. Against other sessions (--against): the
    difference between two trees, or with --stat (or several) which paths each changed and where they agree.
    Control characters are shown as \\xNN unless --raw: a pipe often ends in a terminal (`| less -R`).

    Who made each change (--by step, --json): the step (a command the session was asked to run) and the process
    that wrote each hunk, as the guest's journal reported them.

    Examples: `vmsandbox diff exp1 --stat` · `vmsandbox diff exp1 --by step` · `vmsandbox diff exp-1 --against
    exp-2` · `vmsandbox diff exp-1 --against exp-2 --against exp-3 --stat`"""
    from vmsandbox.cli.review import writers
    from vmsandbox.core import reviews, views

    def shown(text: str) -> str:  # guest content never reaches a terminal with its escape sequences
        return text if raw else ui.printable(text, markup=False)

    _refused(name, only, stat=stat, against=against or [], as_json=as_json, by=by)
    if against:
        _across(name, against, stat=stat or len(against) > 1, as_json=as_json, shown=shown)
        return
    plan = reviews.review(name, only=only or [], freeze=False)
    if as_json and stat:
        output.json_lines([{"path": c.path, "kind": c.kind, "note": views.describe(c)} for c in plan.shown])
        return
    if as_json:
        writers.print_document(plan, by_step=by is not None)
        return
    if by is not None:
        writers.print_by_step(plan)
        return
    for c in plan.shown:
        if stat:
            print(shown(f"{c.kind:13} {c.path}  {views.describe(c)}".rstrip()))
        else:
            sys.stdout.write(shown(views.diff_text(plan.gathered, c)))


def _refused(
    name: str, only: list[str] | None, *, stat: bool, against: list[str], as_json: bool, by: str | None
) -> None:
    """A UsageError for the options of `diff` that do not go together."""
    if by is not None and by != "step":
        raise UsageError(f"--by {by!r}: changes are grouped by step only", hint=f"`vmsandbox diff {name} --by step`")
    if by is not None and (stat or against):
        raise UsageError("--by step shows one session's changes by step: not with --stat or --against")
    if against and only:
        raise UsageError("--against compares whole trees: it takes no PATH")
    if against and as_json and not (stat or len(against) > 1):
        raise UsageError(
            "--json with --against goes with --stat",
            hint=f"`vmsandbox diff {name} --against {against[0]} --stat --json`",
        )


def _across(name: str, others: list[str], *, stat: bool, as_json: bool, shown: Callable[[str], str]) -> None:
    """Sessions side by side (--stat, or more than one other), or the diff between two trees."""
    from vmsandbox.core import moments

    if len({name, *others}) < len(others) + 1:
        raise UsageError("--against names another session, once", hint=f"e.g. `vmsandbox diff {name} --against OTHER`")
    if not stat:
        sys.stdout.write(shown(moments.between(name, others[0])))
        return
    names = [name, *others]
    side = moments.side_by_side(names)
    if as_json:
        rows = [
            {"path": r.path, "sessions": dict(zip(names, r.cells, strict=True)), "agree": r.agree} for r in side.rows
        ]
        output.json_lines(rows)
        return
    if not side.shared:
        ui.warn("these sessions were captured separately: each is compared against its own baseline")
    if not side.rows:
        ui.info("None of these sessions changed anything.")
        return
    output.columns(["PATH", *names, ""], [[r.path, *r.cells, "same" if r.agree else "differ"] for r in side.rows])
