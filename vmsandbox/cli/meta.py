"""`vmsandbox help`, `version` and `doctor`: the help of any command, what is installed, and every check a
session needs with the fix for each failure. `help` and `version` are not listed by `vmsandbox -h` (its options
-h and --version are, and its last line names `help`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from vmsandbox import ui
from vmsandbox.cli import base, complete, output
from vmsandbox.cli.base import EXIT_FAILED, app
from vmsandbox.errors import UsageError


@app.command("help", hidden=True)  # not listed by -h, whose last line says it
def help_(
    ctx: typer.Context,
    words: Annotated[
        list[str] | None,
        typer.Argument(
            help="A command, or a noun and its verb.", metavar="COMMAND...", autocompletion=complete.commands
        ),
    ] = None,
) -> None:
    """Show the help of a command (or of vmsandbox).

    `vmsandbox NOUN help [VERB]` is the same (`vmsandbox checkpoint help restore`).

    Examples: `vmsandbox help` · `vmsandbox help run` · `vmsandbox help checkpoint restore`"""
    from vmsandbox.cli import aliases

    command, at = ctx.find_root().command, ctx.find_root()
    for given in words or []:
        if given.startswith("-"):
            break
        if not isinstance(command, base.Commands):
            raise UsageError(f"`{at.command_path}` has no verbs", hint=f"`{at.command_path} -h` shows its help")
        word = aliases.same(given, command.commands, top=at.parent is None) or given
        found = command.get_command(at, word)
        if found is None:
            raise aliases.unknown(command, at, [word])
        at = typer.Context(found, info_name=word, parent=at)
        command = found
    typer.echo(at.get_help(), color=at.color)


@app.command(hidden=True)  # not listed by -h (--version is)
def version(as_json: output.AsJson = False) -> None:
    """Print vmsandbox's version.

    Example: `vmsandbox version`"""
    from vmsandbox import __version__

    if as_json:
        output.json_lines([{"version": __version__}])
    else:
        print(f"vmsandbox {__version__}")


@app.command()
def doctor(as_json: output.AsJson = False) -> None:
    """Check everything a session needs; print the fix for each failure.

    Your config (and this directory's .vmsandbox.yaml) first: a problem there is one failed check, with every
    problem at its line, and the other checks go on with what of it passes.

    Example: `vmsandbox doctor | less`"""
    from vmsandbox.core import hosts

    checks = hosts.diagnose(Path.cwd())
    if as_json:
        output.json_lines([{"name": c.name, "level": c.level, "detail": c.detail, "fix": c.fix} for c in checks])
    else:
        marks = {"ok": "[green]✓[/]", "warn": "[yellow]![/]", "fail": "[red]✗[/]"}
        for c in checks:  # the report is this command's output: stdout (`vmsandbox doctor | less`)
            ui.out.print(f"{marks[c.level]} {c.name}: {ui.printable(c.detail)}")
            if c.fix and not c.ok:
                ui.out.print(f"    fix: {ui.printable(c.fix)}")
    failed = [c for c in checks if c.level == "fail"]
    if failed:
        if not as_json:
            ui.out.print(f"[red]A session cannot start here:[/] {len(failed)} check(s) failed.")
        raise typer.Exit(EXIT_FAILED)
