"""`vmsandbox blueprint ls|show`: which blueprints there are (built in, yours, the project's) and what one
makes a session of, with everything it extends merged in."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from vmsandbox import ui
from vmsandbox.cli import complete
from vmsandbox.cli.base import AsJson, Quiet, blueprint_app, columns, print_json
from vmsandbox.errors import VmsandboxError


def _where(path: Path) -> str:
    from vmsandbox import paths
    from vmsandbox.image import blueprint

    if path.parent == blueprint.BUILTIN_DIR:
        return "built in"
    if path.parent == paths.config_dir() / "blueprints":
        return "yours"
    return "project"


@blueprint_app.command("ls")
def blueprint_ls(as_json: AsJson = False, quiet: Quiet = False) -> None:
    """List the blueprints a session can use.

    List the blueprints a session here can use (`-q`: names only). A project's own blueprints are used
    only once trusted (`vmsandbox trust`).

    Example: `vmsandbox blueprint ls`"""
    from vmsandbox.image import blueprint

    rows: list[dict[str, Any]] = []
    for name, path in sorted(blueprint.available(Path.cwd()).items()):
        try:
            description = blueprint.load(name, Path.cwd()).description
        except VmsandboxError as exc:
            description = f"(not usable: {exc.message})"
        rows.append({"name": name, "from": _where(path), "file": str(path), "description": description})
    if as_json:
        print_json(rows)
    elif quiet:
        for r in rows:
            print(r["name"])
    else:
        columns(["NAME", "FROM", "DESCRIPTION"], [[r["name"], r["from"], r["description"]] for r in rows])


@blueprint_app.command("show")
def blueprint_show(
    name: Annotated[
        str,
        typer.Argument(
            help="A blueprint name from `vmsandbox blueprint ls`.",
            metavar="BLUEPRINT",
            autocompletion=complete.blueprints,
        ),
    ],
    as_json: AsJson = False,
) -> None:
    """Show what a blueprint makes a session of.

    Show a blueprint as a session gets it: packages, agent command, allowed hosts, secret mappings, files
    copied in — with what it extends merged in. Example: `vmsandbox blueprint show claude`"""
    import yaml

    from vmsandbox.image import blueprint

    bp = blueprint.load(name, Path.cwd())
    data: dict[str, Any] = {
        "name": bp.name,
        "description": bp.description,
        "files": list(bp.chain) or [bp.source],
        "apt": list(bp.apt),
        "npm": list(bp.npm),
        "node": bp.node,
        "command": list(bp.command),
        "skip_permissions": list(bp.skip_permissions),
        "allow": list(bp.allow),
        "secrets": [dict(s) for s in bp.secrets],
        "copy": list(bp.copy),
        "credentials": list(bp.credentials),
        "env": dict(bp.env),
    }
    if as_json:
        print_json(data)
        return
    shown = {k: v for k, v in data.items() if v not in (None, [], {}, "")}
    print(ui.printable(yaml.safe_dump(shown, sort_keys=False, allow_unicode=True), markup=False), end="")
