"""The entry point: `vmsandbox …`. The only place an error becomes a red line, a hint and an exit code: ours
(VmsandboxError) and the parser's alike, one `error:` line and a `hint:`. Before the line is parsed `-v` is taken
wherever it is (alone, it is the version, as docker's) and the command after `--` is set aside. Every command module
is imported here, which registers its commands on the shared app."""

from __future__ import annotations

import errno
import os
import re
import shlex
import signal
import sys
from typing import Annotated, NoReturn

import typer
from typer._click import exceptions as parser  # typer's own click: the parser's errors

from vmsandbox import ui
from vmsandbox.cli import completion, mcp, meta, serve  # noqa: F401
from vmsandbox.cli.base import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_RUN_FAILED,
    EXIT_USAGE,
    GLOBAL_FLAGS,
    PASS_THE_CODE,
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


@app.callback(invoke_without_command=True)
def _root(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log every step and command to stderr.")] = False,
    version: Annotated[bool, typer.Option("--version", help="Print the version.")] = False,
) -> None:
    from vmsandbox import __version__
    from vmsandbox.core import commandlog

    if version:
        print(f"vmsandbox {__version__}")  # as `vmsandbox version` and `vmsandbox -v` say it
        raise typer.Exit(0)
    commandlog.open_log(verbose)


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


def parser_error(exc: parser.UsageError, args: list[str]) -> UsageError:
    """The parser's usage error in our words: its message one line (lower case, as ours), the hint what fixes it
    (a "did you mean", the `--` a command needs) or else the command's usage line."""
    message = exc.format_message().strip().rstrip(".")
    message, _, near = message.partition(" Did you mean ")
    message = message.strip().rstrip(".")
    message = message[:1].lower() + message[1:]
    message = re.sub(
        r"Input should be (less|greater) than or equal to ",
        lambda m: f"at {'most' if m.group(1) == 'less' else 'least'} ",
        message,
    )
    if near:
        return UsageError(message, hint=f"did you mean {near.rstrip('?')}?")
    if (hint := missing_separator(str(exc.message), args)) is not None:
        return UsageError(message, hint=hint)
    ctx = exc.ctx
    if ctx is None:
        return UsageError(message, hint="`vmsandbox -h` lists the commands")
    usage = " ".join([ctx.command_path, *ctx.command.collect_usage_pieces(ctx)])
    return UsageError(message, hint=f"usage: {usage} (`{ctx.command_path} -h` says more)")


# The options of `shell` and `exec` that take a value (a word after one is not NAME).
VALUED = frozenset({"-w", "--workdir", "-e", "--env"})


def global_flags(args: list[str]) -> list[str]:
    """`-v` wherever it is on the line, moved before the command (never after `--`, nor in the command that
    `shell NAME` or `exec NAME` without `--` runs)."""
    word = command_word(args)
    end = args.index("--") if "--" in args else len(args)
    if word == "shell" or (word == "exec" and end == len(args)):  # what follows NAME is the guest's
        i = args.index(word) + 1
        while i < end and args[i].startswith("-"):
            i += 2 if args[i] in VALUED else 1
        end = min(end, i + 1)
    found = [i for i in range(end) if args[i] in GLOBAL_FLAGS]
    return [*(args[i] for i in found[:1]), *(a for i, a in enumerate(args) if i not in found)]


def prepare(args: list[str]) -> list[str]:
    """The line as typer parses it: `-v` first (alone: `--version`), the command after `--` set aside."""
    if args == ["-v"]:  # docker's: the version (with a command, -v is --verbose)
        return ["--version"]
    if args and set(args) <= set(GLOBAL_FLAGS):  # `--verbose` and nothing to be verbose about: the help
        return ["--help"]
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
    except OSError as exc:  # a path given that no file system takes: bad input, said as such
        if exc.errno != errno.ENAMETOOLONG:
            raise
        name = str(exc.filename)
        shown = name if len(name) <= 80 else f"{name[:60]}... ({len(name)} characters)"
        said(UsageError(f"{str(exc.strerror).lower()}: {ui.printable(shown)}", hint="give a shorter path"))
        sys.exit(EXIT_USAGE)
    except KeyboardInterrupt:
        ui.err.print("[red]interrupted[/]")
        sys.exit(EXIT_INTERRUPTED)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        ui.err.print("[red]aborted[/]")
        sys.exit(EXIT_INTERRUPTED)
    except parser.UsageError as exc:  # the parser's: said as ours are
        said(parser_error(exc, args))
        sys.exit(EXIT_USAGE)
    except parser.ClickException as exc:
        said(VmsandboxError(exc.format_message()))
        sys.exit(exc.exit_code)
    sys.exit(code if isinstance(code, int) else 0)
