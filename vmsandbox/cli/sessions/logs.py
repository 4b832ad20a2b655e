"""`vmsandbox logs`: a session's serial console, escaped (the egress decisions are `vmsandbox policy log`)."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from typing import Annotated

import typer

from vmsandbox import ui
from vmsandbox.cli.base import SessionName, app
from vmsandbox.errors import UsageError

MOST_LINES = 10**9  # --tail's bound (a count the parser refuses past, never a traceback)
Follow = Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines as they come.")]
Tail = Annotated[
    int | None, typer.Option("--tail", "-n", metavar="N", min=0, max=MOST_LINES, help="Only the last N lines.")
]


@app.command()
def logs(
    name: SessionName,
    follow: Follow = False,
    raw: Annotated[
        bool, typer.Option("--raw", help="The guest's bytes as they are (escape sequences included).")
    ] = False,
    tail: Tail = None,
) -> None:
    """Show a session's serial console.

    The console is the guest's own output: its control characters are shown escaped (\\x1b …), so it cannot drive
    your terminal, unless you ask for --raw. What the egress proxy allowed and refused: `vmsandbox policy log
    NAME`.

    Examples: `vmsandbox logs exp1 --tail 50` · `vmsandbox logs exp1 -f`"""
    from vmsandbox.core import listing

    lines = listing.console(name, follow=follow, tail=lines_wanted(tail))
    printed(lines, raw=raw, follow=follow)


def lines_wanted(tail: int | None) -> int | None:
    if tail is not None and tail < 0:
        raise UsageError(f"--tail {tail}: a number of lines is 0 or more")
    return tail


def printed(lines: Iterator[str], *, raw: bool, follow: bool) -> None:
    for line in lines:
        sys.stdout.write((line if raw else ui.printable(line.rstrip("\r"), markup=False)) + "\n")
        if follow:
            sys.stdout.flush()


AGES = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_age(text: str) -> float:
    """`30s`, `10m`, `2h`, `1d` (or plain seconds) in seconds."""
    found = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd]?)", text.strip())
    if found is None:
        raise UsageError(f"--since {text!r}: expected a duration", hint="e.g. --since 30s, 10m, 2h or 1d")
    return float(found.group(1)) * AGES[found.group(2) or "s"]
