"""README and docs/ hold together: every relative link and `#anchor` resolves to a file and a heading there, and
every path of this repository a page names in backticks exists. Files only, no network."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_LINK = re.compile(r"""<(?:a|img)\b[^>]*?\b(?:href|src)=["']([^"']+)["']""", re.IGNORECASE)
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"""<a\s+(?:name|id)=["']([^"']+)["']""", re.IGNORECASE)
# A path of this repository in backticks: starts at one of its top-level directories.
REPO_PATH = re.compile(r"^(vmsandbox|tests|bench|docs|images)/[\w./-]*$")  # (not `scripts/`: a project's)


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else page.name


def _prose(page: Path) -> list[tuple[int, str]]:
    """The page's lines outside fenced code blocks, numbered."""
    lines, fenced = [], False
    for n, line in enumerate(page.read_text().splitlines(), 1):
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
        if not where.exists():
            wrong.append(f"{_name(page)}:{n}: {target}: no such file")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
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


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    assert broken_links(page) == []


MOVED: dict[str, str] = {}  # a page known to name a moved path, with why (drop the entry once mended)


def _moved(page: Path) -> Any:
    if page.name not in MOVED:
        return page
    return pytest.param(page, marks=pytest.mark.xfail(reason=MOVED[page.name], strict=True))


@pytest.mark.parametrize("page", [_moved(p) for p in PAGES], ids=lambda p: p.name)
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


# A command line a page shows: `vmsandbox WORD…` in a code span or a fenced block (prose says "vmsandbox keeps").
COMMAND_LINE = re.compile(r"(?:^|[\s`(;|&$])vmsandbox((?:\s+[^\s`;|&)<>]+)*)")


def _code(page: Path) -> list[tuple[int, str]]:
    """The page's code: fenced lines whole, and each code span of the other lines."""
    found, fenced = [], False
    for n, line in enumerate(page.read_text().splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif fenced:
            found.append((n, line))
        else:
            found += [(n, span) for _, span in CODE_SPAN.findall(line)]
    return found


def unknown_commands(page: Path, root: Any) -> list[str]:
    """Each `vmsandbox …` a page shows whose command (and a noun's verb) is not one of the grammar — an old name
    works, but says its new form: a page teaches the new — or that names an option its command does not take."""
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
                if not hasattr(command, "commands"):
                    break
                if word not in command.commands:
                    if command is not root or re.fullmatch(r"[a-z][a-z-]*", word):  # not `vmsandbox [OPTIONS]`
                        kind = "command" if command is root else "verb"
                        wrong.append(f"{_name(page)}:{n}: `vmsandbox {' '.join([*path, word])}`: no such {kind}")
                    break
                command, path = command.commands[word], [*path, word]
    return wrong


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_command_a_page_shows_is_one_of_the_grammar(page: Path) -> None:
    import typer.main

    from vmsandbox.cli import base, main  # noqa: F401  (main registers the commands)

    assert unknown_commands(page, typer.main.get_command(base.app)) == []


def test_the_command_checker_finds_an_old_name_a_missing_verb_and_an_option(tmp_path: Path) -> None:
    import typer.main

    from vmsandbox.cli import base, main  # noqa: F401  (main registers the commands)

    page = tmp_path / "p.md"
    page.write_text(
        "Run `vmsandbox run . -- make --frob` then `vmsandbox shell exp -w /src`; vmsandbox says so.\n"
        "`vmsandbox destroy exp` and `vmsandbox checkpoint exp before` and `vmsandbox ls --bogus`\n"
        "```\n$ vmsandbox checkpoint restore exp before\nvmsandbox port ls exp | cat\n```\n"
        "`vmsandbox image` `vmsandbox policy frob x` `vmsandbox help checkpoint`\n"
    )
    assert [w.split(": ", 1)[1] for w in unknown_commands(page, typer.main.get_command(base.app))] == [
        "`vmsandbox destroy`: no such command",
        "`vmsandbox checkpoint exp`: no such verb",
        "`vmsandbox ls --bogus`: no such option",
        "`vmsandbox policy frob`: no such verb",
    ]
