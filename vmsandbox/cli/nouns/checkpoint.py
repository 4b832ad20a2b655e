"""`vmsandbox checkpoint`, `checkpoints`, `rollback`, `fork`, `fanout` and `compare`: a session's whole state
kept, returned to and copied; many sessions from one capture, side by side."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from vmsandbox import ui
from vmsandbox.cli import complete
from vmsandbox.cli import run as run_mod
from vmsandbox.cli.base import (
    AsJson,
    Label,
    Quiet,
    SessionName,
    TakesCommand,
    age,
    app,
    columns,
    print_json,
    sync_limit,
    tail,
)
from vmsandbox.errors import UsageError, VmsandboxError

if TYPE_CHECKING:
    from vmsandbox.session.place.checkpoints import Checkpoint
    from vmsandbox.session.record import Record


@app.command()
def checkpoint(
    name: Annotated[
        str,
        typer.Argument(
            help="Session name (or `rm`: remove a checkpoint, `checkpoint rm NAME LABEL`).",
            metavar="NAME",
            autocompletion=complete.sessions,
        ),
    ],
    label: Annotated[
        str | None, typer.Argument(help="A label for it (default: cp-DATE-TIME).", metavar="LABEL")
    ] = None,
    removed: Annotated[
        str | None, typer.Argument(help="With `rm`: the label to remove.", show_default=False, metavar="LABEL")
    ] = None,
) -> None:
    """Take a checkpoint of a running session (memory, disks, workspace).

    Keep a running session's whole state — memory (its processes), disks, workspace — to return to with
    `vmsandbox rollback NAME LABEL` or copy with `vmsandbox fork NAME NEW --from LABEL`. The guest pauses for a
    few seconds.

    Examples: `vmsandbox checkpoint exp1 before-refactor` · `vmsandbox checkpoint rm exp1 before-refactor`"""
    from vmsandbox.session.moments import checkpoint as cp_mod
    from vmsandbox.session.record import Record

    if name == "rm" and removed is not None and label is not None:
        gone = cp_mod.remove(label, removed)
        ui.info(f"Removed checkpoint {gone.label} of session {label}")
        return
    if name == "rm":
        raise UsageError("`checkpoint rm` takes a session and a label", hint="e.g. `vmsandbox checkpoint rm exp1 c1`")
    if removed is not None:
        raise UsageError(f"`checkpoint {name} {label}` takes no third argument", hint="did you mean `checkpoint rm`?")
    started = time.monotonic()
    cp = cp_mod.take(name, label)
    took = time.monotonic() - started
    size = _mib(_sizes(Record.load(name), [cp])[cp.label])
    ui.info(
        f"[green]✓[/] Checkpoint [bold]{cp.label}[/] of session {name} ({size}, {took:.1f} s); "
        f"`vmsandbox rollback {name} {cp.label}` returns to it"
    )


def _sizes(record: Record, found: list[Checkpoint]) -> dict[str, int | None]:
    """Each checkpoint's bytes where they are kept (None: the session's host did not answer)."""
    from vmsandbox.session.moments import checkpoint

    try:
        return dict(checkpoint.sizes(record, found))
    except VmsandboxError as exc:
        ui.warn(exc.message)
        return dict.fromkeys((c.label for c in found), None)


def _mib(size: int | None) -> str:
    return "? MiB" if size is None else f"{size / 1024**2:.0f} MiB"


@app.command()
def checkpoints(name: SessionName, as_json: AsJson = False, quiet: Quiet = False) -> None:
    """List a session's checkpoints, oldest first, with their age and size on disk.

    Example: `vmsandbox checkpoints exp1`"""
    from vmsandbox.session.place import checkpoints
    from vmsandbox.session.record import Record

    record = Record.load(name)
    found = checkpoints.listed(record.files)
    sizes = _sizes(record, found)
    if as_json:
        print_json([{**c.as_dict(), "bytes": sizes[c.label]} for c in found])
        return
    if quiet:
        for c in found:
            print(c.label)
        return
    if not found:
        ui.info(f"Session {name} has no checkpoints: `vmsandbox checkpoint {name} LABEL` takes one.")
        return
    columns(
        ["LABEL", "AGE", "SIZE"],
        [[c.label, age(time.time() - c.created), _mib(sizes[c.label])] for c in found],
    )


@app.command()
def rollback(name: SessionName, label: Label) -> None:
    """Return a session to one of its checkpoints.

    Return a session to a checkpoint: its processes, files and disks as they were then. Changes not yet
    pulled are exported first (a patch and the files), never lost.

    Example: `vmsandbox rollback exp1 before-refactor`"""
    from vmsandbox.session.moments import checkpoint as cp_mod

    started = time.monotonic()
    rolled = cp_mod.rollback(name, label, limit=sync_limit())
    if rolled.box is not None:
        ui.info(f"{rolled.left} unsynced change(s) from before the rollback are kept in {rolled.box}")
        ui.info(f"  (its changes.patch applies with `git apply`; the changed files are in {rolled.box}/files)")
    ui.info(f"[green]✓[/] Session {name} is back at checkpoint {label} ({time.monotonic() - started:.1f} s)")


@app.command()
def fork(
    name: SessionName,
    new: Annotated[str, typer.Argument(help="The new session's name.", metavar="NEW")],
    label: Annotated[
        str | None,
        typer.Option(
            "--from", help="Fork from this checkpoint of NAME instead of its state now.", autocompletion=complete.labels
        ),
    ] = None,
) -> None:
    """Copy a session (or one of its checkpoints) into a new session.

    Make an independent session NEW from NAME's state now (or a checkpoint's): its files, disks and running
    processes, with its own identity, keys, egress and placeholders, and the same baseline for its review.

    Example: `vmsandbox fork exp1 exp1-b`, then `vmsandbox shell exp1-b`"""
    from vmsandbox.session.moments import fork as fork_mod

    started = time.monotonic()
    record = fork_mod.fork(name, new, label=label)
    ui.info(
        f"[green]✓[/] Session [bold]{record.name}[/] forked from {record.forked_from} "
        f"({time.monotonic() - started:.1f} s): `vmsandbox shell {record.name}`"
    )


def _fanout_command() -> Callable[..., None]:
    """`vmsandbox fanout N PATH [run options] -- COMMAND`: `run --fanout N`."""

    def command(**given: Any) -> None:
        n, path, blueprint = given.pop("n"), given.pop("path"), given.pop("blueprint")
        run_mod.run_session(path, blueprint, tail(required=True), run_mod.flags_of({**given, "fanout": n}))

    count = inspect.Parameter(
        "n",
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        annotation=Annotated[int, typer.Argument(help="How many sessions.", show_default=False, metavar="N")],
    )
    doc = (
        "Run COMMAND in N sessions at once, then compare what each did.\n\n"
        "Start N sessions from one capture of PATH, each running COMMAND (after `--`) with VMSANDBOX_INDEX=1..N, "
        "then show what each did: exit code, time, files and lines changed, and whether `--check` passes.\n\n"
        "Example:\n\n`vmsandbox fanout 3 . --check 'make test' -- sh -c 'echo $VMSANDBOX_INDEX > n.txt'`"
    )
    return run_mod.like_run(command, "fanout", doc, leave_out="fanout", first=(count,))


app.command("fanout", cls=TakesCommand)(_fanout_command())


@app.command()
def compare(
    names: Annotated[
        list[str],
        typer.Argument(
            help="Two or more sessions (a fan-out's, or a session and its forks).",
            metavar="NAME",
            autocompletion=complete.sessions,
        ),
    ],
    as_json: AsJson = False,
) -> None:
    """Compare the changes of several sessions side by side.

    Show side by side which paths each session changed against its baseline, and where they agree.

    Example: `vmsandbox compare exp-1 exp-2 exp-3`, then `vmsandbox diff exp-1 --against exp-2`"""
    from vmsandbox.session.moments import compare as across

    if len(names) < 2:
        raise UsageError("compare needs two or more sessions", hint="e.g. `vmsandbox compare exp-1 exp-2`")
    trees = [across.fetch(n, limit=sync_limit()) for n in names]
    rows = across.compare(trees)
    if as_json:
        print_json(
            [{"path": r.path, "sessions": dict(zip(names, r.cells, strict=True)), "agree": r.agree} for r in rows]
        )
        return
    if not across.shared_baseline(trees):
        ui.warn("these sessions were captured separately: each is compared against its own baseline")
    if not rows:
        ui.info("None of these sessions changed anything.")
        return
    columns(["PATH", *names, ""], [[r.path, *r.cells, "same" if r.agree else "differ"] for r in rows])  # escaped
