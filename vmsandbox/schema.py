"""A document's shape checked against its pydantic model (filemodels.py): every problem at once, each at its key
(a misspelt one with a "did you mean") and with its own hint; and the model's JSON Schema for editors. Reading
the YAML itself, and the lines of keys, is document.py's."""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from vmsandbox.document import FileError, Problem, did_you_mean, key_path
from vmsandbox.filemodels import keys

WANTED = {  # what a pydantic error type says a key must be
    "int_type": "an integer",
    "string_type": "a string",
    "bool_type": "true or false",
    "dict_type": "a mapping (`key: value` lines)",
    "model_type": "a mapping (`key: value` lines)",
}


def _where(loc: tuple[str | int, ...]) -> tuple[str, str]:
    """A location as (the mapping it is in, the key in it): ("secrets[0]", "header"), ("", "allow[1]")."""
    last = max((i for i, part in enumerate(loc) if isinstance(part, str)), default=0)
    return key_path(loc[:last]), key_path(loc[last:])


def _problem(error: Any, model: type[BaseModel]) -> Problem:
    loc = tuple(error["loc"])
    kind = error["type"]
    if kind == "invalid_key" or loc[-1:] == ("[key]",):  # a key that is not a string: `1: x`, `{1: a}`
        within = tuple(p for p in loc if p != "[key]")[:-1]
        inside = f"`{key_path(within)}`: " if within else ""
        said = f"{inside}the key {error.get('input')!r} is not a name"
        return Problem(said, (*within, str(error.get("input"))), hint="a key is a word (quote a number to make it one)")
    container, leaf = _where(loc)
    inside = f"`{container}`: " if container else ""
    if kind == "extra_forbidden":
        known = _keys_at(model, loc[:-1])
        said = f"{inside}unknown key `{leaf}`{did_you_mean(leaf, known)}"
        takes = f"`{container}` takes" if container else "known keys are"
        return Problem(said, loc, hint=f"{takes}: {', '.join(known)}")
    if kind == "missing":
        return Problem(f"{inside}missing key `{leaf}`", loc, hint=f"add `{leaf}: …` there")
    value = error.get("input")
    if kind == "value_error":
        must = str(error["msg"]).removeprefix("Value error, ")
    elif kind == "list_type":
        must = "must be a list of " + ("mappings (`- key: value` entries)" if _keys_at(model, loc) else "strings")
    else:
        must = "must be " + WANTED.get(kind, str(error["msg"]).lower())
    return Problem(f"{inside}`{leaf}` {must}, not {type(value).__name__} {value!r}", loc)


def shape_problems(data: Mapping[str, Any], model: type[BaseModel]) -> list[Problem]:
    """What is wrong with data's shape against `model` (unknown and missing keys, types), each at its key."""
    try:
        model.model_validate(data)
    except ValidationError as exc:
        return [_problem(e, model) for e in exc.errors()]
    return []


def check(data: Mapping[str, Any], model: type[BaseModel], *, source: str) -> dict[str, Any]:
    """Check data's shape against `model`, every problem at once (FileError); the data as given (nothing
    is converted). `source` names the file (or `FILE: `key[i]`` for an entry of one)."""
    problems = shape_problems(data, model)
    if problems:
        raise FileError(source, problems)
    return dict(data)


def _keys_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys the mapping at `loc` of a `model` document takes (a nested model's, for `secrets[0]`)."""
    for part in (p for p in loc if not isinstance(p, int)):
        field = _field(model, str(part))
        types = [field.annotation, *typing.get_args(field.annotation)] if field else []
        nested = next((t for t in types if isinstance(t, type) and issubclass(t, BaseModel)), None)
        if nested is None:
            return []
        model = nested
    return list(keys(model))


def _field(model: type[BaseModel], key: str) -> FieldInfo | None:
    """The field a key sets, as written in a file (`copy`, the field `copy_`)."""
    return next((f for name, f in model.model_fields.items() if (f.alias or name) == key), None)


def json_schema(model: type[BaseModel], *, title: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a file of `model`: editors complete and check its keys with it."""
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **model.model_json_schema(), "title": title}
