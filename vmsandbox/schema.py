"""Strict reading of YAML documents: unknown keys and wrong types are errors naming the file and key."""

from __future__ import annotations

import difflib
import re
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


class Size:
    """Marker: the field is a size: a string like `2G` or `512M`, or a plain number of MiB."""


class _StrictLoader(yaml.SafeLoader):
    """safe_load that refuses a key given twice in one mapping (YAML itself keeps the last one silently)."""


def _mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if isinstance(key, str) and key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"the key `{key}` is given twice", key_node.start_mark)
        if isinstance(key, str):
            seen.add(key)
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


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
        doc = yaml.load(data, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader that also refuses duplicate keys
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
            near = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.6)
            said = f"did you mean `{near[0]}`? " if near else ""
            raise VmsandboxError(f"{source}: unknown key `{key}`", hint=f"{said}known keys are: {known}")
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
        elif expected is Size:
            ok = isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))
            wanted = "a size like 2G or 512M, or a number of MiB"
        elif expected is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
            wanted = "an integer"
        else:
            ok = isinstance(value, expected)
            wanted = {str: "a string", bool: "true or false"}.get(expected, expected.__name__)
        if not ok:
            raise VmsandboxError(f"{source}: `{key}` must be {wanted}, not {type(value).__name__} {value!r}")
    return dict(data)


def key_lines(raw: bytes) -> dict[str, int]:
    """The line of each top-level key of a YAML mapping document ({} if it is none)."""
    try:
        node = yaml.compose(raw, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return {}
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {k.value: k.start_mark.line + 1 for k, _ in node.value if isinstance(k, yaml.ScalarNode)}


def located(exc: VmsandboxError, source: str, raw: bytes) -> VmsandboxError:
    """`exc` about a key of the file `source` (`FILE: ... `key` ...`), its message naming the key's line."""
    prefix = f"{source}: "
    if not exc.message.startswith(prefix):
        return exc
    rest = exc.message[len(prefix) :]
    named = re.match(r"[^`]*`([^`\[]+)", rest)
    line = key_lines(raw).get(named.group(1)) if named else None
    return exc if line is None else VmsandboxError(f"{source}, line {line}: {rest}", hint=exc.hint)


SIZE_PATTERN = r"^\s*\d+\s*[KMGTkmgt]?(i?[Bb])?\s*$"


def json_schema(
    fields: Mapping[str, FieldType],
    *,
    title: str,
    extras: Mapping[str, dict[str, Any]] | None = None,
    items: dict[str, Any] | None = None,
    required: tuple[str, ...] = (),
) -> dict[str, Any]:
    """A JSON Schema (draft 2020-12) of a document checked with `check(fields)`: editors complete and check
    the keys with it. `items` is the schema of a `Mappings` field's entries; `extras` adds ranges and choices."""
    plain: dict[Any, dict[str, Any]] = {
        str: {"type": "string"},
        int: {"type": "integer"},
        bool: {"type": "boolean"},
        list: {"type": "array", "items": {"type": "string"}},
        StrMap: {"type": "object", "additionalProperties": {"type": "string"}},
        Size: {"oneOf": [{"type": "string", "pattern": SIZE_PATTERN}, {"type": "integer", "minimum": 1}]},
        Mappings: {"type": "array", "items": items or {"type": "object"}},
    }
    properties = {key: {**plain[kind], **(extras or {}).get(key, {})} for key, kind in fields.items()}
    schema: dict[str, Any] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": title,
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
    if required:
        schema["required"] = list(required)
    return schema
