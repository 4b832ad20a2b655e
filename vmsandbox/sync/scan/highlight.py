"""Syntax highlighting of the guest's texts as data: Pygments in a jailed process (highlightworker.py) answers,
per text, its lines as (css class, text) tokens; an answer that is not the text's own lines, word for word, is
dropped (the lexer is a reader of guest bytes too, and what a page shows must be what is applied). A lexer that
fails or takes too long leaves the text without tokens. Front ends escape the text and check the class."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

from vmsandbox import proc
from vmsandbox.confine import accounts
from vmsandbox.errors import VmsandboxError
from vmsandbox.sync.scan.credentials import worker_jail

log = logging.getLogger(__name__)

HIGHLIGHT_LIMIT = 256 * 1024  # larger texts are shown plain
HIGHLIGHT_TIMEOUT = 60

Tokens = list[list[list[str]]]  # per line, [css class, text] pairs


def _same(tokens: Sequence[Sequence[Sequence[str]]], text: str) -> bool:
    """Whether the lexer's answer holds the text's own lines and nothing else."""
    lines = text.split("\n")  # as the worker splits them
    if text.endswith("\n"):
        lines.pop()
    return len(tokens) == len(lines) and all(
        isinstance(line, list) and "".join(str(t[1]) for t in line if len(t) == 2) == want
        for line, want in zip(tokens, lines, strict=True)
    )


def tokens(texts: Sequence[tuple[str, str]]) -> list[Tokens | None]:
    """Each (file name, text) as its lines of tokens, or None where the lexer did not answer it truly."""
    wanted = [(name, text) for name, text in texts if len(text) <= HIGHLIGHT_LIMIT]
    answer: list[Tokens] = []
    if wanted:
        who = accounts.guest_data_account()
        try:
            result = proc.run(
                proc.own_module("vmsandbox.sync.scan.highlightworker"),
                input=json.dumps(wanted),
                jail=worker_jail(),
                as_user=who,
                limits=accounts.GIT_LIMITS,
                env=accounts.clean_env(who),
                timeout=HIGHLIGHT_TIMEOUT,
            )
            answer = json.loads(result.stdout)
        except (VmsandboxError, ValueError) as exc:
            log.warning("no syntax highlighting: %s", exc)
    got = iter(answer if isinstance(answer, list) and len(answer) == len(wanted) else [])
    out: list[Tokens | None] = []
    for _name, text in texts:
        found = next(got, None) if len(text) <= HIGHLIGHT_LIMIT else None
        out.append(found if isinstance(found, list) and _same(found, text) else None)
    return out
