"""The lexer's process: Pygments over texts given on stdin; tokens per line on stdout.

It runs in the jail (sync/scan/highlight.py): a lexer is a parser of the guest's bytes. Input: JSON `[[file name, text],
…]`. Output: JSON, per text a list of lines, each a list of `[css class, text]` (the host escapes the text and
checks the class: nothing of this becomes markup unchecked).
"""

from __future__ import annotations

import json
import sys


def _lines(name: str, text: str) -> list[list[list[str]]]:
    from pygments.lexers import TextLexer, get_lexer_for_filename
    from pygments.token import STANDARD_TYPES, _TokenType
    from pygments.util import ClassNotFound

    try:
        lexer = get_lexer_for_filename(name, stripnl=False, ensurenl=False)
    except ClassNotFound:
        lexer = TextLexer(stripnl=False, ensurenl=False)
    out: list[list[list[str]]] = [[]]
    for ttype, value in lexer.get_tokens(text):
        kind: _TokenType | None = ttype
        while kind is not None and kind not in STANDARD_TYPES:
            kind = kind.parent
        css = STANDARD_TYPES.get(kind, "") if kind is not None else ""
        parts = value.split("\n")
        for i, part in enumerate(parts):
            if i:
                out.append([])
            if part:
                out[-1].append([css, part])
    if out and not out[-1] and text.endswith("\n"):
        out.pop()
    return out


def main() -> None:
    json.dump([_lines(name, text) for name, text in json.load(sys.stdin)], sys.stdout)


if __name__ == "__main__":
    main()
