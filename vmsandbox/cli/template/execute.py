"""A tree run on a row: text as written, each action's value as Go shows it, `if` by Go's truthiness, `range` once
for each element of a list (or each value of a map, by its keys' order) with `.` that element. And the same tree
run for a `table`'s headers, where each field gives its name (`{{.AvailableMib}}`: `AVAILABLE MIB`)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from vmsandbox.cli.template import functions
from vmsandbox.cli.template.functions import Heading, go_type, key, lookup, shown, truthy
from vmsandbox.cli.template.lexer import TemplateError
from vmsandbox.cli.template.tree import Action, Call, Dot, Field, If, Literal, Node, Operand, Pipe, Text

WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")


class Headings:
    """What `.` is while a table's headers are made: each field named gives its header."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = {key(n): n for n in names}

    def heading(self, names: tuple[str, ...]) -> Heading:
        first = self.names.get(key(names[0]), names[0])
        return Heading(" ".join(w.upper() for part in (first, *names[1:]) for w in words(part)))


def words(name: str) -> list[str]:
    """`available_mib`, `AvailableMib`: available, mib."""
    return [w for part in name.split("_") for w in (WORDS.findall(part) or [part])]


def run(nodes: tuple[Node, ...], dot: Any) -> str:
    """The text the tree makes of `dot` (TemplateError: what a value cannot do, at its place in the template)."""
    out: list[str] = []
    _run(nodes, dot, out)
    return "".join(out)


def _run(nodes: tuple[Node, ...], dot: Any, out: list[str]) -> None:
    for node in nodes:
        if isinstance(node, Text):
            out.append(node.text)
        elif isinstance(node, Action) or isinstance(dot, Headings):  # a header: what an `if` or `range` looks at
            out.append(shown(_pipe(node.pipe, dot)))
        elif isinstance(node, If):
            _run(node.then if truthy(_pipe(node.pipe, dot)) else node.otherwise, dot, out)
        else:
            items = _items(_pipe(node.pipe, dot), node.pipe.pos)
            for item in items:
                _run(node.body, item, out)
            if not items:
                _run(node.otherwise, dot, out)


def _items(value: Any, pos: int) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, list | tuple):
        return list(value)
    if isinstance(value, dict):
        return [value[k] for k in sorted(value, key=str)]
    raise TemplateError(f"range over {go_type(value)} {shown(value)!r}", pos, "range takes a list or a map")


def _pipe(pipe: Pipe, dot: Any) -> Any:
    first, *rest = pipe.commands
    value = _value(first, dot)
    for command in rest:  # (the tree holds a function after every pipe)
        if isinstance(command, Call):
            value = _call(command, dot, value)
    return value


def _value(operand: Operand, dot: Any) -> Any:
    if isinstance(operand, Field):
        return _field(operand, dot)
    if isinstance(operand, Dot):
        return Heading("") if isinstance(dot, Headings) else dot
    if isinstance(operand, Literal):
        return operand.value
    if isinstance(operand, Pipe):
        return _pipe(operand, dot)
    return _call(operand, dot)


def _call(call: Call, dot: Any, *piped: Any) -> Any:
    args = [_value(a, dot) for a in call.args] + list(piped)
    try:
        return functions.call(call.name, args)
    except (ValueError, TypeError, OverflowError) as exc:
        raise TemplateError(f"{call.name}: {exc}", call.pos) from None


def _field(field: Field, dot: Any) -> Any:
    if isinstance(dot, Headings):
        return dot.heading(field.names)
    value = dot
    for name in field.names:
        if value is None:
            return None
        if not isinstance(value, dict):
            raise TemplateError(f"can't evaluate field {name} in {go_type(value)} {shown(value)!r}", field.pos,
                                "inside {{range}}, . is the element: '{{range .Files}}{{.}} {{end}}'")  # fmt: skip
        value = lookup(value, name)
    return value
