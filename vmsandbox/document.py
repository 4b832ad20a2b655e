"""A YAML file people write, read without stopping at its first problem: a syntax error at the line that holds
it, every key given twice, and the line of any key or entry (`hosts[0].colour`), so that every problem found in
the file — here, in its shape (schema.py) or in its values — is said at once, each at its own line with its own
hint (FileError)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from vmsandbox.errors import VmsandboxError

Loc = tuple[str | int, ...]  # the way to a key or an entry in a document: ("hosts", 0, "colour")


@dataclass(frozen=True)
class Problem:
    """One thing wrong in a file: what (naming the key, as `hosts[0]`: …), where, and what fixes it."""

    text: str
    at: Loc = ()
    hint: str | None = None
    line: int | None = None  # found from `at` once the file's document is known (Document.placed)
    column: int | None = None

    def where(self) -> str:
        if self.line is None:
            return ""
        return f"line {self.line}" + ("" if self.column is None else f", column {self.column}")


class FileError(VmsandboxError):
    """Everything wrong with one file, in the order of its lines: one problem reads `FILE, line N: what` with
    its hint; more read `FILE: N problems:` and a line each, its hint under it."""

    def __init__(self, source: str, problems: Iterable[Problem]) -> None:
        self.source = source
        self.problems = sorted(problems, key=lambda p: (p.line is None, p.line or 0))
        if len(self.problems) == 1:
            (one,) = self.problems
            super().__init__(f"{source}{', ' + one.where() if one.line else ''}: {one.text}", hint=one.hint)
            return
        body = "".join(
            f"\n  {p.where() + ': ' if p.line else ''}{p.text}" + (f"\n      hint: {p.hint}" if p.hint else "")
            for p in self.problems
        )
        super().__init__(f"{source}: {len(self.problems)} problems:{body}")

    def brief(self) -> str:
        """The problems in one line: the one, or how many and the first."""
        if len(self.problems) == 1:
            return self.message
        first = self.problems[0]
        where = f" at {first.where()}" if first.line else ""
        return f"{self.source}: {len(self.problems)} problems, the first{where}: {first.text}"


def did_you_mean(word: str, names: Iterable[str]) -> str:
    """` (did you mean `NAME`?)` for the name nearest a misspelt one, or nothing when none is near."""
    near = difflib.get_close_matches(word, list(names), n=1, cutoff=0.6)
    return f" (did you mean `{near[0]}`?)" if near else ""


def refused(exc: VmsandboxError, source: str, at: Loc) -> list[Problem]:
    """A check's error about the value at `at` of the file `source` (its message starting `source: `) as the
    problems it says; the line is that of the first key the message names inside `at` when there is one."""
    if isinstance(exc, FileError):  # a check of an entry's shape: `FILE: `secrets[0]``
        inside = exc.source.removeprefix(f"{source}: ")
        return [replace(p, text=f"{inside}: {p.text}", at=at + p.at) for p in exc.problems]
    text = exc.message.removeprefix(f"{source}: ")
    named = re.match(r"`[^`]+`: `(\w+)`", text)  # `secrets[0]`: `host`: …
    return [Problem(text, (*at, named.group(1)) if named else at, exc.hint)]


@dataclass(frozen=True)
class Document:
    """A YAML document as read: its data (None if it could not be read as a mapping), what was wrong in reading
    it, and its nodes (for the line of any key)."""

    source: str
    data: dict[str, Any] | None
    problems: tuple[Problem, ...] = ()
    node: yaml.Node | None = None

    def line(self, at: Loc) -> int | None:
        """The line of the key or entry at `at` (of the nearest one above it that is there)."""
        node, line = self.node, None
        for part in at:
            if isinstance(part, str) and isinstance(node, yaml.MappingNode):
                pair = next((p for p in reversed(node.value) if _is_key(p[0], part)), None)
                if pair is None:
                    break
                line, node = pair[0].start_mark.line + 1, pair[1]
            elif isinstance(part, int) and isinstance(node, yaml.SequenceNode) and 0 <= part < len(node.value):
                node = node.value[part]
                line = node.start_mark.line + 1
            else:
                break
        return line

    def placed(self, problems: Iterable[Problem]) -> list[Problem]:
        """The problems, each with its line."""
        return [p if p.line is not None or not p.at else replace(p, line=self.line(p.at)) for p in problems]

    def fail(self, problems: Sequence[Problem] = ()) -> None:
        """Raise FileError with the document's own problems and `problems`, if there are any."""
        found = [*self.problems, *self.placed(problems)]
        if found:
            raise FileError(self.source, found)


