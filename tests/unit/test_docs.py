"""README, CHANGELOG and every page under docs/ hold together: every relative link and `#anchor` resolves to a file
and a heading there, every path of this repository a page names in backticks exists, and every `vmsandbox …` a
page shows is a command of the grammar. The site builds with `mkdocs build --strict` (in-process, no network: a
broken link, anchor or nav entry fails it), its command reference names every command, and the README starts a
person: short, no dated figure, one command a line. Files only."""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import logging
import re
import tomllib
from collections.abc import Callable
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = [README, ROOT / "CHANGELOG.md", *sorted(DOCS.rglob("*.md"))]
# Pages for people using vmsandbox: what to do and what happens, never how it was measured or when (figures and
# history live in development.md and CHANGELOG.md; security.md may explain with them).
EXPLAINED = {"development.md", "security.md"}
USER_PAGES = [README, *(p for p in sorted(DOCS.rglob("*.md")) if p.name not in EXPLAINED)]
README_LINES = 150
README_WIDTH = 120

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_LINK = re.compile(r"""<(?:a|img)\b[^>]*?\b(?:href|src)=["']([^"']+)["']""", re.IGNORECASE)
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"""<a\s+(?:name|id)=["']([^"']+)["']""", re.IGNORECASE)
# A path of this repository in backticks: starts at one of its top-level directories.
REPO_PATH = re.compile(r"^(vmsandbox|tests|bench|docs|images)/[\w./-]*$")  # (not `scripts/`: a project's)
# A figure with its day, or the words that introduce one: history, for development.md and the changelog.
DATED = re.compile(r"\b(?:19|20)\d\d-[01]\d-[0-3]\d\b|\bmeasured on\b", re.IGNORECASE)
SHELL_BLOCK = re.compile(r"^\s*(?:```|~~~)\s*(sh|bash|shell)\s*$")
PIPE_TARGETS = frozenset({"cat", "less", "more", "head", "tail", "grep", "jq", "wc", "sort", "tee", "sh", "bash"})


