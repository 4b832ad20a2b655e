"""How listings come out, alike for every command that lists, as docker prints them:
- a table of whole values, never cut: its headers are its fields' names (`AVAILABLE MIB` is `{{.AvailableMib}}`);
  wider than the terminal (80 columns, or COLUMNS, when stdout is no terminal), it leaves out whole columns in the
  order the listing gives and says which on stderr; `-o wide` shows every column;
- `-q`: the names, one a line; `--json` (and `--format json`): one JSON object a line, every field;
- `--format`: json, table, or a Go template (cli/template: the subset docker users write), checked against the
  listing's fields before anything is listed.
One of -q, --json, --format and -o at a time. And `--filter KEY=VALUE`, its keys and (where they are a known set)
its values checked."""

from __future__ import annotations

import fnmatch
import json
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from rich.cells import cell_len, set_cell_size

from vmsandbox import ui
from vmsandbox.cli import complete
from vmsandbox.cli.template.checked import Template, check
from vmsandbox.errors import UsageError

WIDTH = 80  # the width of a table when stdout is no terminal (COLUMNS says otherwise)
GAP = 2  # spaces between two columns
NAMED = ("json", "table")  # the formats that are no template
HEAD_LEAST = 4  # columns a cut path keeps of its start


def _outputs(incomplete: str) -> list[str]:
    return [w for w in ("wide",) if w.startswith(incomplete)]


AsJson = Annotated[bool, typer.Option("--json", help="One JSON object a line, every field (as --format json).")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="Print names only, one per line.")]
Output = Annotated[
    str | None,
    typer.Option(
        "--output",
        "-o",
        metavar="wide",
        help="wide: every column, however wide (a table wider than the terminal leaves columns out).",
        autocompletion=_outputs,
    ),
]


def format_option(example: str, also: str = "") -> Any:
    """A listing's --format option, its example a template of that listing's fields (`also`: another's)."""
    return typer.Option(
        "--format",
        metavar="FORMAT",
        help=f"json (an object a line), table, or a Go template: '{example}' ('table …' adds headers"
        + (f"; {also})." if also else ")."),
        autocompletion=complete.formats,
    )


def print_json(data: Any) -> None:
    """One JSON document, indented (`inspect --json`, as docker inspect)."""
    ui.out.print_json(json.dumps(data), indent=2) if sys.stdout.isatty() else print(json.dumps(data, indent=2))


def json_lines(rows: Sequence[Any]) -> None:
    """One JSON object a line, as docker's --format json (and `{{json .}}`) prints them."""
    for row in rows:
        print(json.dumps(row, separators=(",", ":")))


def cut(text: str, width: int, *, path: bool = True) -> str:
    """Text shown in `width` columns at most, for the review's screens (a listing never cuts): a path cut in its
    middle (it keeps its start and, where it fits, its whole file name), other text at its end."""
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


