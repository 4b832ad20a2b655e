"""`vmsandbox mcp`: the MCP server (vmsandbox/mcp) for agents on this machine, over stdio (what an MCP client
starts: `claude mcp add vmsandbox -- vmsandbox mcp`) or over streamable HTTP on 127.0.0.1 (`--http`)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from vmsandbox import ui
from vmsandbox.cli.base import app
from vmsandbox.errors import UsageError


@app.command("mcp")
def mcp_server(
    http: Annotated[bool, typer.Option("--http", help="Serve streamable HTTP on 127.0.0.1 instead of stdio.")] = False,
    port: Annotated[
        int,
        typer.Option("--port", metavar="PORT", min=0, max=65535, help="With --http: the port \\[default: a free one]."),
    ] = 0,
) -> None:
    """Serve vmsandbox's tools to an AI agent over the Model Context Protocol.

    The agent makes sessions on a project, runs commands, reads and writes files, checkpoints, rolls back, forks
    and reads a session's review; it may propose what to apply, and you decide: your MCP client shows you a form
    of exactly those changes (held ones unticked), and nothing lands without your yes. No tool widens a session's
    egress, publishes a port, adds a secret or trusts a project. Over stdio by default, as a client starts it;
    with --http on 127.0.0.1 for your account only, with a key (printed on stdout as the client's settings, new
    each start; never as root).

    Examples: `claude mcp add vmsandbox -- vmsandbox mcp` · `vmsandbox mcp --http --port 8765`"""
    if port and not http:
        raise UsageError("--port goes with --http", hint="`vmsandbox mcp --http --port 8765`")
    from vmsandbox.mcp import page, server

    pages = page.Pages()  # (the browser reviews it opens for a client that cannot ask: ended with it)
    served = server.make(pages=pages)
    try:
        if not http:
            ui.info("vmsandbox MCP server on stdio (an MCP client talks to it; Ctrl-C stops it)")
            served.run("stdio")
            return
        from vmsandbox.mcp import loopback

        def ready(url: str, key: str) -> None:
            print(json.dumps({"type": "http", "url": url, "headers": {"Authorization": f"Bearer {key}"}}), flush=True)
            ui.info(
                f"Serving MCP at {url} for your account only; Ctrl-C stops it. Add it to Claude Code with: "
                f"claude mcp add --transport http vmsandbox {url} --header 'Authorization: Bearer KEY' "
                "(KEY: as printed above)"
            )

        loopback.serve(served, port=port, ready=ready)
    finally:
        pages.close()
