"""What `vmsandbox config trust` shows of a project: its `.vmsandbox.yaml` key by key (what each sets, and what
it is now without the file) and its blueprints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vmsandbox import trust
from vmsandbox.errors import VmsandboxError
from vmsandbox.session.settings import Settings, load, project_file, widening_keys


def describe_project_file(project: Path) -> trust.Candidate | None:
    """The project's `.vmsandbox.yaml` as `vmsandbox config trust` shows it: each key, what it sets, and what it
    is now without the file (from the defaults and the user's config)."""
    found = project_file(project)
    if found is None:
        return None
    without = load(None)
    widening = widening_keys(found.data)
    lines = []
    for name, value in found.data.items():
        sizing = name not in widening
        lines.append(
            f"{name}: {_shown(value)}" + ("   (sizes the VM: needs no trust)" if sizing else _now(without, name))
        )
        if name == "secrets":
            lines += [
                f"    your secret {m.get('secret')!s} goes to {m.get('host')!s} in header {m.get('header')!s}"
                for m in value
            ]
    return trust.Candidate(found.path, found.raw, lines)


def _shown(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _now(settings: Settings, name: str) -> str:
    current = {
        "network": settings.network.value,
        "allow": list(settings.allow),
        "allow_networks": list(settings.allow_networks),
        "trust_host_ca": settings.trust_host_ca,
        "sync_limit": f"{settings.sync_limit_mib}M",
    }.get(name)
    return f"   (now: {_shown(current)})" if current is not None else ""


def trust_candidates(path: Path) -> list[trust.Candidate]:
    """The project config files `vmsandbox config trust` looks at: at path, a project directory (its .vmsandbox.yaml
    and .vmsandbox/blueprints/*.yaml) or one of those files."""
    from vmsandbox.image import blueprint

    project = path.parent if path.is_file() else path
    if project.name == "blueprints" and project.parent.name == ".vmsandbox":
        project = project.parent.parent
    candidates = [c for c in [describe_project_file(project)] if c is not None]
    candidates += blueprint.describe_project_blueprints(project)
    if path.is_file():
        candidates = [c for c in candidates if c.path.resolve() == path.resolve()]
    if not candidates:
        raise VmsandboxError(
            f"no project config in {path}",
            hint="`vmsandbox config trust add` reads .vmsandbox.yaml and .vmsandbox/blueprints/",
        )
    return candidates
