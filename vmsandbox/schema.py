"""Strict reading of YAML documents: unknown keys and wrong types are errors naming the file and key."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from vmsandbox.errors import VmsandboxError

# A field's expected type: str, int, bool, list[str] (spelled `list`), or a list of mappings (`Mappings`,
# each checked by the caller with `check` again).
FieldType = type


class Mappings:
    """Marker: the field is a list of mappings."""


class StrMap:
    """Marker: the field is a mapping of strings to strings."""


def load_yaml(path: Path) -> dict[str, Any]:
    """A YAML mapping from path ({} for an empty file)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise VmsandboxError(f"cannot read {path}: {exc.strerror}") from exc
    return parse_yaml(data, str(path))


def parse_yaml(data: bytes, source: str) -> dict[str, Any]:
    """A YAML mapping from bytes ({} for an empty document); errors name `source` and the line."""
    try:
        doc = yaml.safe_load(data)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        if isinstance(exc, yaml.reader.ReaderError):  # a byte YAML never takes (control characters, bad UTF-8)
            where, problem = f", byte {exc.position}", f"{exc.reason} (character {exc.character!r})"
        raise VmsandboxError(f"{source}{where}: not valid YAML: {problem}", hint="fix the syntax there") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise VmsandboxError(f"{source}: the top level must be a mapping of keys to values")
    return doc


def check(
    data: Mapping[str, Any],
    fields: Mapping[str, FieldType],
    *,
    source: str,
    required: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Validate data against fields; return a plain dict. `source` names the file for messages."""
    for key in data:
        if key not in fields:
            known = ", ".join(sorted(fields))
            raise VmsandboxError(f"{source}: unknown key `{key}`", hint=f"known keys are: {known}")
    for key in required:
        if key not in data:
            raise VmsandboxError(f"{source}: missing key `{key}`")
    for key, value in data.items():
        expected = fields[key]
        if expected is list:
            ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
            wanted = "a list of strings"
        elif expected is StrMap:
            ok = isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
            wanted = "a mapping of names to strings (quote numbers)"
        elif expected is Mappings:
            ok = isinstance(value, list) and all(isinstance(v, dict) for v in value)
            wanted = "a list of mappings (`- key: value` entries)"
        elif expected is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
            wanted = "an integer"
        else:
            ok = isinstance(value, expected)
            wanted = {str: "a string", bool: "true or false"}.get(expected, expected.__name__)
        if not ok:
            raise VmsandboxError(f"{source}: `{key}` must be {wanted}, not {type(value).__name__} {value!r}")
    return dict(data)