def columns(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """An aligned table on stdout, every value whole, each shown escaped."""
    cells = [list(headers), *[[ui.visible(c) for c in row] for row in rows]]
    widths = [max(cell_len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        padded = [c + " " * (widths[i] - cell_len(c)) for i, c in enumerate(row[:-1])]
        print((" " * GAP).join([*padded, row[-1]]).rstrip())


def plain(value: Any) -> str:
    """A value in a table's cell: None as `-`, a list as `a, b`."""
    if value is None:
        return "-"
    if isinstance(value, list | tuple):
        return ", ".join(plain(v) for v in value) or "-"
    if isinstance(value, dict):
        return json.dumps(value)
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


@dataclass(frozen=True)
class Column:
    """A column of a listing's table: the field it shows (its header is that field's name in upper case words),
    its cell as people read it (else the value as it is), and, for a field the listing makes for its table (`age`
    from `age_seconds`), how a row makes it: every row then has it, in --json and --format too."""

    field: str
    cell: Callable[[dict[str, Any]], str] | None = None
    made: Callable[[dict[str, Any]], Any] | None = None

    @property
    def header(self) -> str:
        return self.field.replace("_", " ").upper()

    def shown(self, row: dict[str, Any]) -> str:
        return ui.visible(self.cell(row) if self.cell is not None else plain(row.get(self.field)))


@dataclass(frozen=True)
class Shape:
    """How a listing is to come out: the options given, checked."""

    json: bool = False
    quiet: bool = False
    template: Template | None = None
    wide: bool = False


@dataclass(frozen=True)
class Listing:
    """What a listing command lists: the fields of its rows, its table (its first column, the names, always
    shown), the order its other columns are kept in when the table is too wide (`keep`, the first kept longest;
    those not named after, in their order), the field `-q` prints, and its --format help's example."""

    fields: tuple[str, ...]
    columns: tuple[Column, ...]
    example: str
    keep: tuple[str, ...] = ()
    key: str = "name"

    @property
    def names(self) -> tuple[str, ...]:
        """Every field a row has: its own and those made for the table."""
        return tuple(dict.fromkeys([*self.fields, *(c.field for c in self.columns if c.made is not None)]))

    def shape(
        self, *, as_json: bool = False, quiet: bool = False, fmt: str | None = None, output: str | None = None
    ) -> Shape:
        """The options checked before anything is listed (UsageError: two ways at once, an unknown format or
        output, a template with a fault or a field this listing has not)."""
        given = [
            o for o, on in (("-q", quiet), ("--json", as_json), ("--format", fmt is not None), ("-o", output)) if on
        ]
        if len(given) > 1:
            raise UsageError(f"{' and '.join(given)}: choose one")
        if output not in (None, "wide"):
            raise UsageError(f"-o {output}: no such output", hint="`-o wide` shows every column, however wide")
        formats(fmt)
        shaped = template(fmt, self.names)
        return Shape(json=as_json or fmt == "json", quiet=quiet, template=shaped, wide=output == "wide")

    def show(self, rows: Sequence[dict[str, Any]], shape: Shape, *, empty: str) -> None:
        """Rows as `shape` says (`empty`, said on stderr when the table has no row: what to do next)."""
        made = [{**r, **{c.field: c.made(r) for c in self.columns if c.made is not None}} for r in rows]
        if shape.json:
            json_lines(made)
        elif shape.quiet:
            for r in made:
                print(ui.visible(plain(r.get(self.key))))
        elif shape.template is not None:
            templated(shape.template, made)
        elif not made:
            ui.info(empty)
        else:
            self.table(made, wide=shape.wide)

    def table(self, rows: Sequence[dict[str, Any]], *, wide: bool) -> None:
        cells = [[c.shown(r) for c in self.columns] for r in rows]
        heads = [c.header for c in self.columns]
        widths = [max(cell_len(x) for x in [h, *(row[i] for row in cells)]) for i, h in enumerate(heads)]
        room = width()
        shown = list(range(len(heads))) if wide else self.fitting(widths, room)
        columns([heads[i] for i in shown], [[row[i] for i in shown] for row in cells])
        left = [heads[i] for i in range(len(heads)) if i not in shown]
        if left:
            ui.info(f"[dim]{', '.join(left)} left out to fit {room} columns: `-o wide` shows every column[/]")

    def fitting(self, widths: Sequence[int], room: int) -> list[int]:
        """The columns shown in `room`: the first, then each other in the order kept that still fits whole."""
        fields = [c.field for c in self.columns]
        ranked = sorted(range(1, len(fields)), key=lambda i: (self.keep + tuple(fields)).index(fields[i]))
        taken, used = [0], widths[0]
        for i in ranked:
            if used + GAP + widths[i] <= room:
                taken.append(i)
                used += GAP + widths[i]
        return sorted(taken)


def templated(shaped: Template, rows: Sequence[dict[str, Any]]) -> None:
    """Rows through a template, every one rendered before any is printed; a `table` aligned under its headers
    (the columns the person chose, all of them, whole)."""
    texts = [shaped.render(r) for r in rows]
    if not shaped.table:
        for text in texts:
            print(ui.visible(text))
        return
    lines = "\n".join([shaped.headers(), *texts]).split("\n")
    split = [line.split("\t") for line in lines]
    if all(len(s) == len(split[0]) for s in split):
        columns(split[0], split[1:])
    else:
        for line in lines:
            print(ui.visible(line))


def template(fmt: str | None, fields: Sequence[str]) -> Template | None:
    """`--format` checked against the fields of a row (UsageError naming them): None for json and table."""
    if fmt is None or fmt in NAMED or "{{" not in fmt:
        return None
    return check(fmt, fields)


def formats(fmt: str | None, extra: Sequence[str] = ()) -> None:
    """Refuse a named format this listing does not have (json, table, and `extra`)."""
    if fmt is not None and "{{" not in fmt and fmt not in (*NAMED, *extra):
        named = ", ".join((*NAMED, *extra))
        raise UsageError(f"--format {fmt!r}: no such format", hint=f"{named}, or a template such as '{{{{.Name}}}}'")


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
