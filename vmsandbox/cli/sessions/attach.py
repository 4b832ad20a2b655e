"""`vmsandbox shell` (and `ssh`), `exec` and `cp`: a shell, a command or host files in a session that runs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperCommand

from vmsandbox import ui
from vmsandbox.cli.base import ALIASES, EXIT_RUN_FAILED, NeedsCommand, SessionName, app, tail
from vmsandbox.errors import UsageError, VmsandboxError

if TYPE_CHECKING:
    from vmsandbox.session.record import Record


def ready(name: str, *, starting: bool = False) -> Record:
    """The session, able to take a command (its egress restarted if it had stopped). With `starting`, a
    stopped session is started, after asking at a terminal; elsewhere the error says how."""
    from vmsandbox.session import state
    from vmsandbox.session.record import Record

    record = Record.load(name)
    if starting and record.saved:
        _start_stopped(record)
        record = Record.load(name)
    why = state.usable(record)
    if why is not None:
        from vmsandbox.session.start import create  # (what starts a session: imported only when needed, a tenth of a s)

        ui.warn(f"the egress proxy of session {record.name} {why}, so the guest had no network; restarting it")
        with ui.step("Restarting the egress proxy"):
            create.open_egress(record)
    return record


class ShellCommand(TyperCommand):
    """`shell NAME [COMMAND...]`: everything after NAME is the command, options included (`ssh exp1 ls -l`),
    as `limactl shell` and `ssh` take it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["context_settings"] = {
            **(kwargs.get("context_settings") or {}),
            "allow_interspersed_args": False,
            "ignore_unknown_options": True,
        }
        super().__init__(*args, **kwargs)


@app.command(cls=ShellCommand)
def shell(
    name: SessionName,
    command: Annotated[
        list[str] | None, typer.Argument(help="A command to run instead of a shell.", metavar="[COMMAND]...")
    ] = None,
) -> None:
    """Open a shell in a session, or run COMMAND there; exit with its code.

    It starts in the project directory. A stopped session is started first (after asking, at a terminal).

    Examples:

    `vmsandbox shell exp1`

    `vmsandbox shell exp1 git log --oneline`"""
    from vmsandbox.guest import commands

    argv = list(command or [])
    argv = argv[1:] if argv[:1] == ["--"] else argv
    record = ready(name, starting=True)
    if not argv:
        raise typer.Exit(commands.attach(record.endpoint(), record.project, None))
    tty = sys.stdin.isatty() and sys.stdout.isatty()
    raise typer.Exit(commands.attach(record.endpoint(), record.project, argv, tty=tty))


app.command("ssh", cls=ShellCommand, help="Same as `shell`.", rich_help_panel=ALIASES)(shell)


def _start_stopped(record: Record) -> None:
    from vmsandbox.session.moments import suspend

    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        raise VmsandboxError(f"session {record.name} is stopped", hint=f"start it with `vmsandbox start {record.name}`")
    if not typer.confirm(f"Session {record.name} is stopped. Start it?", default=True, err=True):
        raise typer.Exit(EXIT_RUN_FAILED)
    with ui.step(f"Starting session {record.name}"):
        suspend.start(record.name)


@app.command("exec", cls=NeedsCommand)
def exec_(
    name: SessionName,
    tty: Annotated[bool, typer.Option("--tty", "-t", help="Give CMD a terminal.")] = False,
) -> None:
    """Run COMMAND (after `--`) in a session's project directory; exit with its code.

    Example: `vmsandbox exec NAME -- git status`"""
    from vmsandbox.guest import commands

    cmd = tail(required=True)
    record = ready(name)
    raise typer.Exit(commands.attach(record.endpoint(), record.project, cmd, tty=tty))


@app.command()
def cp(
    sources: Annotated[list[Path], typer.Argument(help="Files or directories of this machine.", metavar="HOSTPATH")],
    dest: Annotated[
        str, typer.Argument(help="NAME:PATH in the guest (relative: to the project).", metavar="NAME:PATH")
    ],
) -> None:
    """Copy files from this machine into a running session.

    Only into a session: what comes out of a guest comes through the review (`vmsandbox pull`). A file copied
    into the project directory is, for that review, a change the guest made.

    Examples:

    `vmsandbox cp ./fixtures exp1:tests/`

    `vmsandbox cp ~/data.csv exp1:/tmp/data.csv`"""
    from vmsandbox.sync.inward import cp as copyin

    name, colon, where = dest.partition(":")
    if not colon:
        raise UsageError(
            f"{dest!r}: the last argument is NAME:PATH, the session and a path in it",
            hint="e.g. `vmsandbox cp ./file exp1:` (the project directory); out of a guest is `vmsandbox pull`",
        )
    record = ready(name)
    with ui.step(f"Copying {len(sources)} item(s) into session {name}"):
        written = copyin.copy_in(record.target(), record.endpoint(), sources, where)
    ui.info(f"Copied {len(sources)} item(s) into session {name} at {written}")
