"""Help as it is read: plain text when stdout is no terminal (piped, or NO_COLOR, or TERM=dumb) — no boxes, no
padding, no trailing spaces, markup rendered (no backticks, no `\\[`), each example one line that pastes, each
default said once — and, for both that and typer's panels at a terminal, a docstring tidied into help (each
paragraph one line, the examples one a line, a default the help says itself not said again)."""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import shutil
import sys
import textwrap
from typing import Any

KEEP = "\x00"  # a space inside a code span while a paragraph is wrapped: a command is never cut
EXAMPLES = re.compile(r"Examples?:")
EXAMPLE = re.compile(r"`([^`]+)`\s*(?:\((.*)\))?\s*")  # one command, and a note on it in parentheses
GAP = 2  # spaces between a name and its text
NAMES = 24  # the widest column of names; a longer name has its text on the next line


def rich_utils() -> Any:  # (the module)
    """typer's help printer, imported when help is printed: with markdown and pretty tracebacks, imported at the top
    it cost every command 60 ms of its start here."""
    from typer import rich_utils as printer

    return printer


def piped() -> bool:
    """Whether help is read as plain text: stdout no terminal (unless FORCE_COLOR forces one), NO_COLOR, TERM=dumb."""
    forced = rich_utils().FORCE_TERMINAL
    terminal = sys.stdout.isatty() if forced is None else forced
    return not terminal or bool(os.environ.get("NO_COLOR")) or os.environ.get("TERM") == "dumb"


def readable(text: str) -> str:
    """A docstring as help: each paragraph one line (the reader's width wraps it; a docstring's own line breaks would
    cut sentences), and its examples one per line (`Examples: a · b`)."""
    out: list[str] = []
    for paragraph in inspect.cleandoc(text).split("\n\n"):
        joined = " ".join(line.strip() for line in paragraph.splitlines())
        for part in re.split(r" (?=Examples?: )", joined):
            found = re.fullmatch(r"(Examples?):\s*(.+)", part)
            if found is None:
                out.append(part)
            else:
                out += [f"{found.group(1)}:", *(e.strip() for e in found.group(2).split(" · "))]
    return "\n\n".join(p for p in out if p)


def tidy(command: Any) -> None:
    """A command's help made readable, and a default its option's help says (`\\[default: a free one]`) not said a
    second time by typer (`[default: 0]`)."""
    command.help = readable(command.help or "")
    for param in command.params:
        if "[default:" in (getattr(param, "help", None) or ""):
            param.show_default = False


def rendered(text: str) -> str:
    """Markup as it shows: `\\[x]` is `[x]`, a style tag is its text."""
    from rich.errors import MarkupError
    from rich.text import Text

    with contextlib.suppress(MarkupError):
        return Text.from_markup(text).plain
    return text


def width() -> int:
    return max(40, min(shutil.get_terminal_size((80, 24)).columns, 160))


def prose(text: str, wide: int, indent: str = "", first: str | None = None) -> list[str]:
    """A paragraph wrapped at `wide`, its code spans shown without backticks and never cut across lines."""
    kept = re.sub(r"`([^`]+)`", lambda m: m.group(1).replace(" ", KEEP), text)
    lines = textwrap.wrap(
        rendered(kept),
        wide,
        initial_indent=indent if first is None else first,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    )
    return [line.replace(KEEP, " ").rstrip() for line in lines]


def example(paragraph: str) -> str:
    """`vmsandbox run . -- make test` (a note): the command as it pastes, the note after it as a shell comment."""
    found = EXAMPLE.fullmatch(paragraph)
    if found is None:
        return "  " + rendered(paragraph.replace("`", ""))
    command, note = rendered(found.group(1)), found.group(2)
    return f"  {command}" + (f"  # {rendered(note.replace('`', ''))}" if note else "")


def described(text: str, wide: int) -> list[str]:
    """A command's text: its paragraphs wrapped, its examples one a line."""
    out: list[str] = []
    examples = False
    for paragraph in text.split("\n\n"):
        if EXAMPLES.fullmatch(paragraph):
            examples = True
            out += ["", paragraph]
        elif examples:
            out.append(example(paragraph))
        else:
            out += ["", *prose(paragraph, wide)]
    return out