def _is_key(node: yaml.Node, name: str) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.value == name


def read(raw: bytes, source: str) -> Document:
    """A YAML document from bytes, never raising for what is in them: a syntax error, a key given twice or a
    top level that is not a mapping are the document's problems. An empty document is an empty mapping."""
    loader = yaml.SafeLoader(raw)
    try:
        node = loader.get_single_node()
        data = None if node is None else loader.construct_document(node)
    except yaml.reader.ReaderError as exc:  # a byte YAML never takes (control characters, bad UTF-8)
        line = raw[: exc.position].count(b"\n") + 1
        said = f"not valid YAML: {exc.reason} (character {exc.character!r})"
        return Document(source, None, (Problem(said, hint="remove that character", line=line),))
    except yaml.MarkedYAMLError as exc:
        return Document(source, None, (_syntax(exc, raw),))
    except yaml.YAMLError as exc:
        return Document(source, None, (Problem(f"not valid YAML: {exc}", hint="fix the syntax", line=1),))
    finally:
        loader.dispose()
    if data is None:
        return Document(source, {}, (), node)
    if not isinstance(data, dict):
        top = Problem("the top level must be a mapping of keys to values", hint="write `key: value` lines", line=1)
        return Document(source, None, (top,), node)
    return Document(source, data, tuple(_twice(node)) if node is not None else (), node)


def _syntax(exc: yaml.MarkedYAMLError, raw: bytes) -> Problem:
    """A syntax error at the line that holds it. A scanner's error is about a token begun earlier (a quote
    never closed, a key without its colon): the token's line. A parser's error found at the end of the text
    or on a blank line is about what came before: the line where that began, or the last line with text."""
    mark, context = exc.problem_mark, exc.context_mark
    lines = raw.decode(errors="replace").split("\n")

    def blank(i: int) -> bool:
        return i >= len(lines) or not lines[i].split("#", 1)[0].strip()

    line, column = (mark.line, mark.column) if mark is not None else (0, 0)
    problem = str(exc.problem or exc).replace("'<stream end>'", "the end of the file")
    said = "not valid YAML: " + problem.replace("unexpected end of stream", "the end of the file")
    if context is not None and context.line < line and (isinstance(exc, yaml.scanner.ScannerError) or blank(line)):
        line, column = context.line, context.column
        said += f" ({exc.context})" if exc.context else ""
    elif blank(line):
        line = max((i for i in range(min(line, len(lines))) if not blank(i)), default=0)
        column = len(lines[line].rstrip()) if line < len(lines) else 0
    elif exc.context and context is not None and context.line < line:
        said += f" ({exc.context} on line {context.line + 1})"
    hint = "indent with spaces, not tabs" if "'\\t'" in str(exc.problem) else "fix the syntax on that line"
    return Problem(said, hint=hint, line=line + 1, column=column + 1)


def _twice(node: yaml.Node, at: Loc = (), seen: set[int] | None = None) -> Iterator[Problem]:
    """A problem for each key given twice in one mapping (YAML itself keeps the last one silently)."""
    seen = set() if seen is None else seen
    if id(node) in seen:  # an alias: walked once
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first: dict[str, int] = {}
        inside = f"`{key_path(at)}`: " if at else ""
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else None
            if name is not None and name in first:
                yield Problem(
                    f"{inside}the key `{name}` is given twice (first on line {first[name]})",
                    (*at, name),
                    hint="keep one of them",
                    line=key.start_mark.line + 1,
                )
            elif name is not None:
                first[name] = key.start_mark.line + 1
            yield from _twice(value, (*at, name if name is not None else "?"), seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            yield from _twice(item, (*at, i), seen)


def key_path(at: Loc) -> str:
    """A way into a document as a file's reader writes it: `hosts[0].colour`."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in at).lstrip(".")


def parse_yaml(raw: bytes, source: str) -> dict[str, Any]:
    """A YAML mapping from bytes ({} for an empty document); FileError for whatever reading it found."""
    doc = read(raw, source)
    doc.fail()  # no data comes only with a problem
    return doc.data or {}


def load_yaml(path: Path) -> dict[str, Any]:
    """A YAML mapping from path ({} for an empty file)."""
    return parse_yaml(read_bytes(path), str(path))


def read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise VmsandboxError(f"cannot read {path}: {exc.strerror}") from exc
