"""Blueprints: what an agent's sandbox holds and may do, as YAML data.

Built-in blueprints ship in the package (vmsandbox/blueprints/*.yaml). A user's live in
~/.config/vmsandbox/blueprints/, a project's in <project>/.vmsandbox/blueprints/; the first found wins, in
the order project, user, built-in. `extends: NAME` starts from another blueprint (a blueprint extending its
own name takes the next one down, so a user's `claude.yaml` can extend the built-in `claude`): lists add to
it, `env` merges, single values replace.

Only `apt`, `npm` and `node` go into the image layer (and its version); the rest applies per session.
A project's blueprints are used only once the user trusted their exact content (trust.py).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vmsandbox import document, paths, trust
from vmsandbox.document import Problem, did_you_mean
from vmsandbox.errors import UsageError, VmsandboxError
from vmsandbox.filemodels import BlueprintFile, keys
from vmsandbox.image import blueprintfile

BUILTIN_DIR = Path(__file__).parent / "blueprints"
PROJECT_DIR = Path(".vmsandbox") / "blueprints"
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,30}\Z")
NAME_HINT = "lower-case letters, digits, - and _ (at most 31)"
MAX_DEPTH = 8

FIELDS = keys(BlueprintFile)  # the keys a blueprint takes (filemodels.BlueprintFile says what each means)
IMAGE_FIELDS = ("apt", "npm", "node")


@dataclass(frozen=True)
class Blueprint:
    name: str
    source: str  # the file it came from (and what it extends), for messages
    description: str = ""
    apt: tuple[str, ...] = ()
    npm: tuple[str, ...] = ()
    node: int | None = None
    command: tuple[str, ...] = ()
    skip_permissions: tuple[str, ...] = ()
    allow: tuple[str, ...] = ()
    secrets: tuple[dict[str, Any], ...] = ()
    copy: tuple[str, ...] = ()
    credentials: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    login_files: tuple[str, ...] = ()  # home-relative files the agent's sign-in writes (session.logins keeps them)
    login_command: tuple[str, ...] = ()  # what signs in (default: `command`)
    chain: tuple[str, ...] = ()  # the files this one is built from, base first

    @property
    def needs_layer(self) -> bool:
        return bool(self.apt or self.npm)

    def layer_recipe(self) -> dict[str, Any]:
        """What the image layer is built from; its hash is the layer's version (with the base's)."""
        return {"apt": sorted(self.apt), "npm": sorted(self.npm), "node": self.node if self.npm else None}

    def layer_hash(self, base_version: str, builder_revision: str) -> str:
        data = json.dumps([base_version, builder_revision, self.layer_recipe()], sort_keys=True)
        return hashlib.sha256(data.encode()).hexdigest()[:12]

    def settings_data(self) -> dict[str, Any]:
        """The blueprint's session defaults, as a config layer (allowlist and secret mappings)."""
        data: dict[str, Any] = {}
        if self.allow:
            data["allow"] = list(self.allow)
        if self.secrets:
            data["secrets"] = [dict(s) for s in self.secrets]
        return data

    def agent_argv(self, args: list[str]) -> list[str]:
        if not self.command:
            raise VmsandboxError(
                f"blueprint {self.name} declares no agent command", hint=f"add `command:` to {self.source}"
            )
        return [*self.command, *self.skip_permissions, *args]


def search_dirs(project: Path | None) -> list[Path]:
    dirs = []
    if project is not None:
        dirs.append(project / PROJECT_DIR)
    dirs += [paths.config_dir() / "blueprints", BUILTIN_DIR]
    return dirs


def available(project: Path | None = None) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for d in search_dirs(project):
        if project is not None and d == project / PROJECT_DIR:  # (listed as its files are read: trust.names_in)
            files = [d / name for name in trust.names_in(d, project) if name.endswith(".yaml")]
        else:
            files = sorted(d.glob("*.yaml")) if d.is_dir() else []
        for f in files:
            found.setdefault(f.stem, f)
    return found


def _find(name: str, project: Path | None, *, below: Path | None = None) -> Path:
    """The file defining `name`; with `below`, only files in directories after below's (for self-extends)."""
    dirs = search_dirs(project)
    if below is not None:
        dirs = dirs[[d.resolve() for d in dirs].index(below.parent.resolve()) + 1 :]
    for d in dirs:
        f = d / f"{name}.yaml"
        if f.is_file():
            return f
    known = sorted(available(project))
    mine = paths.config_dir() / "blueprints"
    raise VmsandboxError(
        f"no blueprint named {name!r}{did_you_mean(name, known)}",
        hint=f"known blueprints: {', '.join(known) or 'none'}; user blueprints go in {mine}",
    )


def named(name: str, project: Path | None = None) -> Blueprint:
    """The blueprint a person named (on a command line, in a request): a name that is no blueprint is theirs
    to correct (UsageError, with the names there are); a blueprint whose file has a problem is not."""
    if NAME_RE.match(name) is None or name not in available(project):
        try:
            _find(name, project) if NAME_RE.match(name) else load(name, project)
        except VmsandboxError as exc:
            raise UsageError(exc.message, hint=exc.hint) from None
    return load(name, project)


def load(name: str, project: Path | None = None) -> Blueprint:
    if not NAME_RE.match(name):
        raise VmsandboxError(f"invalid blueprint name {name!r}", hint=f"use {NAME_HINT}")
    return _load_file(name, _find(name, project), project, depth=0)


