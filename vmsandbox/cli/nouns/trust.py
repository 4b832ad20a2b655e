"""`vmsandbox config trust add|ls|rm`: the project configs you trust — a project's .vmsandbox.yaml and blueprints
that widen what a session may do are used only once their exact content is trusted (direnv's model). A noun under
`config` (earlier versions: `vmsandbox config trust`, aliases.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from vmsandbox import ui
from vmsandbox.cli import complete, output
from vmsandbox.cli.base import noun
from vmsandbox.cli.nouns.config import config
from vmsandbox.cli.output import AsJson, Column, Listing, Output, Quiet
from vmsandbox.errors import VmsandboxError

trust = noun(
    "trust",
    "Project configs you trust, by their exact content: add, ls, rm.\n\n"
    "A project's .vmsandbox.yaml and .vmsandbox/blueprints/*.yaml that widen what a session may do (network, "
    "allowlist, secrets, blueprints) are used only once you trusted their exact content; a changed file must be "
    "trusted again.\n\nExample: `vmsandbox config trust add ~/src/app`",
    under=config,
)
PathArg = Annotated[
    Path,
    typer.Argument(help="A project directory, its .vmsandbox.yaml or a blueprint file in it.", metavar="PATH"),
]


@trust.command("add")
def add(
    path: PathArg = Path(),
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Trust without asking (after showing).")] = False,
) -> None:
    """Trust a project's vmsandbox config, after showing what it changes.

    Each file is shown with what it sets against what a session gets without it; trust is kept outside every
    project, in your config directory.

    Example: `vmsandbox config trust add ~/src/app`"""
    from vmsandbox.core import settings

    found = settings.candidates(path)
    for c in found:
        label = "trusted" if c.trusted else "changed since you trusted it" if c.changed else "not trusted"
        ui.err.print(f"[bold]{ui.printable(str(c.path))}[/] ({label}, sha256 {c.digest})")
        for line in c.lines:
            ui.err.print(f"  {ui.printable(line)}")
    todo = [c for c in found if not c.trusted]
    if not todo:
        ui.info("Everything shown is trusted already.")
        return
    if not yes:
        if not ui.is_interactive():
            raise VmsandboxError("nothing trusted: no terminal to ask on", hint="rerun with --yes after reading it")
        answer = ui.err.input(f"Trust {len(todo)} file(s) with exactly this content? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            ui.info("Nothing trusted.")
            raise typer.Exit(1)
    for c in todo:
        settings.trust_file(c)
        ui.info(f"[green]Trusted[/] {ui.printable(str(c.path))}")


TRUSTED = Listing(
    fields=("path", "state", "trusted_at"),
    columns=(Column("path"), Column("state"), Column("trusted_at")),
    example="{{.State}} {{.Path}}",
    key="path",
)


@trust.command("ls")
def ls(
    as_json: AsJson = False,
    quiet: Quiet = False,
    fmt: Annotated[str | None, output.format_option(TRUSTED.example)] = None,
    wide: Output = None,
) -> None:
    """List every file you trusted and whether it changed since.

    Examples: `vmsandbox config trust ls` · `vmsandbox config trust ls --format '{{.Path}} {{.TrustedAt}}'`"""
    from vmsandbox.core import settings

    shape = TRUSTED.shape(as_json=as_json, quiet=quiet, fmt=fmt, output=wide)
    rows = [{"path": path, "state": state, "trusted_at": when} for state, when, path in settings.trusted()]
    empty = "You trust no project config yet: `vmsandbox config trust add PATH` shows one, then trusts it."
    TRUSTED.show(rows, shape, empty=empty)


@trust.command("rm")
def rm(
    path: Annotated[
        Path,
        typer.Argument(help="A trusted project, or one of its files.", metavar="PATH", autocompletion=complete.trusted),
    ] = Path(),
) -> None:
    """Stop trusting a project's vmsandbox config.

    Its files are used again only once trusted anew.

    Example: `vmsandbox config trust rm ~/src/app`"""
    from vmsandbox.core import settings

    gone = settings.revoke(path)
    for p in gone:
        ui.info(f"No longer trusted: {ui.printable(str(p))}")
    if not gone:
        ui.info(f"Nothing at {ui.printable(str(path))} was trusted.")
