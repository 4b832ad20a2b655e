"""Syntax highlighting of the guest's texts for the page: the tokens come from a jailed lexer as data
(core.views.tokens); this side shows each text as its characters are (ui.visible), escapes it, and keeps a
class only when it is a short lowercase word."""

from __future__ import annotations

import re
from collections.abc import Sequence

from markupsafe import Markup, escape

from vmsandbox import ui
from vmsandbox.core import views

CSS_CLASS = re.compile(r"[a-z0-9]{1,4}")


def plain(text: str) -> list[Markup]:
    return [escape(ui.visible(line)) for line in text.splitlines()]


def _markup(tokens: Sequence[Sequence[str]]) -> Markup:
    """A line of (css class, text) pairs: the text shown as its characters are (ui.visible), then escaped."""
    parts = []
    for css, text in tokens:
        if css and CSS_CLASS.fullmatch(css):
            parts.append(Markup('<span class="{}">{}</span>').format(css, ui.visible(text)))  # format() escapes both
        else:
            parts.append(escape(ui.visible(text)))
    return Markup("").join(parts)


def lines(texts: Sequence[tuple[str, str]]) -> list[list[Markup]]:
    """Each (file name, text) as its lines of markup, highlighted where the lexer answered."""
    out: list[list[Markup]] = []
    for (_name, text), found in zip(texts, views.tokens(texts), strict=True):
        shown = plain(text)
        if found is not None and len(found) == len(shown):  # the diff's lines, word for word
            shown = [_markup(line) for line in found]
        out.append(shown)
    return out
