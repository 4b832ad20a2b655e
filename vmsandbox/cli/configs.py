"""`vmsandbox config show|validate|schema`: each effective setting with the source it came from, a check of a
config or blueprint file (file, line and key in every error), and the JSON Schema editors use for them."""

from __future__ import annotations

import dataclasses
import enum
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from vmsandbox import ui
from vmsandbox.cli.base import AsJson, columns, config_app, print_json

if TYPE_CHECKING:
    from vmsandbox.session.settings import Layer

ProjectArg = Annotated[
    Path, typer.Argument(help="The project directory (its .vmsandbox.yaml is read).", metavar="PROJECT")
]
# The settings' fields as the keys that set them in a file, and how their values read.
KEYS = {"memory_mib": "memory", "disk_mib": "disk", "sync_limit_mib": "sync_limit"}


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
    rows = []
    for f in dataclasses.fields(steps[-1].settings):
        key = KEYS.get(f.name, f.name)
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
    environment variable. An untrusted project file's values are listed after them, marked untrusted.
    Example: `vmsandbox config show ~/src/app`"""
    from vmsandbox import trust
    from vmsandbox.session import settings as config

    try:
        rows = explained(config.layers(project.resolve()))
    except trust.UntrustedError as exc:  # what it would set, shown as such; what a session gets without it
        ui.warn(f"{exc.message}; its values are shown marked untrusted, and a session refuses to start ({exc.hint})")
        rows = explained(config.layers(None))
        found = config.project_file(project.resolve())
        if found is not None:
            said = f"{found.path} (untrusted: not used)"
            rows += [{"key": k, "value": json.dumps(v), "from": said} for k, v in found.data.items()]
    if as_json:
        print_json(rows)
    else:
        columns(["KEY", "VALUE", "FROM"], [[r["key"], r["value"], r["from"]] for r in rows])


@config_app.command("validate")
def config_validate(
    files: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Config or blueprint files (default: your config and this directory's .vmsandbox.yaml).",
            metavar="FILE",
        ),
    ] = None,
) -> None:
    """Check config and blueprint files.

    Check config and blueprint files: syntax, keys, types and ranges, each error with file, line and key.
    A file in a `blueprints` directory is checked as a blueprint.
    Example: `vmsandbox config validate .vmsandbox.yaml`"""
    from vmsandbox import paths
    from vmsandbox.image import blueprint
    from vmsandbox.session import settings as config

    if not files:
        files = [f for f in (paths.config_dir() / config.USER_FILE, Path(config.PROJECT_FILE)) if f.is_file()]
        if not files:
            ui.info(f"No config file here or in {paths.config_dir()}: the defaults apply (`vmsandbox config show`).")
            return
    for f in files:
        if f.parent.name == "blueprints":
            blueprint.check_file(f)
        else:
            config.read_file(f, config.Settings())
        print(f"ok  {ui.printable(str(f), markup=False)}")


@config_app.command("schema")
def config_schema(
    for_blueprint: Annotated[bool, typer.Option("--blueprint", help="The schema of a blueprint file instead.")] = False,
) -> None:
    """Print the JSON Schema of config or blueprint files.

    Print the JSON Schema of config files (~/.config/vmsandbox/config.yaml, .vmsandbox.yaml) or, with
    --blueprint, of blueprint files, for an editor's YAML support. Example: `vmsandbox config schema >
    vmsandbox.schema.json`"""
    print(json.dumps(json_schema(blueprint=for_blueprint), indent=2))
