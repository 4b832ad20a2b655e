"""The entry point: `vmsandbox …`. The only place a VmsandboxError becomes a red line, a hint and an exit code.
Before the line is parsed, an old name is put in the one grammar (aliases.py), `-v` is taken wherever it is, and
the command after `--` is set aside. Every command module is imported here, which registers its commands on the
shared app."""

from __future__ import annotations

import os
import re
import shlex
import signal
import sys
from typing import Annotated, NoReturn

import typer
import typer.main

from vmsandbox import ui
from vmsandbox.cli import aliases, completion, meta, serve  # noqa: F401
from vmsandbox.cli.base import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_RUN_FAILED,
    EXIT_USAGE,
    GLOBAL_FLAGS,
    PASS_THE_CODE,
    RENAMED,
    TAKE_A_COMMAND,
    Invocation,
    app,
    command_word,
    said,
)
from vmsandbox.cli.nouns import (  # noqa: F401
    checkpoint,
    config,
    host,
    image,
    login,
    policy,
    port,
    secret,
    trust,
)
from vmsandbox.cli.review import review, webui  # noqa: F401
from vmsandbox.cli.sessions import attach, lifecycle, listing, logs, run  # noqa: F401
from vmsandbox.errors import UsageError, VmsandboxError

RENAMED.update(aliases.TOP | aliases.FOLDED)  # "did you mean" offers an old name's new form


@app.callback(invoke_without_command=True)
def _root(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log every step and command to stderr.")] = False,
    version: Annotated[bool, typer.Option("--version", help="Print the version.")] = False,
) -> None:
    from vmsandbox.core import settings

    if version:
        print(settings.version())
        raise typer.Exit(0)
    settings.open_log(verbose)


def missing_separator(message: str, args: list[str]) -> str | None:
    """`vmsandbox run proj make test`: the parser's "unexpected extra arguments (make test)" means a command
    given without `--`, for a command that takes one. The hint shows the command line as it should be."""
    if command_word(args) not in TAKE_A_COMMAND:
        return None
    found = re.fullmatch(r"Got unexpected extra argument(?:s|\(s\))? \((.*)\)", message.strip())
    if found is None:
        return None
    extra = found.group(1).split(" ")
    if args[-len(extra) :] != extra:
        return "put the command to run after `--`, e.g. `vmsandbox run . -- make test`"
    return "put the command to run after `--`: " + shlex.join(["vmsandbox", *args[: -len(extra)], "--", *extra])


def global_flags(args: list[str]) -> list[str]:
    """`-v` wherever it is on the line, moved before the command (never after `--`, nor in the command that
    `shell NAME` runs)."""
    word = command_word(args)
    end = args.index("--") if "--" in args else len(args)
    if word == "shell":  # `shell [OPTIONS] NAME COMMAND...`: what follows NAME is the guest's
        start = args.index(word)
        named = next((i for i in range(start + 1, end) if not args[i].startswith("-")), end)
        end = min(end, named + 1)
    found = [i for i in range(end) if args[i] in GLOBAL_FLAGS]
    return [*(args[i] for i in found[:1]), *(a for i, a in enumerate(args) if i not in found)]


def prepare(args: list[str]) -> list[str]:
    """The line as typer parses it: in the one grammar, `-v` first, the command after `--` set aside."""
    word = command_word(args)
    if word is not None:
        args = aliases.modern(args, args.index(word), lambda: typer.main.get_command(app))
    args = global_flags(args)
    word = command_word(args)
    Invocation.command = None
    Invocation.failed = EXIT_RUN_FAILED if word in PASS_THE_CODE else EXIT_FAILED
    if word in TAKE_A_COMMAND and "--" in args:
        cut = args.index("--")
        args, Invocation.command = args[:cut], args[cut + 1 :]
    return args


def _terminate(signum: int, _frame: object) -> NoReturn:
    raise SystemExit(128 + signum)  # unwinds through every cleanup handler, like Ctrl-C


def main(argv: list[str] | None = None) -> NoReturn:
    args = list(sys.argv[1:] if argv is None else argv)
    os.umask(0o077)  # whatever vmsandbox writes is private unless it says otherwise (images do)
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)
    try:
        args = prepare(args)
        code = app(args=args, prog_name="vmsandbox", standalone_mode=False)
    except VmsandboxError as exc:  # plain text that may quote a guest (stderr of ssh, rsync, git): escaped
        said(exc)
        sys.exit(EXIT_USAGE if isinstance(exc, UsageError) else Invocation.failed)
    except PermissionError as exc:  # a file of another account: say which, never a traceback
        ui.err.print(f"[red]error:[/] permission denied: {ui.printable(str(exc.filename))}", soft_wrap=True)
        ui.err.print(
            "[dim]hint:[/] it belongs to another account (`ls -l` shows which); run vmsandbox as that account, "
            "with or without sudo as the session was made",
            soft_wrap=True,
        )
        sys.exit(Invocation.failed)
    except KeyboardInterrupt:
        ui.err.print("[red]interrupted[/]")
        sys.exit(EXIT_INTERRUPTED)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        ui.err.print("[red]aborted[/]")
        sys.exit(EXIT_INTERRUPTED)
    except Exception as exc:  # usage errors from the parser
        show = getattr(exc, "show", None)
        if callable(show):
            show()
            if (hint := missing_separator(str(getattr(exc, "message", "")), args)) is not None:
                ui.err.print(f"[dim]hint:[/] {ui.printable(hint)}", soft_wrap=True)
            sys.exit(int(getattr(exc, "exit_code", EXIT_USAGE)))
        raise
    sys.exit(code if isinstance(code, int) else 0)