@cache
def _hook() -> ModuleType:
    """docs/hooks/reference.py, the MkDocs hook that makes the command reference (not a package: loaded by path)."""
    spec = importlib.util.spec_from_file_location("docs_reference_hook", DOCS / "hooks" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _reference() -> str:
    return str(_hook().render())


# Pages the site's build makes (no file of the repository): their text, made as the build makes it.
GENERATED: dict[Path, Callable[[], str]] = {DOCS / "reference.md": _reference}


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else page.name


def _text(page: Path) -> str:
    return GENERATED[page]() if page in GENERATED else page.read_text()


def _prose(page: Path) -> list[tuple[int, str]]:
    """The page's lines outside fenced code blocks, numbered."""
    lines, fenced = [], False
    for n, line in enumerate(_text(page).splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((n, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text (code, links and emphasis as their words), lower case, every
    character but letters, digits, spaces, `-` and `_` dropped, spaces as `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its words
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"(?<!\w)_+|_+(?!\w)", "", text)  # _emphasis_, not snake_case
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    for _, line in _prose(page):
        found.update(HTML_ANCHOR.findall(line))
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        name, i = base, 0
        while name in found:  # a heading's second use gets -1, its third -2
            i += 1
            name = f"{base}-{i}"
        found.add(name)
    return found


def _targets(page: Path) -> list[tuple[int, str]]:
    out = []
    for n, line in _prose(page):
        text = CODE_SPAN.sub("", line)  # `[a](b)` in code is not a link
        out += [(n, t) for t in LINK.findall(text) + HTML_LINK.findall(text)]
    return out


def broken_links(page: Path) -> list[str]:
    wrong = []
    for n, target in _targets(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # https:, mailto: ...: not checked here
            continue
        path, _, anchor = target.partition("#")
        where = page if not path else (page.parent / path)
        if not where.exists() and where.resolve() not in GENERATED:
            wrong.append(f"{_name(page)}:{n}: {target}: no such file")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where.resolve()):
            wrong.append(f"{_name(page)}:{n}: {target}: no heading #{anchor} in {where.name}")
    return wrong


def stale_paths(page: Path) -> list[str]:
    wrong = []
    for n, line in _prose(page):
        for _, span in CODE_SPAN.findall(line):
            path = span.strip().rstrip(".,:;")
            if REPO_PATH.match(path) and "*" not in path and not (ROOT / path).exists():
                wrong.append(f"{_name(page)}:{n}: `{span}`: no such file or directory")
    return wrong


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    assert broken_links(page) == []


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_path_of_the_repository_a_page_names_exists(page: Path) -> None:
    assert stale_paths(page) == []


def test_anchors_are_githubs(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text(
        "# Install (a fresh Debian 12 / Ubuntu machine)\n"
        "## `run` and `fanout`: options\n"
        "## Checkpoints, rollback, forks, fan-out\n"
        "## The [guide](guide.md) in depth\n"
        "## max_sessions and _why_\n"
        "## Again\n## Again\n"
        "```\n# not a heading\n```\n"
    )
    assert anchors(page) == {
        "install-a-fresh-debian-12--ubuntu-machine",
        "run-and-fanout-options",
        "checkpoints-rollback-forks-fan-out",
        "the-guide-in-depth",
        "max_sessions-and-why",
        "again",
        "again-1",
    }


def test_the_checker_finds_a_missing_file_a_missing_heading_and_a_stale_path(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# There\n")
    page = tmp_path / "p.md"
    page.write_text(
        "# Here\n"
        "[ok](other.md#there) [self](#here) [web](https://example.com/x) `[code](nope.md)`\n"
        "[gone](missing.md) [no heading](other.md#elsewhere) ![img](shot.png) [self](#nowhere)\n"
        "```\n[fenced](nope.md)\n```\n"
    )
    assert [w.split(": ", 1)[1] for w in broken_links(page)] == [
        "missing.md: no such file",
        "other.md#elsewhere: no heading #elsewhere in other.md",
        "shot.png: no such file",
        "#nowhere: no heading #nowhere in p.md",
    ]


def test_a_link_into_the_generated_reference_is_checked_against_its_headings(tmp_path: Path) -> None:
    page = DOCS / "a-page-of-this-test.md"  # (never written: its links are all the checker reads)
    lines = ["[run](reference.md#vmsandbox-run)", "[gone](reference.md#vmsandbox-frobnicate)"]
    found = [w.split(": ", 1)[1] for w in _broken_links_of(page, lines)]
    assert found == ["reference.md#vmsandbox-frobnicate: no heading #vmsandbox-frobnicate in reference.md"]


def _broken_links_of(page: Path, lines: list[str]) -> list[str]:
    GENERATED[page] = lambda: "\n".join(lines)
    try:
        return broken_links(page)
    finally:
        del GENERATED[page]


# A command line a page shows: `vmsandbox WORD…` in a code span or a fenced block (prose says "vmsandbox keeps").
COMMAND_LINE = re.compile(r"(?:^|[\s`(;|&$])vmsandbox((?:\s+[^\s`;|&)<>]+)*)")
PLACEHOLDER = re.compile(r"\[.*|[A-Z][A-Z0-9_:.]*")  # `[OPTIONS]`, `NAME`, `COMMAND...`: what a person fills in


def _code(page: Path) -> list[tuple[int, str]]:
    """The page's code: fenced lines whole, and each code span of the other lines."""
    found, fenced = [], False
    for n, line in enumerate(_text(page).splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif fenced:
            found.append((n, line))
        else:
            found += [(n, span) for _, span in CODE_SPAN.findall(line)]
    return found


def unknown_commands(page: Path, root: Any) -> list[str]:
    """Each `vmsandbox …` a page shows whose command (and a noun's verb) is not one of the grammar — a page
    teaches the grammar as it is — or that names an option its command does not take."""
    wrong = []
    for n, code in _code(page):
        for m in COMMAND_LINE.finditer(code):
            words = m.group(1).split()
            words = words[: words.index("--")] if "--" in words else words
            words = [*itertools.takewhile(lambda w: not w.startswith("#"), words)]  # a shell comment after it
            command, path = root, list[str]()
            for word in words:
                if word.startswith("-"):
                    name = word.split("=", 1)[0]
                    options = {o for p in command.params for o in [*p.opts, *p.secondary_opts]}
                    if name.startswith("--") and name not in options | {"--help"}:
                        wrong.append(f"{_name(page)}:{n}: `vmsandbox {' '.join(path)} {name}`: no such option")
                    continue
                if not hasattr(command, "commands") or PLACEHOLDER.fullmatch(word):
                    break  # (`vmsandbox checkpoint [OPTIONS] COMMAND`: a usage line names no verb)
                if word not in command.commands:
                    if command is not root or re.fullmatch(r"[a-z][a-z-]*", word):
                        kind = "command" if command is root else "verb"
                        wrong.append(f"{_name(page)}:{n}: `vmsandbox {' '.join([*path, word])}`: no such {kind}")
                    break
                command, path = command.commands[word], [*path, word]
    return wrong


def _command_tree() -> Any:
    import typer.main

    from vmsandbox.cli import base, main  # noqa: F401  (main registers the commands)

    return typer.main.get_command(base.app)


@pytest.mark.parametrize("page", [*PAGES, *GENERATED], ids=_name)
def test_every_command_a_page_shows_is_one_of_the_grammar(page: Path) -> None:
    assert unknown_commands(page, _command_tree()) == []


def test_the_command_checker_finds_an_old_name_a_missing_verb_and_an_option(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text(
        "Run `vmsandbox run . -- make --frob` then `vmsandbox shell exp -w /src`; vmsandbox says so.\n"
        "`vmsandbox destroy exp` and `vmsandbox checkpoint exp before` and `vmsandbox ls --bogus`\n"
        "```\n$ vmsandbox checkpoint restore exp before\nvmsandbox port ls exp | cat\n```\n"
        "`vmsandbox image` `vmsandbox policy frob x` `vmsandbox help checkpoint`\n"
        "```\nvmsandbox checkpoint [OPTIONS] COMMAND [ARGS]...\nvmsandbox port NAME\n```\n"
    )
    assert [w.split(": ", 1)[1] for w in unknown_commands(page, _command_tree())] == [
        "`vmsandbox destroy`: no such command",
        "`vmsandbox checkpoint exp`: no such verb",
        "`vmsandbox ls --bogus`: no such option",
        "`vmsandbox policy frob`: no such verb",
    ]


# The site.


def test_the_site_builds_strictly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any) -> None:
    """`mkdocs build --strict`, as `mkdocs build` runs it, into a tmp dir: a broken link or anchor, a page the
    nav leaves out or names without it existing, a hook that fails, each fails the build."""
    from mkdocs.commands.build import build
    from mkdocs.config import load_config
    from mkdocs.exceptions import Abort

    monkeypatch.setenv("NO_MKDOCS_2_WARNING", "1")  # (Material's notice of its successor)
    monkeypatch.chdir(ROOT)
    config = load_config(str(ROOT / "mkdocs.yml"), strict=True, site_dir=str(tmp_path / "site"))
    with caplog.at_level(logging.WARNING, logger="mkdocs"), contextlib.suppress(Abort):  # (strict: see below)
        build(config)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert (tmp_path / "site" / "reference" / "index.html").is_file()


def test_the_site_loads_nothing_from_elsewhere() -> None:
    """No plugin that fetches at build time (only MkDocs' own search), and no web font a page would fetch."""
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert set(config.get("plugins", ["search"])) <= {"search"}
    assert config["theme"]["font"] is False


def test_every_page_is_in_the_nav() -> None:
    import yaml

    def pages(entries: Any) -> list[str]:
        if isinstance(entries, str):
            return [entries]
        if isinstance(entries, dict):
            return [p for v in entries.values() for p in pages(v)]
        return [p for e in entries for p in pages(e)]

    nav = pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    on_disk = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")} | {str(p.relative_to(DOCS)) for p in GENERATED}
    assert sorted(on_disk - set(nav)) == []
    assert sorted(set(nav) - on_disk) == []


def test_the_reference_names_every_command_and_each_option() -> None:
    import typer

    text = _reference()
    headings = {m.group(2) for m in map(HEADING.match, text.splitlines()) if m}
    root = _command_tree()

    def walk(command: Any, ctx: Any) -> list[tuple[str, Any]]:
        found = []
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is None or sub.hidden:
                continue
            sub_ctx = typer.Context(sub, info_name=name, parent=ctx)
            found.append((sub_ctx.command_path, sub))
            if hasattr(sub, "commands"):
                found += walk(sub, sub_ctx)
        return found

    commands = walk(root, typer.Context(root, info_name="vmsandbox"))
    assert {"vmsandbox run", "vmsandbox checkpoint restore", "vmsandbox config trust add"} <= {p for p, _ in commands}
    assert sorted(p for p, _ in commands if p not in headings) == []
    for path, command in commands:
        found = re.search(rf"^#+ {re.escape(path)}\n(.*?)(?=^#+ vmsandbox |\Z)", text, re.MULTILINE | re.DOTALL)
        assert found is not None, path
        section = found.group(1)
        for option in (p for p in command.params if p.param_type_name == "option" and not p.hidden):
            assert f"`{', '.join([*option.opts, *option.secondary_opts])}" in section, (path, option.opts)


def test_the_reference_keeps_help_text_literal() -> None:
    """Help text is escaped where Markdown would read it as markup; code spans and examples stay as typed."""
    hook = _hook()
    assert hook._text("HOST, *.DOMAIN or [HOST_PORT:]PORT; `a*b_c` \\[default: 2G]") == (
        "HOST, \\*.DOMAIN or \\[HOST\\_PORT:\\]PORT; `a*b_c` \\[default: 2G\\]"
    )
    lines = hook._help("Say it.\n\nExamples:\n\n`vmsandbox ls -q`\n\n`vmsandbox rm x` (its `outbox` kept)\n\nDone.")
    assert lines == [
        "Say it.",
        "",
        "Examples:",
        "",
        "```sh",
        "vmsandbox ls -q",
        "vmsandbox rm x  # its outbox kept",
        "```",
        "",
        "Done.",
        "",
    ]


# The README: a start, not a diary.


def _shell_lines(page: Path) -> list[tuple[int, str]]:
    """The lines of the page's sh/bash code blocks (what a person pastes into a shell)."""
    found, inside, fenced = [], False, False
    for n, line in enumerate(_text(page).splitlines(), 1):
        if FENCE.match(line):
            inside = not fenced and bool(SHELL_BLOCK.match(line))
            fenced = not fenced
        elif inside:
            found.append((n, line))
    return found


def operators(line: str) -> list[tuple[str, str]]:
    """The shell's control operators on a line (`|`, `||`, `&&`, `;`) outside quotes and comments, each with the
    word after it."""
    found, quote, i = [], "", 0
    while i < len(line):
        c = line[i]
        if quote:
            if c == quote:
                quote = ""
            elif c == "\\" and quote == '"':
                i += 1
        elif c in "'\"":
            quote = c
        elif c == "\\":
            i += 1
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            break
        elif line.startswith(("&&", "||"), i) or c in "|;":
            op = line[i : i + 2] if line.startswith(("&&", "||"), i) else c
            rest = line[i + len(op) :].split()
            found.append((op, rest[0] if rest else ""))
            i += len(op) - 1
        i += 1
    return found


def one_command_a_line(page: Path) -> list[str]:
    """Lines of shell blocks that are not one command: joined by `;`, `&&` or `||`, or a `|` that means "or"
    (`ls [-q | --json]`, `stop exp1 | stop --all`) where a pipe into a real command (`| less`) is one."""
    wrong = []
    for n, line in _shell_lines(page):
        for op, after in operators(line):
            if op != "|" or after not in PIPE_TARGETS:
                wrong.append(f"{_name(page)}:{n}: `{op} {after}`".rstrip())
    return wrong


@pytest.mark.parametrize("page", [p for p in PAGES if p.name != "CHANGELOG.md"], ids=_name)
def test_every_shell_block_holds_one_command_a_line(page: Path) -> None:
    assert one_command_a_line(page) == []


def test_the_shell_checker_tells_an_or_from_a_pipe(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text(
        "```sh\n"
        "vmsandbox ls [-q | --json]\n"
        "vmsandbox stop exp1 | stop --all\n"
        "vmsandbox doctor | less\n"
        "vmsandbox run . -- sh -c 'make && make test | tee log'   # a comment; with | in it\n"
        "cd x && make\n"
        'eval "$(vmsandbox serve --env)"\n'
        "```\n"
        "```console\n$ a | b\n```\n"
    )
    assert [w.split(": ", 1)[1] for w in one_command_a_line(page)] == ["`| --json]`", "`| stop`", "`&& make`"]


def test_the_readme_is_short() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= README_LINES
    assert [n for n, line in enumerate(lines, 1) if len(line) > README_WIDTH] == []


@pytest.mark.parametrize("page", USER_PAGES, ids=_name)
def test_a_users_page_holds_no_dated_figure(page: Path) -> None:
    found = [(n, m.group(0)) for n, line in enumerate(page.read_text().splitlines(), 1) for m in DATED.finditer(line)]
    assert found == []


def test_the_readme_starts_with_a_clone_of_the_projects_address() -> None:
    """The address is defined once, in pyproject.toml; the README's first command clones exactly it, and its
    install gives the commands the CI and a person run: `make run`, `make test`, `vmsandbox doctor`."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        urls = tomllib.load(f)["project"]["urls"]
    commands = [line.strip() for _, line in _shell_lines(README)]
    assert commands[0] == f"git clone {urls['Homepage']}"
    assert urls["Documentation"].startswith(urls["Homepage"])
    assert {"make run", "make test", "vmsandbox doctor", "sudo vmsandbox host setup", "vmsandbox claude ."} <= set(
        commands
    )
    assert "make test" in (ROOT / ".ci" / "run").read_text()
