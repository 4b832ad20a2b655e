"""What every command module of the CLI shares: the typer apps, the exit codes, shared parameters, the command
after `--`, and small printing helpers."""

from __future__ import annotations

import difflib
import json
import sys
from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup

from vmsandbox import ui
from vmsandbox.errors import VmsandboxError

EXIT_ERROR = 125  # vmsandbox itself failed (as `docker run` does), so a command's own codes stay distinct
EXIT_INTERRUPTED = 130
EXIT_PENDING = 3  # pull/recover/push: changes remain unsynced

HELP = {"help_option_names": ["-h", "--help"]}  # inherited by every command and group below
TYPO = 0.8  # how alike an unknown word must be to a command to be offered as "did you mean"
TYPO_LENGTH = 4  # and how long: shorter words are other words more often than typos


class Commands(TyperGroup):
    """A group that offers "did you mean" for a near typo only (`destory`), never a different command for
    another word (`ps` is not `push`, which changes the guest)."""

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        try:
            return super().resolve_command(ctx, args)
        except Exception as exc:
            message = getattr(exc, "message", None)
            if isinstance(message, str) and message.startswith("No such command") and args:
                near = difflib.get_close_matches(args[0], list(self.commands), n=1, cutoff=TYPO)
                near = near if len(args[0]) >= TYPO_LENGTH else []  # `top` is no typo of `stop`
                hint = f"Did you mean {near[0]!r}?" if near else "`vmsandbox -h` lists the commands."
                exc.message = f"{message.rstrip('.')}. {hint}"  # type: ignore[attr-defined]
            raise


ALIASES = "Aliases"  # the help panel of the short names other tools taught people (rm, ps, ssh, …)

app = typer.Typer(
    cls=Commands,
    suggest_commands=False,
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    context_settings=HELP,
    help="Run AI coding agents in disposable VMs and review what they changed.\n\n"
    "Examples: `vmsandbox claude .` · `vmsandbox run . -- make test` · `vmsandbox run --keep .` then "
    "`vmsandbox shell NAME`, `vmsandbox pull NAME`, `vmsandbox destroy NAME`.",
)


def _group(name: str, text: str) -> typer.Typer:
    """A command group under `vmsandbox NAME`, with the settings every group shares (help, typos)."""
    group = typer.Typer(cls=Commands, suggest_commands=False, no_args_is_help=True, context_settings=HELP, help=text)
    app.add_typer(group, name=name)
    return group


blueprint_app = _group(
    "blueprint", "List blueprints and show what one makes a session of (`vmsandbox blueprint show claude`)."
)
config_app = _group(
    "config", "Show where each setting comes from, check config and blueprint files, print their JSON Schema."
)
image_app = _group("image", "Build, list and remove base images.")
host_app = _group("host", "Host set-up where no service manager does it.")
secret_app = _group("secret", "Secrets kept on the host and injected by the egress proxy.")


class TakesCommand(TyperCommand):
    """A command that takes a command line after `--`: its usage line says so."""

    tail = "[-- COMMAND...]"

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [*super().collect_usage_pieces(ctx), self.tail]


class NeedsCommand(TakesCommand):
    tail = "-- COMMAND..."


# Parameters several commands share.
SessionName = Annotated[str, typer.Argument(help="Session name.")]
ApplySafe = Annotated[bool, typer.Option("--yes", "-y", help="Apply the safe, non-conflicting changes.")]
IncludeRisky = Annotated[bool, typer.Option("--include-risky", help="Apply quarantined changes too.")]
IncludeIgnored = Annotated[
    bool, typer.Option("--include-ignored", help="Apply changes to paths the project ignores (.gitignore) too.")
]
IncludeBinary = Annotated[bool, typer.Option("--include-binary", help="Apply binary files too (never by --yes alone).")]
IncludeMass = Annotated[
    bool, typer.Option("--include-mass", help="With --yes, apply a mass change too (mass_change_files/_size).")
]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="Print names only, one per line.")]


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

    return config.sync_limit()


def print_json(data: Any) -> None:
    ui.out.print_json(json.dumps(data), indent=2) if sys.stdout.isatty() else print(json.dumps(data, indent=2))


def columns(headers: list[str], rows: list[list[str]]) -> None:
    """A listing on stdout: plain columns aligned to their widest cell, nothing ever cut short (names,
    versions and paths are meant to be copied), the last column unpadded. Cells are shown escaped."""
    cells = [headers, *[[ui.printable(c, markup=False) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers) - 1)]
    for row in cells:
        print("  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[-1]]))


def age(seconds: float) -> str:
    s = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"
