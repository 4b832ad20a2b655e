"""Syntax highlighting of the guest's texts: Pygments in a jailed process (highlightworker.py), whose answer is
data — (css class, text) per token — that this side escapes; a class that is not a short lowercase word is
dropped. A lexer that fails or takes too long leaves the text plain."""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Sequence

from markupsafe import Markup, escape

from vmsandbox import proc, ui
from vmsandbox.confine import accounts as confine
from vmsandbox.errors import VmsandboxError
from vmsandbox.sync.scan.credentials import worker_jail

log = logging.getLogger(__name__)

HIGHLIGHT_LIMIT = 256 * 1024  # larger texts are shown plain
HIGHLIGHT_TIMEOUT = 60
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


def _same(tokens: Sequence[Sequence[Sequence[str]]], text: str) -> bool:
    """Whether the lexer's answer holds the text's own lines and nothing else: the jailed lexer is a reader of
    guest bytes too, and what a page shows must be what is applied."""
    lines = text.split("\n")  # as the worker splits them
    if text.endswith("\n"):
        lines.pop()
    return len(tokens) == len(lines) and all(
        isinstance(line, list) and "".join(str(t[1]) for t in line if len(t) == 2) == want
        for line, want in zip(tokens, lines, strict=True)
    )


def lines(texts: Sequence[tuple[str, str]]) -> list[list[Markup]]:
    """Each (file name, text) as its lines of markup, highlighted where the lexer answered."""
    wanted = [(name, text) for name, text in texts if len(text) <= HIGHLIGHT_LIMIT]
    answer: list[list[list[list[str]]]] = []
    if wanted:
        who = confine.guest_data_account()
        try:
            result = proc.run(
                [sys.executable, "-I", "-m", "vmsandbox.web.highlightworker"],
                input=json.dumps(wanted),
                jail=worker_jail(),
                as_user=who,
                limits=confine.GIT_LIMITS,
                env=confine.clean_env(who),
                timeout=HIGHLIGHT_TIMEOUT,
            )
            answer = json.loads(result.stdout)
        except (VmsandboxError, ValueError) as exc:
            log.warning("no syntax highlighting: %s", exc)
    got = iter(answer if len(answer) == len(wanted) else [])
    out: list[list[Markup]] = []
    for _name, text in texts:
        tokens = next(got, None) if len(text) <= HIGHLIGHT_LIMIT else None
        shown = plain(text)
        if tokens is not None and len(tokens) == len(shown) and _same(tokens, text):  # the diff's lines, word for word
            shown = [_markup(line) for line in tokens]
        out.append(shown)
    return out
