"""`vmsandbox blueprint ls|show`: which blueprints there are (built in, yours, the project's) and what one makes a
session of, with everything it extends merged in."""

from __future__ import annotations

from typing import Annotated

import typer

from vmsandbox import ui
from vmsandbox.cli import complete, output
from vmsandbox.cli.base import noun
from vmsandbox.cli.output import AsJson, Column, Format, Quiet

blueprint = noun(
    "blueprint",
    "What a session is made of: ls, show.\n\n"
    "A blueprint names packages, the agent's command, allowed hosts, secrets and files copied in.\n\n"
    "Example: `vmsandbox blueprint show claude`",
)


@blueprint.command("ls")
def ls(as_json: AsJson = False, quiet: Quiet = False, fmt: Format = None) -> None:
    """List the blueprints a session here can use.

    Built in, yours (~/.config/vmsandbox/blueprints/) and this project's (.vmsandbox/blueprints/, used only once
    trusted: `vmsandbox trust add`).

    Example: `vmsandbox blueprint ls`"""
    from vmsandbox.core import images

    output.formats(fmt)
    table = (
        Column("NAME", lambda r: r["name"]),
        Column("FROM", lambda r: r["from"]),
        Column("DESCRIPTION", lambda r: r["description"]),
    )
    output.listing(images.blueprints(), table, as_json=as_json, quiet=quiet, fmt=fmt, empty="",
                   fields=("name", "from", "file", "description"))  # fmt: skip


@blueprint.command("show")
def show(
    name: Annotated[
        str,
        typer.Argument(
            help="A blueprint (`vmsandbox blueprint ls`).", metavar="BLUEPRINT", autocompletion=complete.blueprints
        ),
    ],
    as_json: AsJson = False,
) -> None:
    """Show what a blueprint makes a session of.

    Its packages, agent command, allowed hosts, secret mappings and files copied in, with what it extends merged.

    Example: `vmsandbox blueprint show claude`"""
    import yaml

    from vmsandbox.core import images

    data = images.blueprint_shown(name)
    if as_json:
        output.print_json(data)
        return
    shown = {k: v for k, v in data.items() if v not in (None, [], {}, "")}
    print(ui.printable(yaml.safe_dump(shown, sort_keys=False, allow_unicode=True), markup=False), end="")
