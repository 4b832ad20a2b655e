"""MkDocs hook: the command reference, made from vmsandbox's own command tree each time the site is built, so it
cannot drift from the CLI (no copy of it is committed); and the project's URL, read from pyproject.toml, where it
is defined once.

`render()` is the page: for each command, in the order `vmsandbox -h` lists them (a noun's verbs under it), its
usage line, its help as `vmsandbox COMMAND -h` gives it, its arguments and its options. Hidden commands are left
out. tests/unit/test_docs.py checks links into it against the same text."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PAGE = "reference.md"  # under docs/, generated: never a file of the repository
TITLE = "Command reference"

CODE_SPAN = re.compile(r"(`+)(.+?)\1")
MARKDOWN = re.compile(r"([\\*_\[\]<>|])")  # what Markdown would read as markup in help text


def project_urls() -> dict[str, str]:
    """[project.urls] of pyproject.toml: where the project lives (Homepage) and its docs (Documentation)."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        urls: dict[str, str] = tomllib.load(f)["project"]["urls"]
    return urls


def _text(help_text: str) -> str:
    """Help text as Markdown: code spans kept as they are, everything else escaped (`*.DOMAIN`, `[default: …]`);
    the escapes of the help's own markup (`\\[`) dropped first."""
    plain = help_text.replace("\\[", "[")
    out, at = [], 0
    for m in CODE_SPAN.finditer(plain):
        out += [MARKDOWN.sub(r"\\\1", plain[at : m.start()]), m.group(0)]
        at = m.end()
    out.append(MARKDOWN.sub(r"\\\1", plain[at:]))
    return "".join(out)


EXAMPLE = re.compile(r"`([^`]+)`(?:\s*\((.*)\))?")  # `vmsandbox …` (what it does)


def _paragraphs(help_text: str) -> list[str]:
    return [" ".join(line.strip() for line in p.splitlines()) for p in re.split(r"\n\s*\n", help_text.strip())]


def _help(help_text: str) -> list[str]:
    """A command's help as Markdown lines: its paragraphs, and its examples (`Examples:`, then one a paragraph) as
    a block of command lines, each with what it does as a comment."""
    lines: list[str] = []
    examples: list[str] | None = None
    for paragraph in _paragraphs(help_text):
        found = EXAMPLE.fullmatch(paragraph) if examples is not None else None
        if found is not None and examples is not None:
            comment = found.group(2)
            examples.append(found.group(1) + (f"  # {comment.replace('`', '')}" if comment else ""))
            continue
        if examples:
            lines += ["```sh", *examples, "```", ""]
        examples = [] if paragraph in ("Example:", "Examples:") else None
        lines += [_text(paragraph), ""]
    if examples:
        lines += ["```sh", *examples, "```", ""]
    return lines


def _commands(command: Any, ctx: Any) -> Iterator[tuple[Any, Any]]:
    """Every command below `command` that is not hidden, with its context, depth first in the help's order."""
    import typer

    for name in command.list_commands(ctx):
        sub = command.get_command(ctx, name)
        if sub is None or sub.hidden:
            continue
        sub_ctx = typer.Context(sub, info_name=name, parent=ctx)
        yield sub, sub_ctx
        if hasattr(sub, "commands"):
            yield from _commands(sub, sub_ctx)


def _param(param: Any, ctx: Any) -> str:
    if param.param_type_name == "argument":
        name = param.make_metavar(ctx) if not param.metavar else param.metavar
    else:
        names = ", ".join([*param.opts, *param.secondary_opts])
        name = names if param.is_flag or param.count else f"{names} {param.metavar or param.make_metavar(ctx)}"
    help_text = " ".join(_paragraphs(param.help or ""))
    return f"- `{name}`" + (f": {_text(help_text)}" if help_text else "")


def section(command: Any, ctx: Any) -> str:
    """One command's part of the page."""
    level = "#" * min(ctx.command_path.count(" ") + 1, 4)
    usage = " ".join([ctx.command_path, *command.collect_usage_pieces(ctx)])
    lines = [f"{level} {ctx.command_path}", "", "```", usage, "```", ""]
    lines += _help(command.help or "")
    arguments = [p for p in command.params if p.param_type_name == "argument"]
    options = [p for p in command.params if p.param_type_name == "option" and not getattr(p, "hidden", False)]
    if arguments:
        lines += ["Arguments:", "", *[_param(p, ctx) for p in arguments], ""]
    if options:
        lines += ["Options:", "", *[_param(p, ctx) for p in options], "- `-h, --help`: Show the help and exit.", ""]
    return "\n".join(lines)


def render() -> str:
    """The whole page, from the command tree as it is now."""
    import typer
    import typer.main

    from vmsandbox import __version__
    from vmsandbox.cli import base, main  # noqa: F401  (main registers every command on the app)

    root = typer.main.get_command(base.app)
    ctx = typer.Context(root, info_name="vmsandbox")
    head = [
        f"# {TITLE}",
        "",
        f"Every command of vmsandbox {__version__}, as its `-h` describes it: this page is made from the",
        "command tree itself each time the site is built. `vmsandbox help COMMAND` (or `vmsandbox COMMAND -h`)",
        "prints the same at the terminal.",
        "",
        "The options every command takes: `-v, --verbose` (log every step and command to stderr; anywhere on the",
        "line but in the guest's command) and `-h, --help`. `vmsandbox --version` prints the version.",
        "",
    ]
    return "\n".join([*head, *(section(c, c_ctx) for c, c_ctx in _commands(root, ctx))])


def on_config(config: Any) -> Any:
    """The repository's address for the site's header, from pyproject.toml (unless mkdocs.yml names one)."""
    if not config.repo_url:
        config.repo_url = project_urls()["Homepage"]
    return config


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=render()))
    return files
