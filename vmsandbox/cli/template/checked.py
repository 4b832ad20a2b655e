"""A --format template checked against a listing's fields before anything is listed: a Template that renders a
row (and a `table`'s headers), or a UsageError that shows the template with a caret under what is wrong."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vmsandbox.cli.template import execute, lexer, tree
from vmsandbox.cli.template.functions import key
from vmsandbox.cli.template.lexer import TemplateError
from vmsandbox.errors import UsageError

SHOWN = 72  # characters of a long template shown around what is wrong


@dataclass(frozen=True)
class Template:
    """A checked template: its text as given, its tree, whether it is a `table` (headers, aligned columns), and the
    fields of the listing it was checked against."""

    text: str
    nodes: tuple[tree.Node, ...]
    table: bool
    names: tuple[str, ...]

    def render(self, row: Any) -> str:
        """The text of one row (UsageError: what a value could not do, at its place in the template)."""
        try:
            return execute.run(self.nodes, row)
        except TemplateError as exc:
            raise refused(self.text, exc) from None

    def headers(self) -> str:
        """A `table`'s first line: the template run with each field giving its name in upper case words."""
        return execute.run(self.nodes, execute.Headings(self.names))


def check(text: str, names: Sequence[str]) -> Template:
    """`text` (a --format value that is a template) parsed, and every field it names of a row one of `names`."""
    body = text[len("table") :] if text.startswith("table") and text[5:6] in (" ", "\t", "\n") else None
    start = 0 if body is None else len(text) - len(body.lstrip())
    try:
        nodes = tree.parse(lexer.lex(text, start))
        _named(nodes, names)
    except TemplateError as exc:
        raise refused(text, exc) from None
    return Template(text, nodes, body is not None, tuple(names))


def _named(nodes: tuple[tree.Node, ...], names: Sequence[str]) -> None:
    known = {key(n) for n in names}
    for field in tree.fields(nodes):
        if key(field.names[0]) not in known:
            raise TemplateError(f"no field .{field.names[0]}", field.pos, fields_hint(names))


def refused(text: str, exc: TemplateError) -> UsageError:
    """The error, its column, and the template with a caret under it."""
    shown = "".join(" " if c in "\t\r\n" else c for c in text)
    caret = exc.pos
    if len(shown) > SHOWN:
        begin = max(0, min(exc.pos - SHOWN // 2, len(shown) - SHOWN))
        head = "…" if begin else ""
        tail = "…" if begin + SHOWN < len(shown) else ""
        shown, caret = head + shown[begin : begin + SHOWN] + tail, exc.pos - begin + len(head)
    message = f"--format: {exc.message} at column {exc.pos + 1}{exc.then}\n  {shown}\n  {' ' * caret}^"
    return UsageError(message, hint=exc.hint)


def camel(name: str) -> str:
    """A field as a template names it: `available_mib` → `.AvailableMib`."""
    return "." + "".join(w.capitalize() for w in execute.words(name))


def fields_hint(names: Sequence[str]) -> str:
    return f"the fields: {', '.join(camel(n) for n in names)} (case and underscores aside)"
