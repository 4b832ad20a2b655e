"""Strict reading of YAML documents people write: a key given twice is an error; a document's shape is checked
against its pydantic model (filemodels.py), every problem at once, each naming the file, the line and the key
(a misspelt one with a "did you mean"); and the model's JSON Schema for editors."""

from __future__ import annotations

import difflib
import re
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from vmsandbox.errors import VmsandboxError
from vmsandbox.filemodels import keys


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


WANTED = {  # what a pydantic error type says a key must be
    "int_type": "an integer",
    "string_type": "a string",
    "bool_type": "true or false",
    "dict_type": "a mapping (`key: value` lines)",
    "model_type": "a mapping (`key: value` lines)",
}


class ShapeError(VmsandboxError):
    """Everything wrong with one file's shape: (top-level key, what is wrong) pairs, each said with its line
    once `located` knows the file's bytes."""

    def __init__(self, source: str, items: list[tuple[str, str]], *, hint: str | None = None) -> None:
        self.source, self.items = source, items
        text = items[0][1] if len(items) == 1 else f"{len(items)} problems: " + "; ".join(t for _, t in items)
        super().__init__(f"{source}: {text}", hint=hint)


def all_at_once(source: str, problems: list[tuple[str, VmsandboxError]], shape: ShapeError | None = None) -> None:
    """Raise every problem of one file at once: its shape's (if any) and its values' ((key, error) each, the
    error's message starting with `source`), their hints joined; one problem alone keeps its own error."""
    if len(problems) == 1 and shape is None:
        raise problems[0][1]
    if problems or shape is not None:
        said = [(key, exc.message.removeprefix(f"{source}: ")) for key, exc in problems]
        hints = [e.hint for e in (shape, *(exc for _, exc in problems)) if e is not None and e.hint]
        items = [*(shape.items if shape is not None else []), *said]
        raise ShapeError(source, items, hint="; ".join(dict.fromkeys(hints)) or None)


def _where(loc: tuple[str | int, ...]) -> tuple[str, str]:
    """A location as (the mapping it is in, the key in it): ("secrets[0]", "header"), ("", "allow[1]")."""
    last = max((i for i, part in enumerate(loc) if isinstance(part, str)), default=0)

    def path(parts: tuple[str | int, ...]) -> str:
        return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts).lstrip(".")

    return path(loc[:last]), path(loc[last:])


def _said(error: Any, model: type[BaseModel]) -> str:
    loc = tuple(error["loc"])
    kind = error["type"]
    container, leaf = _where(loc)
    inside = f"`{container}`: " if container else ""
    if kind == "extra_forbidden":
        near = difflib.get_close_matches(leaf, _keys_at(model, loc[:-1]), n=1, cutoff=0.6)
        return f"{inside}unknown key `{leaf}`" + (f" (did you mean `{near[0]}`?)" if near else "")
    if kind == "missing":
        return f"{inside}missing key `{leaf}`"
    value = error.get("input")
    if kind == "value_error":
        must = str(error["msg"]).removeprefix("Value error, ")
    elif kind == "list_type":
        must = "must be a list of " + ("mappings (`- key: value` entries)" if _keys_at(model, loc) else "strings")
    else:
        must = "must be " + WANTED.get(kind, str(error["msg"]).lower())
    return f"{inside}`{leaf}` {must}, not {type(value).__name__} {value!r}"


def check(data: Mapping[str, Any], model: type[BaseModel], *, source: str) -> dict[str, Any]:
    """Check data's shape against `model` (unknown and missing keys, types), every problem at once; the data
    as given (nothing is converted). `source` names the file (or `FILE: `key[i]`` for an entry of one)."""
    try:
        model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        items = [(str(e["loc"][0]) if e["loc"] else "", _said(e, model)) for e in errors]
        unknown = any(e["type"] == "extra_forbidden" and len(e["loc"]) == 1 for e in errors)
        hint = f"known keys are: {', '.join(sorted(_keys_at(model, ())))}" if unknown else None
        raise ShapeError(source, items, hint=hint) from None
    return dict(data)


def _keys_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys the mapping at `loc` of a `model` document takes (a nested model's, for `secrets[0]`)."""
    for part in (p for p in loc if not isinstance(p, int)):
        field = model.model_fields.get(str(part))
        inner = [a for a in typing.get_args(field.annotation) if isinstance(a, type)] if field else []
        nested = next((a for a in inner if issubclass(a, BaseModel)), None)
        if nested is None:
            return []
        model = nested
    return list(keys(model))


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
    """`exc` about a key of the file `source` (`FILE: ... `key` ...`), its message naming the key's line (each
    problem's, for ShapeError)."""
    lines = key_lines(raw)
    if isinstance(exc, ShapeError) and exc.source == source:
        said = sorted(((lines.get(key), text) for key, text in exc.items), key=lambda p: p[0] or len(lines) + 1)
        if len(said) == 1:
            line, text = said[0]
            return VmsandboxError(f"{source}{'' if line is None else f', line {line}'}: {text}", hint=exc.hint)
        body = "".join(f"\n  {'' if line is None else f'line {line}: '}{text}" for line, text in said)
        return VmsandboxError(f"{source}: {len(said)} problems:{body}", hint=exc.hint)
    prefix = f"{source}: "
    if not exc.message.startswith(prefix):
        return exc
    rest = exc.message[len(prefix) :]
    named = re.match(r"[^`]*`([^`\[]+)", rest)
    line = lines.get(named.group(1)) if named else None
    return exc if line is None else VmsandboxError(f"{source}, line {line}: {rest}", hint=exc.hint)


def json_schema(model: type[BaseModel], *, title: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a file of `model`: editors complete and check its keys with it."""
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **model.model_json_schema(), "title": title}
