"""What every command module of the CLI shares: the typer apps, the exit codes, shared parameters, the command
after `--`, and small printing helpers."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer

from vmsandbox import ui
from vmsandbox.errors import VmsandboxError

EXIT_ERROR = 125  # vmsandbox itself failed (as `docker run` does), so a command's own codes stay distinct
EXIT_INTERRUPTED = 130
EXIT_PENDING = 3  # pull/recover/push: changes remain unsynced

app = typer.Typer(
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=False,
    help="Run AI coding agents in disposable VMs and review what they changed.",
)
image_app = typer.Typer(no_args_is_help=True, help="Build, list and remove base images.")
host_app = typer.Typer(no_args_is_help=True, help="Host set-up where no service manager does it.")
secret_app = typer.Typer(no_args_is_help=True, help="Secrets kept on the host and injected by the egress proxy.")
app.add_typer(image_app, name="image")
app.add_typer(host_app, name="host")
app.add_typer(secret_app, name="secret")

# Parameters several commands share.
SessionName = Annotated[str, typer.Argument(help="Session name.")]
ApplySafe = Annotated[bool, typer.Option("--yes", "-y", help="Apply the safe, non-conflicting changes.")]
IncludeRisky = Annotated[bool, typer.Option("--include-risky", help="Apply quarantined changes too.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON.")]


class Invocation:
    """Everything after the first `--` on the command line: the command to run in the guest.

    It is split off before typer parses the rest, so `vmsandbox run -- ls /` never takes `ls` as PATH.
    """

    command: list[str] | None = None


def tail(*, required: bool) -> list[str] | None:
    if required and not Invocation.command:
        raise VmsandboxError("no command given", hint="put the command after `--`, e.g. `-- make test`")
    return Invocation.command or None


def sync_limit() -> int:
    """The sync budget in bytes, from the user's settings (never from a project file: the project may be
    what the guest just changed)."""
    from vmsandbox.session import config

    return config.load().sync_limit_mib * 1024**2


def print_json(data: Any) -> None:
    ui.out.print_json(json.dumps(data), indent=2) if sys.stdout.isatty() else print(json.dumps(data, indent=2))


def age(seconds: float) -> str:
    s = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"
