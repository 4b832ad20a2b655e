"""`vmsandbox ui`: the web review (vmsandbox/web) served on this machine until Ctrl-C."""

from __future__ import annotations

from typing import Annotated

import typer

from vmsandbox.cli import complete
from vmsandbox.cli.base import app, session_names
from vmsandbox.errors import UsageError


@app.command("ui")
def web_ui(
    name: Annotated[
        str | None,
        typer.Argument(
            help="Open this session's review \\[default: the session list].",
            metavar="NAME",
            autocompletion=complete.sessions,
            callback=session_names,
        ),
    ] = None,
    port: Annotated[
        int, typer.Option("--port", metavar="PORT", min=0, max=65535, help="Port \\[default: a free one].")
    ] = 0,
    no_browser: Annotated[bool, typer.Option("--no-browser", help="Print the URL only.")] = False,
    review: Annotated[
        str | None,
        typer.Option("--review", metavar="ID", help="Open NAME's frozen review ID (an agent's proposal)."),
    ] = None,
    browser_only: Annotated[bool, typer.Option("--browser-only", hidden=True)] = False,  # (`vmsandbox mcp`'s)
) -> None:
    """Review sessions in your browser.

    Diffs with syntax highlighting, choices per file and per hunk, merges, a fan-out side by side, the console and
    egress live. Served on an address of this machine's own (127.x.y.z) behind a link that works once; Ctrl-C
    stops it.

    Example: `vmsandbox ui exp1`"""
    from vmsandbox.web import server

    if review is not None and name is None:
        raise UsageError("--review goes with a session's NAME", hint="`vmsandbox ui NAME --review ID`")
    if browser_only and no_browser:
        raise UsageError("--browser-only and --no-browser exclude each other", hint="give one of them")
    server.serve(name, port=port, browser=not no_browser, review=review, browser_only=browser_only)
