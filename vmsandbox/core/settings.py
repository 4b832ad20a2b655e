"""Settings and the files people write, for every front end: each effective setting with the source it came from
(what is broken said, never stopping it), config and blueprint files checked (every problem of every file, each
at its line), their JSON Schema, the project configs you trust and the defaults a session gets (the log every
command keeps is commandlog.py's)."""

from __future__ import annotations

import dataclasses
import enum
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmsandbox import filemodels, paths, schema, trust
from vmsandbox.errors import VmsandboxError
from vmsandbox.image import blueprint
from vmsandbox.session import configread, settingrows, settings
from vmsandbox.session.host.trust import trust_candidates

DEFAULTS = settings.Settings()  # what a session gets when no file and no flag says otherwise
UntrustedError = trust.UntrustedError


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


@dataclass(frozen=True)
class Explained:
    """Each effective setting for a project (`rows`: key, value, from) and what is broken in the files read
    (`broken`; an untrusted project file among them, its values added to the rows marked untrusted)."""

    rows: list[dict[str, str]]
    broken: list[VmsandboxError]


def explained(project: Path) -> Explained:
    """Each setting's effective value for a session of `project` and the last source that set it: the defaults,
    your config, the project's file (as far as it is trusted), an environment variable."""
    broken: list[VmsandboxError] = []
    steps = settings.layers(project.resolve(), broken=broken)
    rows = []
    for f in dataclasses.fields(steps[-1].settings):
        key = settingrows.key_of(f.name)
        source = "default"
        for now, before in zip(steps[1:], steps[:-1], strict=True):
            if key in now.keys or getattr(now.settings, f.name) != getattr(before.settings, f.name):
                source = now.source
        rows.append({"key": key, "value": _shown(f.name, getattr(steps[-1].settings, f.name)), "from": source})
    if any(isinstance(exc, trust.UntrustedError) for exc in broken):  # what it would set, shown as such
        found = configread.read_project(project.resolve(), settings.Settings())
        if found is not None:
            said = f"{found.path} (untrusted: not used)"
            rows += [{"key": k, "value": json.dumps(v), "from": said} for k, v in found.data.items()]
    return Explained(rows, broken)


def default_files() -> list[Path]:
    """What `config validate` checks without FILE: your config and blueprints, this directory's project file and
    blueprints (those that exist)."""
    found = [paths.config_dir() / settings.USER_FILE, *sorted((paths.config_dir() / "blueprints").glob("*.yaml"))]
    found += [Path(settings.PROJECT_FILE), *sorted(blueprint.PROJECT_DIR.glob("*.yaml"))]
    return [f for f in found if f.is_file()]


def config_dir() -> Path:
    return paths.config_dir()


def check(f: Path) -> None:
    """One config or blueprint file checked: raises with every problem of it, each at its line. A file in a
    `blueprints` directory is a blueprint, a `.vmsandbox.yaml` a project's file."""
    if f.parent.name == "blueprints":
        blueprint.check_file(f)
    else:
        settings.read_file(f, settings.Settings(), project=f.name == settings.PROJECT_FILE)


def json_schema(*, of_blueprint: bool = False) -> dict[str, Any]:
    """The JSON Schema of a config file, or of a blueprint file (from their models: settingrows.py, filemodels.py)."""
    if of_blueprint:
        return schema.json_schema(filemodels.BlueprintFile, title="vmsandbox blueprint")
    return schema.json_schema(settingrows.ConfigFile, title="vmsandbox config")


@dataclass(frozen=True)
class Trusted:
    """A project config file as `config trust` shows it: its path, whether it is trusted (or changed since), a short
    hash of its content, and what it changes, line by line."""

    path: Path
    trusted: bool
    changed: bool
    digest: str
    lines: tuple[str, ...]
    raw: bytes


def candidates(path: Path) -> list[Trusted]:
    """The project config files at `path` (a project directory, its .vmsandbox.yaml or a blueprint file in it)."""
    return [
        Trusted(c.path, c.state.trusted, c.state.changed, trust.digest(c.raw)[:12], tuple(c.lines), c.raw)
        for c in trust_candidates(path)
    ]


def trust_file(found: Trusted) -> None:
    """A file trusted with exactly the content that was shown (`found.raw`)."""
    trust.trust(found.path, found.raw)


def revoke(path: Path) -> list[Path]:
    """The project config files at `path` (a project directory: its .vmsandbox.yaml and blueprints; or one file;
    either there or gone) no longer trusted; the ones that were."""
    found = [] if path.is_dir() else [Path(trust.key(path.absolute()))]
    if path.is_dir() or not path.exists():  # a project directory (there, or gone with its files)
        root = path.resolve() if path.is_dir() else path.absolute()
        mine = [Path(n) for n in trust.records()]
        found += [p for p in mine if p == root / settings.PROJECT_FILE or p.parent == root / blueprint.PROJECT_DIR]
    return [p for p in found if trust.revoke(p)]


def trusted() -> Iterator[tuple[str, str, str]]:
    """Every file you trusted: (its state now — trusted, changed or missing —, when it was trusted, its path)."""
    for name, entry in sorted(trust.records().items()):
        path = Path(name)
        try:
            raw = trust.read_project_file(path)
        except VmsandboxError:
            raw = None
        state = "missing" if raw is None else "trusted" if trust.state(path, raw).trusted else "changed"
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(entry.get("trusted_at", 0))))
        yield state, when, name


def sync_limit() -> int:
    """The sync budget in bytes (the user's config)."""
    return settings.sync_limit()
