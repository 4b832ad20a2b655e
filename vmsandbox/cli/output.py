"""How listings come out, alike for every command that lists: a table that fits the terminal (80 columns when
stdout is no terminal), `-q` names, `--json` (an array), and `--format` as docker and limactl take it —
`json` (an object a line), `table`, or a Go-style template (`'{{.Name}} {{.State}}'`, `'table {{.Name}}\\t...'`,
`{{json .Ports}}`), checked against the fields before anything is listed. And `--filter KEY=VALUE`, its keys and
(where they are a known set) its values checked."""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from rich.cells import cell_len, set_cell_size

from vmsandbox import ui
from vmsandbox.cli import complete
from vmsandbox.errors import UsageError

WIDTH = 80  # the width of a table when stdout is no terminal (COLUMNS says otherwise)
GAP = 2  # spaces between two columns
LEAST = 8  # a column is cut no narrower than this (or its header)
HEAD_LEAST = 4  # columns a cut path keeps of its start

AsJson = Annotated[bool, typer.Option("--json", help="Print a JSON array: every field, whole.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="Print names only, one per line.")]
Format = Annotated[
    str | None,
    typer.Option(
        "--format",
        metavar="FORMAT",
        help="json (an object a line), table, or a template: '{{.Name}} {{.State}}' ('table …' adds headers).",
        autocompletion=complete.formats,
    ),
]


def print_json(data: Any) -> None:
    ui.out.print_json(json.dumps(data), indent=2) if sys.stdout.isatty() else print(json.dumps(data, indent=2))


def cut(text: str, width: int, *, path: bool = True) -> str:
    """Text shown in `width` columns at most: a path cut in its middle (it keeps its start and, where it fits,
    its whole file name), other text at its end."""
    if cell_len(text) <= width:
        return text
    if width <= 1:
        return "…"[:width]
    if not path:
        return set_cell_size(text, width - 1) + "…"
    name = cell_len("/" + text.rsplit("/", 1)[-1])
    tail = name if name <= width - 1 - HEAD_LEAST else (width - 1) * 2 // 3
    return set_cell_size(text, width - 1 - tail) + "…" + set_cell_size(text[::-1], tail)[::-1]


def width() -> int:
    return shutil.get_terminal_size((WIDTH, 24)).columns


def columns(headers: list[str], rows: list[list[str]], *, paths: Sequence[str] = (), fit: int | None = None) -> None:
    """A table on stdout in `fit` columns (the terminal's): its first column (names, meant to be copied) whole,
    the widest of the others cut with an ellipsis until the table fits (`paths`: the headers of columns cut in
    their middle); the whole text is in --json and `inspect`. Cells are shown escaped."""
    cells = [headers, *[[ui.printable(c, markup=False) for c in row] for row in rows]]
    widths = [max(cell_len(row[i]) for row in cells) for i in range(len(headers))]
    room = (fit or width()) - GAP * (len(headers) - 1)
    least = [max(min(LEAST, w), cell_len(h)) for w, h in zip(widths, headers, strict=True)]
    while sum(widths) > room:
        cuttable = [i for i in range(1, len(widths)) if widths[i] > least[i]]
        if not cuttable:
            break
        widest = max(cuttable, key=lambda i: widths[i])
        widths[widest] -= 1
    for row in cells:
        shown = [c if i == 0 else cut(c, widths[i], path=headers[i] in paths) for i, c in enumerate(row)]
        padded = [c + " " * (widths[i] - cell_len(c)) for i, c in enumerate(shown[:-1])]
        print((" " * GAP).join([*padded, shown[-1]]).rstrip())


# --format: a Go-style template, as docker and limactl take it.
ACTION = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}")
REFERENCE = re.compile(r"(json\s+)?\.((?:[A-Za-z_][A-Za-z0-9_]*)(?:\.[A-Za-z0-9_]+)*)?")


def _key(word: str) -> str:
    return word.replace("_", "").lower()


@dataclass(frozen=True)
class Template:
    """A checked --format template: its text, whether it is a table (headers, aligned), and each field it names
    as (json?, the path of keys)."""

    text: str
    table: bool

    def render(self, row: dict[str, Any]) -> str:
        def one(found: re.Match[str]) -> str:
            action = REFERENCE.fullmatch(found.group(1))
            if action is None:  # (template() refuses one)
                return found.group(0)
            value: Any = row
            for part in (action.group(2) or "").split(".") if action.group(2) else []:
                if isinstance(value, dict):
                    value = next((v for k, v in value.items() if _key(str(k)) == _key(part)), None)
                else:
                    value = None
            if action.group(1):
                return json.dumps(value)
            return _plain(value)

        return ACTION.sub(one, self.text)

    def headers(self) -> str:
        def one(found: re.Match[str]) -> str:
            action = REFERENCE.fullmatch(found.group(1))
            return (action.group(2) or "").upper().replace(".", " ") if action else ""

        return ACTION.sub(one, self.text)


def _plain(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ",".join(_plain(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value)
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def template(fmt: str | None, fields: Sequence[str]) -> Template | None:
    """`--format` checked against the fields of a row (UsageError naming them): None for the table (or json)."""
    if fmt is None or fmt in ("table", "json"):
        return None
    text = fmt.replace("\\t", "\t").replace("\\n", "\n")
    table = text.startswith("table ")
    text = text.removeprefix("table ").lstrip() if table else text
    known = {_key(f) for f in fields}
    named = []
    for found in ACTION.finditer(text):
        action = REFERENCE.fullmatch(found.group(1))
        if action is None:
            raise UsageError(f"--format: {found.group(0)} is not a field", hint=_fields_hint(fields))
        first = (action.group(2) or "").split(".")[0]
        if first and _key(first) not in known:
            raise UsageError(f"--format: no field {first!r}", hint=_fields_hint(fields))
        named.append(first or ".")
    if not named:
        raise UsageError(f"--format {fmt!r} names no field", hint=_fields_hint(fields))
    return Template(text, table)


def _fields_hint(fields: Sequence[str]) -> str:
    shown = ", ".join("." + "".join(w.capitalize() for w in f.split("_")) for f in fields)
    return f"e.g. --format '{{{{.Name}}}}\\t{{{{.State}}}}'; the fields: {shown} (json, table, or `--json` for all)"


def formats(fmt: str | None, extra: Sequence[str] = ()) -> None:
    """Refuse a named format this listing does not have (json, table, and `extra`)."""
    if fmt is not None and "{{" not in fmt and fmt not in ("json", "table", *extra):
        named = ", ".join(("json", "table", *extra))
        raise UsageError(f"--format {fmt!r}: no such format", hint=f"{named}, or a template such as '{{{{.Name}}}}'")


@dataclass(frozen=True)
class Column:
    """A column of a listing's table: its header and its cell for a row."""

    header: str
    cell: Callable[[dict[str, Any]], str]


def listing(
    rows: list[dict[str, Any]],
    table: Sequence[Column],
    *,
    as_json: bool = False,
    quiet: bool = False,
    fmt: str | None = None,
    key: str = "name",
    empty: str,
    paths: Sequence[str] = (),
    fields: Sequence[str] = (),
) -> None:
    """Rows shown as the options say: --json (an array), --format json (an object a line), -q (the `key` of
    each), a template (checked against `fields`, and the rows' own), or the table (`empty` when there is no row:
    what to do next)."""
    known = list(dict.fromkeys([*fields, *(k for r in rows for k in r)])) or [key]
    shaped = template(fmt, known) if fmt is not None else None
    if as_json:
        print_json(rows)
    elif fmt == "json":
        for r in rows:
            print(json.dumps(r))
    elif quiet:
        for r in rows:
            print(r[key])
    elif shaped is not None:
        shown = [shaped.render(r) for r in rows]
        if shaped.table:
            lines = [shaped.headers(), *shown]
            split = [line.split("\t") for line in lines]
            if all(len(s) == len(split[0]) for s in split):
                columns(split[0], split[1:], fit=10**6)  # the person chose the columns: nothing cut
                return
            shown = lines
        for line in shown:
            print(line)
    elif not rows:
        ui.info(empty)
    else:
        columns([c.header for c in table], [[c.cell(r) for c in table] for r in rows], paths=paths)


def filters(given: list[str], keys: Mapping[str, Sequence[str] | None]) -> dict[str, set[str]]:
    """`--filter state=running,host=local` (and more --filter): KEY one of `keys`, VALUE (a wildcard pattern
    where `keys` gives no set) one of the values its key takes; UsageError naming the valid ones."""
    wanted: dict[str, set[str]] = {}
    for part in (p for text in given for p in text.split(",") if p):
        key, eq, value = part.partition("=")
        if not eq or key not in keys:
            raise UsageError(
                f"--filter {part!r}: expected KEY=VALUE with KEY one of {', '.join(keys)}",
                hint="e.g. `--filter state=running` (name=exp* takes a wildcard)",
            )
        valid = keys[key]
        if valid is not None and not fnmatch.filter(valid, value):
            raise UsageError(f"--filter {key}={value}: no such {key}", hint=f"{key} is one of {', '.join(valid)}")
        wanted.setdefault(key, set()).add(value)
    return wanted


def matches(row: dict[str, Any], wanted: dict[str, set[str]]) -> bool:
    return all(any(fnmatch.fnmatchcase(str(row.get(k) or ""), v) for v in values) for k, values in wanted.items())
