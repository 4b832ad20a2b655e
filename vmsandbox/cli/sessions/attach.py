"""`vmsandbox shell`, `exec` and `cp`: a shell, a command or host files in a session that runs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperCommand

from vmsandbox import ui
from vmsandbox.cli import complete
from vmsandbox.cli.base import EXIT_RUN_FAILED, Env, Invocation, NeedsCommand, SessionName, Workdir, app
from vmsandbox.errors import UsageError, VmsandboxError


def ready(name: str) -> None:
    """A stopped session started first, after asking at a terminal; elsewhere the error says how."""
    from vmsandbox.core import sessions

    if not sessions.stopped(name):
        return
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        raise VmsandboxError(f"session {name} is stopped", hint=f"start it with `vmsandbox start {name}`")
    if not typer.confirm(f"Session {name} is stopped. Start it?", default=True, err=True):
        raise typer.Exit(EXIT_RUN_FAILED)
    with ui.step(f"Starting session {name}"):
        sessions.start(name)


def where(workdir: str | None, env: list[str] | None) -> Any:
    from vmsandbox.core import sessions

    return sessions.Where(workdir, sessions.environment(env or []))


class ShellCommand(TyperCommand):
    """`shell [OPTIONS] NAME [COMMAND...]`: everything after NAME is the command, options included (`shell exp1
    ls -l`), as `limactl shell` and `ssh` take it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["context_settings"] = {**(kwargs.get("context_settings") or {}), "allow_interspersed_args": False}
        super().__init__(*args, **kwargs)


class ExecCommand(NeedsCommand):
    """`exec [OPTIONS] NAME [--] COMMAND...`, as docker's: without `--`, everything after NAME is the command; with
    it (split off before the parse, main.py), options may come anywhere before it."""

    tail = "[--] COMMAND..."

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        ctx.allow_interspersed_args = Invocation.command is not None
        return list(super().parse_args(ctx, args))

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [*(p for p in TyperCommand.collect_usage_pieces(self, ctx) if p != "[COMMAND...]"), self.tail]


Interactive = Annotated[
    bool,
    typer.Option("--interactive", "-i", help="Keep stdin open: it always is here (docker's -i, taken as it is)."),
]
Command = Annotated[list[str] | None, typer.Argument(help="What to run, and its arguments.", metavar="COMMAND...")]


@app.command(cls=ShellCommand)
def shell(
    name: SessionName,
    command: Annotated[
        list[str] | None, typer.Argument(help="A command to run instead of a shell.", metavar="COMMAND...")
    ] = None,
    interactive: Interactive = False,
    tty: Annotated[
        bool, typer.Option("--tty", "-t", help="Give COMMAND a terminal even when this is none (a shell has one).")
    ] = False,
    workdir: Workdir = None,
    env: Env = None,
) -> None:
    """Open a shell in a session, or run COMMAND there; exit with its code.

    It starts in the project directory (or --workdir). A stopped session is started first (after asking, at a
    terminal). Options go before NAME: what follows it is the command. A shell is interactive already: `-it` is
    taken as docker's and changes nothing.

    Examples: `vmsandbox shell exp1` · `vmsandbox shell exp1 git log --oneline` · `vmsandbox shell -w src -e
    DEBUG=1 exp1`"""
    from vmsandbox.core import sessions

    del interactive  # stdin is the guest's whatever it says
    argv = list(command or [])
    argv = argv[1:] if argv[:1] == ["--"] else argv
    at = where(workdir, env)
    ready(name)
    terminal = None if not argv else tty or (sys.stdin.isatty() and sys.stdout.isatty())
    raise typer.Exit(sessions.attach(name, argv or None, tty=terminal, where=at))


@app.command("exec", cls=ExecCommand)
def exec_(
    name: SessionName,
    command: Command = None,
    interactive: Interactive = False,
    tty: Annotated[bool, typer.Option("--tty", "-t", help="Give COMMAND a terminal (as `shell` gives one).")] = False,
    workdir: Workdir = None,
    env: Env = None,
) -> None:
    """Run COMMAND in a running session; exit with its code.

    As `docker exec`: what follows NAME is the command (`--` before it is optional; with it, options may come after
    NAME too). It runs in the project directory (or --workdir), without a terminal unless -t: its output stays
    binary-safe, stdout and stderr apart. Unlike docker's, stdin is always passed on (`-i` changes nothing).

    Examples: `vmsandbox exec exp1 git status` · `vmsandbox exec -it exp1 bash` · `vmsandbox exec -w src -e CI=1
    exp1 -- make test`"""
    from vmsandbox.core import sessions

    del interactive  # stdin is the guest's whatever it says
    after = Invocation.command
    if after is not None and command:
        raise UsageError(
            f"a command after NAME and after `--`: {' '.join(command)} -- {' '.join(after)}",
            hint=f"give it once: `vmsandbox exec {name} -- {' '.join([*command, *after])}`",
        )
    cmd = list(after if after is not None else command or [])
    if not cmd:
        raise UsageError("no command given", hint=f"put it after NAME, e.g. `vmsandbox exec {name} make test`")
    raise typer.Exit(sessions.attach(name, cmd, tty=tty, where=where(workdir, env)))


@app.command()
def cp(
    sources: Annotated[
        list[Path],
        typer.Argument(
            help="Files or directories of this machine.", metavar="HOSTPATH...", autocompletion=complete.copy_target
        ),
    ],
    dest: Annotated[
        str, typer.Argument(help="NAME:PATH in the guest (relative: to the project).", metavar="NAME:PATH")
    ],
) -> None:
    """Copy files from this machine into a running session.

    Only into a session: what comes out of a guest comes through the review (`vmsandbox pull`). A file copied into
    the project directory is, for that review, a change the guest made.

    Examples: `vmsandbox cp ./fixtures exp1:tests/` · `vmsandbox cp ~/data.csv exp1:/tmp/data.csv`"""
    from vmsandbox.core import sessions

    name, colon, at = dest.partition(":")
    if not colon:
        raise UsageError(
            f"{dest!r}: the last argument is NAME:PATH, the session and a path in it",
            hint="e.g. `vmsandbox cp ./file exp1:` (the project directory); out of a guest is `vmsandbox pull`",
        )
    with ui.step(f"Copying {len(sources)} item(s) into session {name}"):
        written = sessions.copy_in(name, sources, at)
    ui.info(f"Copied {len(sources)} item(s) into session {name} at {written}")
