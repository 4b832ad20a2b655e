"""A --format text as tokens: text between actions, and in each `{{ }}` its words, each token at its offset in the
text as given (errors point at it). `{{- ` and ` -}}` trim the white space beside them, as Go's do; `\\t` and `\\n`
written in the text between actions are a tab and a newline (docker's rule: a shell passes them as written)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Any

SUBSET = (
    "{{.Field}} (and .A.B), {{.}}, {{json .}}, `table`, {{if}}/{{else if}}/{{else}}/{{end}}, {{range}}/{{else}}/"
    "{{end}}, pipes (|), {{- and -}}, {{/* comments */}}, and the functions json, upper, lower, join, printf, "
    "len, index, eq, ne, not, and, or"
)
SPACE = " \t\r\n"
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
FIELD = re.compile(r"(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
NUMBER = re.compile(r"[+-]?(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)")
ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}
HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}


class Kind(Enum):
    TEXT = "text"
    OPEN = "{{"
    CLOSE = "}}"
    FIELD = "field"
    DOT = "."
    NAME = "name"
    STRING = "string"
    NUMBER = "number"
    PIPE = "|"
    LEFT = "("
    RIGHT = ")"
    COMMENT = "comment"
    END = "end of the template"


@dataclass(frozen=True)
class Token:
    """One piece of the template: its kind, its offset in the text, the text as written, and its value (a
    string's or number's value, a field's names, text as it prints, whether a delimiter trims)."""

    kind: Kind
    pos: int
    text: str
    value: Any = None


class TemplateError(Exception):
    """What is wrong with a template, at an offset of its text (the CLI shows the template, a caret under it)."""

    def __init__(self, message: str, pos: int, hint: str | None = None, *, then: str = "") -> None:
        super().__init__(message)
        self.message = message  # what is wrong, said before its column ("unclosed action at column 11")
        self.pos = pos
        self.hint = hint
        self.then = then  # said after the column ("{{with}} at column 3 is Go template syntax that …")


def outside(what: str, pos: int) -> TemplateError:
    """Go template syntax that this subset does not take, named as such."""
    then = " is Go template syntax that vmsandbox's --format does not take"
    return TemplateError(what, pos, f"it takes {SUBSET}", then=then)


def lex(text: str, start: int = 0) -> list[Token]:
    """The tokens of `text` from `start` (what comes before, `table `, is not the template's)."""
    tokens: list[Token] = []
    i = start
    while i < len(text):
        j = text.find("{{", i)
        if j < 0:
            j = len(text)
        if j > i:
            raw = text[i:j]
            tokens.append(Token(Kind.TEXT, i, raw, raw.replace("\\t", "\t").replace("\\n", "\n")))
        i = _action(text, j, tokens) if j < len(text) else j
    tokens.append(Token(Kind.END, len(text), ""))
    return _trimmed(tokens)


def _trimmed(tokens: list[Token]) -> list[Token]:
    """`{{- ` trims the white space before it, ` -}}` the white space after it."""
    out = list(tokens)
    for n, t in enumerate(out):
        if t.kind is Kind.TEXT:
            value = t.value
            if n > 0 and out[n - 1].kind is Kind.CLOSE and out[n - 1].value:
                value = value.lstrip(SPACE)
            if n + 1 < len(out) and out[n + 1].kind is Kind.OPEN and out[n + 1].value:
                value = value.rstrip(SPACE)
            out[n] = Token(t.kind, t.pos, t.text, value)
    return out


def _action(text: str, at: int, tokens: list[Token]) -> int:
    """The tokens of the action that opens at `at`; where the text goes on after it."""
    if "}}" not in text[at + 2 :]:
        raise TemplateError("unclosed action", at, "an action ends with }}: '{{.Name}}'")
    trims = text.startswith("{{-", at) and text[at + 3 : at + 4] != "" and text[at + 3] in SPACE
    p = at + (3 if trims else 2)
    tokens.append(Token(Kind.OPEN, at, text[at:p], trims))
    if text.startswith("/*", p + trims):  # ({{- /* … */ -}}: a space between)
        p += trims
        end = text.find("*/", p + 2)
        if end < 0:
            raise TemplateError("unclosed comment", p, "a comment is {{/* … */}}")
        tokens.append(Token(Kind.COMMENT, p, text[p : end + 2]))
        p = end + 2 + (text[end + 2 : end + 3] == " " and text[end + 3 : end + 6] == "-}}")
        if _closes(text, p) is None:
            raise TemplateError("a comment ends its action: */}}", p, "a comment is {{/* … */}}")
    while True:
        while p < len(text) and text[p] in SPACE:
            p += 1
        if p >= len(text):
            raise TemplateError("unclosed action", at, "an action ends with }}: '{{.Name}}'")
        closes = _closes(text, p)
        if closes is not None:
            tokens.append(Token(Kind.CLOSE, p, text[p:closes], closes - p == 3))
            return closes
        p = _word(text, p, tokens)


def _closes(text: str, p: int) -> int | None:
    """Where the text goes on if an action closes at `p` (` -}}` trims: a space before the dash)."""
    if text.startswith("}}", p):
        return p + 2
    if text.startswith("-}}", p) and p > 0 and text[p - 1] in SPACE:
        return p + 3
    return None


def _word(text: str, p: int, tokens: list[Token]) -> int:
    """One token of an action at `p`; where the next may start."""
    c = text[p]
    single = {"|": Kind.PIPE, "(": Kind.LEFT, ")": Kind.RIGHT}
    if c in single:
        tokens.append(Token(single[c], p, c))
        return p + 1
    if (found := FIELD.match(text, p)) is not None:
        names = tuple(found.group(0)[1:].split("."))
        tokens.append(Token(Kind.FIELD, p, found.group(0), names))
        return found.end()
    if (found := NUMBER.match(text, p)) is not None and found.group(0) not in (".", "+", "-"):
        tokens.append(Token(Kind.NUMBER, p, found.group(0), _number(found.group(0), p)))
        return found.end()
    if c == ".":
        tokens.append(Token(Kind.DOT, p, c))
        return p + 1
    if (found := NAME.match(text, p)) is not None:
        tokens.append(Token(Kind.NAME, p, found.group(0)))
        return found.end()
    if c in '"`':
        end, value = _string(text, p)
        tokens.append(Token(Kind.STRING, p, text[p:end], value))
        return end
    if c == "$":
        raise outside(f"a variable (${_name_at(text, p + 1)})", p)
    if text.startswith((":=", "="), p):
        raise outside("an assignment (:= or =)", p)
    if c == "'":
        raise outside("a character constant ('x')", p)
    raise TemplateError(f"unexpected {c!r} in an action", p, "an action holds a field, a function and its "
                        "arguments, or a pipe: '{{.Name}}', '{{join .Files \",\"}}', '{{.Name | upper}}'")  # fmt: skip


def _name_at(text: str, p: int) -> str:
    found = NAME.match(text, p)
    return found.group(0) if found else ""


def _number(text: str, pos: int) -> int | float:
    try:
        return int(text, 0) if re.fullmatch(r"[+-]?(0[xX][0-9a-fA-F]+|\d+)", text) else float(text)
    except ValueError:
        raise TemplateError(f"bad number {text!r}", pos) from None


def _string(text: str, p: int) -> tuple[int, str]:
    """A quoted string at `p` ("…" with Go's escapes, or `…` as written): where it ends, its value."""
    quote = text[p]
    if quote == "`":
        end = text.find("`", p + 1)
        if end < 0:
            raise TemplateError("unterminated raw string", p, "a raw string ends with `")
        return end + 1, text[p + 1 : end]
    out = []
    i = p + 1
    while i < len(text) and text[i] not in '"\n':
        if text[i] != "\\":
            out.append(text[i])
            i += 1
            continue
        letter = text[i + 1 : i + 2]
        if letter in ESCAPES:
            out.append(ESCAPES[letter])
            i += 2
        elif letter in HEX_ESCAPES and re.match(f"[0-9a-fA-F]{{{HEX_ESCAPES[letter]}}}", text[i + 2 :]):
            digits = text[i + 2 : i + 2 + HEX_ESCAPES[letter]]
            out.append(chr(int(digits, 16)))
            i += 2 + len(digits)
        else:
            raise TemplateError(f"unknown escape \\{letter} in a string", i, 'escapes: \\t \\n \\" \\\\ \\xHH \\uHHHH')
    if i >= len(text) or text[i] != '"':
        raise TemplateError("unterminated string", p, 'a string ends with "')
    return i + 1, "".join(out)
