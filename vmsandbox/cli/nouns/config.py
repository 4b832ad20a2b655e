"""`vmsandbox config show|validate|schema`: each effective setting with the source it came from (and what is
broken, said, not stopping it), a check of config and blueprint files (every problem of every file, each at its
line with its hint), and the JSON Schema editors use for them."""

from __future__ import annotations

import dataclasses
import enum
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from vmsandbox import ui
from vmsandbox.cli.base import EXIT_FAILED, AsJson, columns, config_app, print_json
from vmsandbox.errors import VmsandboxError

if TYPE_CHECKING:
    from vmsandbox.session.settings import Layer

ProjectArg = Annotated[
    Path, typer.Argument(help="The project directory (its .vmsandbox.yaml is read).", metavar="PROJECT")
]


def _shown(field: str, value: Any) -> str:
    if field.endswith("_mib"):
        return f"{value} MiB"
    if field == "secrets":
        return ", ".join(f"{m.secret} → {m.host} ({m.header})" for m in value) or "none"
    if field == "hosts":
        return ", ".join(f"{h.name} ({h.uri})" for h in value) or "none"
    if isinstance(value, tuple):
        return ", ".join(value) or "none"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value.value) if isinstance(value, enum.Enum) else str(value)


def explained(steps: list[Layer]) -> list[dict[str, str]]:
    """Each setting's effective value and the last source that set it."""
    from vmsandbox.session.settings import key_of

    rows = []
    for f in dataclasses.fields(steps[-1].settings):
        key = key_of(f.name)
        source = "default"
        for now, before in zip(steps[1:], steps[:-1], strict=True):
            if key in now.keys or getattr(now.settings, f.name) != getattr(before.settings, f.name):
                source = now.source
        rows.append({"key": key, "value": _shown(f.name, getattr(steps[-1].settings, f.name)), "from": source})
    return rows


def json_schema(*, blueprint: bool = False) -> dict[str, Any]:
    """The JSON Schema of a config file, or of a blueprint file (from their models, filemodels.py)."""
    from vmsandbox import filemodels, schema

    if blueprint:
        return schema.json_schema(filemodels.BlueprintFile, title="vmsandbox blueprint")
    return schema.json_schema(filemodels.ConfigFile, title="vmsandbox config")


@config_app.command("show")
def config_show(project: ProjectArg = Path(), as_json: AsJson = False) -> None:
    """Show each setting for PROJECT and where it comes from.

    Each effective setting for a session of PROJECT and where it comes from: the defaults, your
    ~/.config/vmsandbox/config.yaml, the project's .vmsandbox.yaml (as far as it is trusted), or an
    environment variable. An untrusted project file's values are listed after them, marked untrusted. A
    file with problems is said first, every problem at its line; what of it passes is shown.
    Example: `vmsandbox config show ~/src/app`"""
    from vmsandbox import trust
    from vmsandbox.session import configread
    from vmsandbox.session import settings as config

    broken: list[VmsandboxError] = []
    rows = explained(config.layers(project.resolve(), broken=broken))
    for exc in broken:
        if not isinstance(exc, trust.UntrustedError):
            _said(exc, "warning", "yellow")
        else:  # what it would set, shown as such; what a session gets without it
            ui.warn(
                f"{exc.message}; its values are shown marked untrusted, and a session refuses to start ({exc.hint})"
            )
            found = configread.read_project(project.resolve(), config.Settings())
            if found is not None:
                said = f"{found.path} (untrusted: not used)"
                rows += [{"key": k, "value": json.dumps(v), "from": said} for k, v in found.data.items()]
    if any(not isinstance(exc, trust.UntrustedError) for exc in broken):
        ui.warn(
            "what has a problem is left out of the settings shown, and a session refuses to start until it is fixed"
        )
    if as_json:
        print_json(rows)
    else:
        columns(["KEY", "VALUE", "FROM"], [[r["key"], r["value"], r["from"]] for r in rows])


@config_app.command("validate")
def config_validate(
    files: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Config or blueprint files (default: your config and blueprints, this directory's .vmsandbox.yaml "
            "and blueprints).",
            metavar="FILE",
        ),
    ] = None,
) -> None:
    """Check config and blueprint files.

    Check config and blueprint files: syntax, keys, types and values, every problem of every file at once, each
    with its line and hint. A file in a `blueprints` directory is checked as a blueprint, a `.vmsandbox.yaml` as a
    project's file. Without FILE: your config, your blueprints, and this directory's .vmsandbox.yaml and
    blueprints.
    Example: `vmsandbox config validate .vmsandbox.yaml`"""
    from vmsandbox import paths

    targets = files or default_files()
    if not targets:
        ui.info(f"No config file here or in {paths.config_dir()}: the defaults apply (`vmsandbox config show`).")
        return
    failed = [f for f in targets if not _valid(f)]
    if failed and len(targets) > 1:
        names = ", ".join(ui.printable(str(f)) for f in failed)
        ui.err.print(f"[red]{len(failed)} of {len(targets)} files have problems:[/] {names}", soft_wrap=True)
    if failed:
        raise typer.Exit(EXIT_FAILED)


def default_files() -> list[Path]:
    """What `config validate` checks without FILE: your config and blueprints, this directory's project file
    and blueprints (those that exist)."""
    from vmsandbox import paths
    from vmsandbox.image import blueprint
    from vmsandbox.session import settings as config

    found = [paths.config_dir() / config.USER_FILE, *sorted((paths.config_dir() / "blueprints").glob("*.yaml"))]
    found += [Path(config.PROJECT_FILE), *sorted(blueprint.PROJECT_DIR.glob("*.yaml"))]
    return [f for f in found if f.is_file()]


def _valid(f: Path) -> bool:
    """Check one file: `ok  FILE` on stdout, or every problem of it on stderr."""
    from vmsandbox.image import blueprint
    from vmsandbox.session import settings as config

    try:
        if f.parent.name == "blueprints":
            blueprint.check_file(f)
        else:
            config.read_file(f, config.Settings(), project=f.name == config.PROJECT_FILE)
    except VmsandboxError as exc:
        _said(exc, "error", "red")
        return False
    print(f"ok  {ui.printable(str(f), markup=False)}")
    return True


def _said(exc: VmsandboxError, label: str, colour: str) -> None:
    ui.err.print(f"[{colour}]{label}:[/] {ui.printable(exc.message)}", soft_wrap=True)
    if exc.hint:
        ui.err.print(f"[dim]hint:[/] {ui.printable(exc.hint)}", soft_wrap=True)


@config_app.command("schema")
def config_schema(
    for_blueprint: Annotated[bool, typer.Option("--blueprint", help="The schema of a blueprint file instead.")] = False,
) -> None:
    """Print the JSON Schema of config or blueprint files.

    Print the JSON Schema of config files (~/.config/vmsandbox/config.yaml, .vmsandbox.yaml) or, with
    --blueprint, of blueprint files, for an editor's YAML support. Example: `vmsandbox config schema >
    vmsandbox.schema.json`"""
    print(json.dumps(json_schema(blueprint=for_blueprint), indent=2))
