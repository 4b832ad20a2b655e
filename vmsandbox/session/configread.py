"""Reading a config file (yours, or a project's `.vmsandbox.yaml`) without stopping at its first problem: the
settings with every key of it that passes, and everything wrong with it, each problem at its line with its hint
— what `config show`, `ls` and `doctor` show of a broken file, and what `run` refuses whole."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, Self, TypeVar

from vmsandbox import document, paths, trust
from vmsandbox.document import FileError, Problem
from vmsandbox.session.settingrows import MACHINE_KEYS

PROJECT_FILE = ".vmsandbox.yaml"
USER_FILE = "config.yaml"


class Layered(Protocol):
    """Settings a file is laid over (session.settings.Settings)."""

    def merging(self, data: dict[str, Any], source: str) -> tuple[Self, list[Problem]]: ...


S = TypeVar("S", bound=Layered)


@dataclass(frozen=True)
class ConfigRead(Generic[S]):
    """A config file read over some settings: the settings with every key of it that passes, those keys as
    written, and everything wrong with it (None if nothing is)."""

    settings: S
    data: dict[str, Any]
    problems: FileError | None


def read_config(raw: bytes, source: str, over: S, *, project: bool = False) -> ConfigRead[S]:
    """A config file's bytes laid over the settings `over`, as far as they pass: every problem (syntax, a key
    given twice, shape, values; for a project's file, a key only your own config may set) at its line. A key
    with a problem is left out whole (a list's good entries too: half a list is not what was written)."""
    doc = document.read(raw, source)
    if doc.data is None:
        return ConfigRead(over, {}, FileError(source, doc.problems))
    data = doc.data
    refused: list[Problem] = []
    if project:
        refused = [_machine_key(k) for k in MACHINE_KEYS if k in data]
        data = {k: v for k, v in data.items() if k not in MACHINE_KEYS}
    merged, problems = over.merging(data, source)
    found = [*doc.problems, *doc.placed([*refused, *problems])]
    bad = {str(p.at[0]) for p in found if p.at}
    if bad:
        data = {k: v for k, v in data.items() if str(k) not in bad}
        merged, _ = over.merging(data, source)
    return ConfigRead(merged, data, FileError(source, found) if found else None)


def _machine_key(key: str) -> Problem:
    mine = paths.config_dir() / USER_FILE
    hint = (
        f"set it in {mine}" + (" or VMSANDBOX_LIBVIRT_URI" if key == "libvirt_uri" else "") + ", then remove it there"
    )
    return Problem(f"`{key}` is never taken from a project file", (key,), hint=hint)


@dataclass(frozen=True)
class ProjectFile:
    path: Path
    raw: bytes  # the bytes trust is about
    data: dict[str, Any]  # parsed from exactly those bytes (the keys that pass, when it has problems)
    problems: FileError | None = None


def read_project(project: Path, over: Layered) -> ProjectFile | None:
    """A project's `.vmsandbox.yaml`, read without following links (trust.read_project_file), its values
    checked over `over` before anything asks for trust; None if there is none."""
    path = project / PROJECT_FILE
    raw = trust.read_project_file(path, project)
    if raw is None:
        return None
    read = read_config(raw, str(path), over, project=True)
    return ProjectFile(path, raw, read.data, read.problems)
