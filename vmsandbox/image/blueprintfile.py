"""What a blueprint file may hold: its shape (filemodels.BlueprintFile) and its values, every problem at once,
each at its key or entry with its own hint. What it extends is looked up where it is loaded (blueprint.py)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from vmsandbox.document import Loc, Problem
from vmsandbox.filemodels import NODE_RANGE, BlueprintFile
from vmsandbox.image import values
from vmsandbox.schema import shape_problems

_APT_RE = re.compile(r"^[a-z0-9][a-z0-9+.-]+(=[A-Za-z0-9.+~:-]+)?\Z")
_NPM_RE = re.compile(r"^(@[a-z0-9][a-z0-9._-]*/)?[a-z0-9][a-z0-9._-]*(@[A-Za-z0-9.^~<>=*|-]+)?\Z")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")


def problems(data: dict[str, Any], source: str) -> list[Problem]:
    """Everything wrong with a blueprint's shape and values (`source` names its file). A value is checked
    only where its shape passed: a list entry of the wrong type is said once, as that."""
    found = shape_problems(data, BlueprintFile)
    bad = [p.at for p in found]
    for key in values.ENTRY_CHECKS:
        if key in data and (key,) not in bad:
            skip = {at[1] for at in bad if len(at) > 1 and at[0] == key and isinstance(at[1], int)}
            where = lambda i, key=key: f"{source}: `{key}[{i}]`"  # noqa: E731 - one line, bound to its key
            found += values.entries(key, data[key], source=source, where=where, skip=skip)[1]
    shaped = {k: v for k, v in data.items() if not any(at[:1] == (k,) for at in bad)}
    return [*found, *_refused(shaped)]


def _refused(data: dict[str, Any]) -> Iterator[Problem]:
    """A problem for each value of a blueprint (of the right shape) that is refused."""

    def no(at: Loc, said: str, hint: str | None = None) -> Problem:
        return Problem(f"`{at[0]}`: {said}", at, hint)

    for i, pkg in enumerate(data.get("apt", [])):
        if not _APT_RE.match(pkg):
            yield no(("apt", i), f"{pkg!r} is not a Debian package name", "e.g. ripgrep, or ripgrep=14.1.0-1")
    for i, pkg in enumerate(data.get("npm", [])):
        if not _NPM_RE.match(pkg):
            yield no(("npm", i), f"{pkg!r} is not an npm package spec", "e.g. typescript, or @scope/name@1.2")
    if "node" in data and not NODE_RANGE[0] <= data["node"] <= NODE_RANGE[1]:
        low, high = NODE_RANGE
        yield Problem("`node` must be a Node.js major version such as 24", ("node",), f"from {low} to {high}")
    for key in data.get("env", {}):
        if not _ENV_RE.match(key):
            yield no(("env", key), f"{key!r} is not an environment variable name", "letters, digits and _")
    yield from _refused_paths(data, no)


def _refused_paths(data: dict[str, Any], no: Callable[[Loc, str, str | None], Problem]) -> Iterator[Problem]:
    """A problem for each path of a blueprint outside the home directory."""
    for i, item in enumerate(data.get("copy", [])):
        if not item.startswith("~/") or ".." in Path(item).parts:
            yield no(("copy", i), f"{item!r} must be a path under the home directory (~/…)", "e.g. ~/.gitconfig")
    for i, item in enumerate(data.get("credentials", [])):
        if not item or item.startswith("/") or ".." in Path(item).parts:
            yield no(("credentials", i), f"{item!r} must be relative to the home directory", "e.g. .config/x.json")
    for i, item in enumerate(data.get("login", {}).get("files", [])):
        if not item or item.startswith("/") or ".." in Path(item).parts:
            at = ("login", "files", i)
            yield no(at, f"{item!r} must be relative to the home directory", "e.g. .config/x.json")