def table(rows: list[tuple[str, str]], wide: int, column: int | None = None) -> list[str]:
    """Names and their texts in two columns (the names' as wide as `column`, or as the longest name that fits); a
    name too long for its column has its text on the next line."""
    column = column or columns(name for name, _ in rows)
    indent = " " * (2 + column + GAP)
    out: list[str] = []
    for name, text in rows:
        head = f"  {name}"
        if len(name) > column:
            out.append(head)
            out += prose(text, wide, indent)
        else:
            out += prose(text, wide, indent, first=head.ljust(len(indent))) or [head]
    return out


def columns(names: Any) -> int:
    return max((len(n) for n in names if len(n) <= NAMES), default=NAMES)


def _default(ctx: Any, param: Any) -> str | None:
    """`[default: X]` as typer would add it (never when the help says it)."""
    show = getattr(param, "show_default", None)
    if isinstance(show, str):
        return f"[default: {show}]"
    if not (show or ctx.show_default) or not hasattr(param, "_extract_default_help_str"):
        return None
    value = param._extract_default_help_str(ctx=ctx)
    if value is None:
        return None
    said = param._get_default_string(ctx=ctx, show_default_is_str=False, default_value=value)
    return f"[default: {said}]" if said else None


def _row(ctx: Any, param: Any) -> tuple[str, str]:
    help_ = getattr(param, "help", None) or ""
    if param.param_type_name == "argument":
        name = str(param.metavar or param.name.upper())
        name += "" if param.nargs == 1 or name.endswith("...") else "..."
    else:
        name = ", ".join(sorted(param.opts, key=len))
        name += "".join(f" / {o}" for o in param.secondary_opts)
        metavar = param.display_type_rich(ctx) if hasattr(param, "display_type_rich") else None
        name += f" {metavar}" if metavar else ""
    more = [_default(ctx, param) or "", "[required]" if param.required and param.param_type_name == "option" else ""]
    return name, " ".join([help_, *(m.replace("[", "\\[") for m in more if m)]).strip()


def parameters(ctx: Any, command: Any, wide: int) -> list[str]:
    """Arguments, options and the panels typer shows them in, in that order."""
    panels: dict[str, list[tuple[str, str]]] = {"Arguments": [], "Options": []}
    for param in command.get_params(ctx):
        if getattr(param, "hidden", False):
            continue
        default = "Arguments" if param.param_type_name == "argument" else "Options"
        panels.setdefault(getattr(param, "rich_help_panel", None) or default, []).append(_row(ctx, param))
    column = columns(name for rows in panels.values() for name, _ in rows)  # one column for every panel
    out: list[str] = []
    for panel, rows in panels.items():
        if rows:
            out += ["", f"{panel}:", *table(rows, wide, column)]
    return out


def summary(command: Any) -> str:
    tidy(command)
    return (command.help or "").split("\n\n")[0]


def plain(ctx: Any, command: Any, rows: dict[str, list[Any]] | None = None) -> str:
    """`command`'s help as plain text; the top's commands in its panels (`rows`), a noun's verbs under Commands."""
    tidy(command)
    wide = width()
    out = [f"Usage: {' '.join([ctx.command_path, *command.collect_usage_pieces(ctx)])}"]
    out += described(command.help or "", wide)
    out += parameters(ctx, command, wide)
    if rows is None and hasattr(command, "commands"):
        verbs = [(n, command.get_command(ctx, n)) for n in command.list_commands(ctx)]
        rows = {"Commands": [v for _, v in verbs if v is not None and not v.hidden]}
    listed = {
        panel: [(str(c.name).replace(",\n", ", "), rendered(summary(c).replace("`", ""))) for c in commands]
        for panel, commands in (rows or {}).items()
    }
    column = columns(name for found in listed.values() for name, _ in found)  # one column for every panel
    for panel, found in listed.items():
        out += ["", f"{panel}:", *table(found, wide, column)]
    if command.epilog:
        out += ["", *prose(command.epilog, wide)]
    return "\n".join(out) + "\n"
