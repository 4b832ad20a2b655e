"""README and docs/ hold together: every relative link and `#anchor` resolves to a file and a heading there, and
every path of this repository a page names in backticks exists. Files only, no network."""

from __future__ import annotations

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
