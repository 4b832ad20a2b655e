"""`vmsandbox config show|validate|schema|trust`: each effective setting with the source it came from (what is
broken said, not stopping it), a check of config and blueprint files (every problem of every file, each at its line
with its hint), and the JSON Schema editors use for them. `config trust add|ls|rm` (the project configs you trust)
is a noun of its own: trust.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from vmsandbox import ui
from vmsandbox.cli import output
from vmsandbox.cli.base import EXIT_FAILED, noun, said
from vmsandbox.cli.output import AsJson, Column, Listing, Output
from vmsandbox.errors import VmsandboxError

config = noun(
    "config",
    "Settings and their sources: show, validate, schema, trust.\n\n"
    "Your ~/.config/vmsandbox/config.yaml and a project's .vmsandbox.yaml, their blueprints, their JSON Schema, and "
    "the project configs you trust (`config trust add|ls|rm`).\n\n"
    "Examples: `vmsandbox config show ~/src/app` · `vmsandbox config trust add ~/src/app`",
)
SETTINGS = Listing(
    fields=("key", "value", "from"),
    columns=(Column("key"), Column("value"), Column("from")),
    example="{{.Key}}={{.Value}}",
    key="key",
)
ProjectArg = Annotated[
    Path, typer.Argument(help="The project directory (its .vmsandbox.yaml is read).", metavar="PROJECT")
]


@config.command("show")
def show(
    project: ProjectArg = Path(),
    as_json: AsJson = False,
    fmt: Annotated[str | None, output.format_option(SETTINGS.example)] = None,
    wide: Output = None,
) -> None:
    """Show each setting for PROJECT and where it comes from.

    The defaults, your ~/.config/vmsandbox/config.yaml, the project's .vmsandbox.yaml (as far as it is trusted),
    or an environment variable. An untrusted project file's values come after them, marked untrusted. A file with
    problems is said first, every problem at its line; what of it passes is shown.

    Examples: `vmsandbox config show ~/src/app` · `vmsandbox config show --format '{{.Key}} {{.From}}'`"""
    from vmsandbox.core import settings

    shape = SETTINGS.shape(as_json=as_json, fmt=fmt, output=wide)
    found = settings.explained(project)
    for exc in found.broken:
        if not isinstance(exc, settings.UntrustedError):
            said(exc, "warning", "yellow")
        else:  # what it would set, shown as such; what a session gets without it
            ui.warn(
                f"{exc.message}; its values are shown marked untrusted, and a session refuses to start ({exc.hint})"
            )
    if any(not isinstance(exc, settings.UntrustedError) for exc in found.broken):
        ui.warn(
            "what has a problem is left out of the settings shown, and a session refuses to start until it is fixed"
        )
    SETTINGS.show(found.rows, shape, empty="")


@config.command("validate")
def validate(
    files: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Config or blueprint files \\[default: your config and blueprints, this directory's .vmsandbox.yaml "
            "and blueprints].",
            metavar="FILE...",
        ),
    ] = None,
) -> None:
    """Check config and blueprint files: every problem of every file at once.

    Syntax, keys, types and values, each problem with its line and hint. A file in a `blueprints` directory is
    checked as a blueprint, a `.vmsandbox.yaml` as a project's file.

    Example: `vmsandbox config validate .vmsandbox.yaml`"""
    from vmsandbox.core import settings

    targets = files or settings.default_files()
    if not targets:
        ui.info(f"No config file here or in {settings.config_dir()}: the defaults apply (`vmsandbox config show`).")
        return
    failed = [f for f in targets if not _valid(f)]
    if failed and len(targets) > 1:
        names = ", ".join(ui.printable(str(f)) for f in failed)
        ui.err.print(f"[red]{len(failed)} of {len(targets)} files have problems:[/] {names}", soft_wrap=True)
    if failed:
        raise typer.Exit(EXIT_FAILED)


def _valid(f: Path) -> bool:
    """Check one file: `ok  FILE` on stdout, or every problem of it on stderr."""
    from vmsandbox.core import settings

    try:
        settings.check(f)
    except VmsandboxError as exc:
        said(exc)
        return False
    print(f"ok  {ui.printable(str(f), markup=False)}")
    return True


@config.command("schema")
def schema(
    for_blueprint: Annotated[bool, typer.Option("--blueprint", help="The schema of a blueprint file instead.")] = False,
) -> None:
    """Print the JSON Schema of config or blueprint files, for an editor's YAML.

    Config files: ~/.config/vmsandbox/config.yaml and a project's .vmsandbox.yaml; with --blueprint, blueprint
    files.

    Example: `vmsandbox config schema > vmsandbox.schema.json`"""
    from vmsandbox.core import settings

    print(json.dumps(settings.json_schema(of_blueprint=for_blueprint), indent=2))
