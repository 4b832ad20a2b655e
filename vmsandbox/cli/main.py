"""The entry point: `vmsandbox …`. The only place a VmsandboxError becomes a red line, a hint and an exit code.
Every command module is imported here, which registers its commands on the shared app."""

from __future__ import annotations

import logging
import logging.handlers
import os
import re
import shlex
import signal
import sys
import threading
from typing import Annotated, NoReturn

import typer

from vmsandbox import __version__, paths, ui
from vmsandbox.cli import (  # noqa: F401
    attach,
    blueprints,
    completion,
    configs,
    ending,
    experiments,
    host,
    hosts,
    images,
    listing,
    login,
    review,
    run,
    secrets,
    serve,
    sessions,
    webui,
)
from vmsandbox.cli.base import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_RUN_FAILED,
    EXIT_USAGE,
    PASS_THE_CODE,
    TAKE_A_COMMAND,
    Invocation,
    app,
    command_word,
)
from vmsandbox.errors import UsageError, VmsandboxError


@app.callback(invoke_without_command=True)
def _root(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log every step and command to stderr.")] = False,
    version: Annotated[bool, typer.Option("--version", help="Print the version.")] = False,
) -> None:
    if version:
        print(__version__)
        raise typer.Exit(0)
    _setup_logging(verbose)


def _setup_logging(verbose: bool) -> None:
    """A verbose log file in the state directory always; stderr gets the log only with --verbose."""
    root = logging.getLogger()
    root.setLevel(logging.DEBUG)
    fmt = ui.EscapingFormatter("%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s")
    threading.excepthook = _thread_failed
    try:
        from vmsandbox.confine import accounts as confine

        confine.state_dirs()
        handler: logging.Handler = logging.handlers.RotatingFileHandler(
            paths.state_dir() / paths.SESSION_LOG, maxBytes=2 * 1024**2, backupCount=2
        )
        (paths.state_dir() / paths.SESSION_LOG).chmod(0o600)
        handler.setFormatter(fmt)
        root.addHandler(handler)
    except OSError:
        pass  # a read-only state dir must not stop `--help` or `doctor`
    if verbose:
        stream = logging.StreamHandler(sys.stderr)
        stream.setFormatter(ui.EscapingFormatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(stream)


def _thread_failed(args: threading.ExceptHookArgs) -> None:
    """A thread's uncaught exception goes to the log (escaped), not raw to stderr."""
    logging.getLogger("vmsandbox.thread").error(
        "thread %s failed", args.thread.name if args.thread else "?",
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),  # type: ignore[arg-type]
    )  # fmt: skip


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


def _terminate(signum: int, _frame: object) -> NoReturn:
    raise SystemExit(128 + signum)  # unwinds through every cleanup handler, like Ctrl-C


def main(argv: list[str] | None = None) -> NoReturn:
    args = list(sys.argv[1:] if argv is None else argv)
    Invocation.command = None
    word = command_word(args)
    Invocation.failed = EXIT_RUN_FAILED if word in PASS_THE_CODE else EXIT_FAILED
    if word in TAKE_A_COMMAND and "--" in args:
        cut = args.index("--")
        args, Invocation.command = args[:cut], args[cut + 1 :]
    os.umask(0o077)  # whatever vmsandbox writes is private unless it says otherwise (images do)
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)
    try:
        code = app(args=args, prog_name="vmsandbox", standalone_mode=False)
    except VmsandboxError as exc:  # plain text that may quote a guest (stderr of ssh, rsync, git): escaped
        ui.err.print(f"[red]error:[/] {ui.printable(exc.message)}", soft_wrap=True)
        if exc.hint:
            ui.err.print(f"[dim]hint:[/] {ui.printable(exc.hint)}", soft_wrap=True)
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