def _load_file(name: str, path: Path, project: Path | None, *, depth: int) -> Blueprint:
    if depth > MAX_DEPTH:
        raise VmsandboxError(f"{path}: `extends` goes more than {MAX_DEPTH} levels deep (a cycle?)")
    source = str(path)
    data = _read(path, project)
    parent_name = data.get("extends")
    if parent_name is not None:
        parent_file = _find(parent_name, project, below=path if parent_name == name else None)
        parent = _load_file(parent_name, parent_file, project, depth=depth + 1)
    else:
        parent = Blueprint(name=name, source=source)
    return _merge(parent, data, name, source)


def is_project_file(path: Path, project: Path | None) -> bool:
    return project is not None and path.parent.resolve() == (project / PROJECT_DIR).resolve()


def _read(path: Path, project: Path | None) -> dict[str, Any]:
    """A blueprint file's checked content. A project's blueprint is code from the project (apt and npm
    packages installed as root, hosts allowed, host files copied in, secrets mapped): it is used only after
    the user trusted its exact content (`vmsandbox config trust`)."""
    if project is None or not is_project_file(path, project):
        return _checked(path, document.read_bytes(path), project)
    raw = trust.read_project_file(path, project)
    if raw is None:
        raise VmsandboxError(f"{path} disappeared while it was read")
    data = _checked(path, raw, project)  # a bad file says what is wrong before anything asks for trust
    trust.require(path, raw, sorted(k for k in data if k != "description"), project=project)
    return data


def _checked(path: Path, raw: bytes, project: Path | None) -> dict[str, Any]:
    """A blueprint file's content; FileError with every problem of it, each at its line: its syntax, keys
    given twice, its shape, its values, and what it extends (looked up as a session would, from `project`)."""
    doc = document.read(raw, str(path))
    if doc.data is None:
        doc.fail()
        return {}
    found = blueprintfile.problems(doc.data, str(path))
    parent = doc.data.get("extends")
    if isinstance(parent, str):
        found += _extends_problems(path, parent, project)
    doc.fail(found)
    return doc.data


def check_file(path: Path) -> None:
    """Check a blueprint file (`vmsandbox config validate`): its syntax, keys, types and values, and that what
    it extends exists where a session would look for it; FileError with every problem, each at its line."""
    inside = path.resolve().parent
    project = inside.parent.parent if inside.parts[-2:] == PROJECT_DIR.parts else None
    _checked(path, document.read_bytes(path), project)


def _extends_problems(path: Path, parent: str, project: Path | None) -> list[Problem]:
    """What is wrong with `extends: parent` in `path` (a blueprint extending its own name takes the next one
    down the search order, when it is in one of its directories)."""
    if not NAME_RE.match(parent):
        return [Problem(f"`extends`: invalid blueprint name {parent!r}", ("extends",), hint=f"use {NAME_HINT}")]
    searched = [d.resolve() for d in search_dirs(project)]
    below = path if parent == path.stem and path.resolve().parent in searched else None
    try:
        _find(parent, project, below=below)
    except VmsandboxError as exc:
        return [Problem(f"`extends`: {exc.message}", ("extends",), hint=exc.hint)]
    return []


def _merge(parent: Blueprint, data: dict[str, Any], name: str, source: str) -> Blueprint:
    def added(key: str) -> tuple[str, ...]:
        return tuple(dict.fromkeys([*getattr(parent, key), *data.get(key, [])]))

    return Blueprint(
        name=name,
        source=source,
        description=data.get("description", parent.description),
        apt=added("apt"),
        npm=added("npm"),
        node=data.get("node", parent.node),
        command=tuple(data.get("command", parent.command)),
        skip_permissions=tuple(data.get("skip_permissions", parent.skip_permissions)),
        allow=added("allow"),
        secrets=(*parent.secrets, *data.get("secrets", [])),
        copy=added("copy"),
        credentials=added("credentials"),
        env={**parent.env, **data.get("env", {})},
        login_files=tuple(data["login"]["files"]) if "login" in data else parent.login_files,
        login_command=tuple(data["login"].get("command", ())) if "login" in data else parent.login_command,
        chain=(*parent.chain, source),
    )


def shipped_credentials() -> tuple[str, ...]:
    """Every credential file the shipped blueprints name (what `vmsandbox secret wipe` always wipes)."""
    found: dict[str, None] = {}
    for f in sorted(BUILTIN_DIR.glob("*.yaml")):
        found.update(dict.fromkeys(load(f.stem).credentials))
    return tuple(found)


def describe_project_blueprints(project: Path) -> list[trust.Candidate]:
    """The project's blueprint files as `vmsandbox config trust` shows them: every key (they all reach beyond the
    VM's size: packages installed as root, hosts, secrets, host files copied in, the agent's command)."""
    found: list[trust.Candidate] = []
    directory = project / PROJECT_DIR
    if not directory.is_dir():
        return found
    for path in sorted(directory.glob("*.yaml")):
        raw = trust.read_project_file(path, project)
        if raw is None:
            continue
        data = _checked(path, raw, project)
        shadows = path.stem in {f.stem for f in BUILTIN_DIR.glob("*.yaml")}
        lines = [f"replaces the shipped blueprint `{path.stem}`"] if shadows else []
        lines += [f"{k}: {json.dumps(v, ensure_ascii=False)}" for k, v in data.items()]
        if data.get("copy"):
            lines.append("    copies those files of your home into every session of it")
        found.append(trust.Candidate(path, raw, lines))
    return found
