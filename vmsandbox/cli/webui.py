"""`vmsandbox ui`: the web review on 127.0.0.1 (vmsandbox/web)."""

from __future__ import annotations

import os
import secrets
import socket
import sys
import webbrowser
from typing import Annotated
from urllib.parse import quote

import typer

from vmsandbox import ui
from vmsandbox.cli import complete
from vmsandbox.cli.base import app
from vmsandbox.errors import VmsandboxError


def url_of(port: int, token: str, name: str | None = None) -> str:
    where = f"/s/{quote(name, safe='')}" if name else "/"
    return f"http://127.0.0.1:{port}{where}?token={token}"


def has_browser() -> bool:
    """A browser that opens where the user is: a desktop session (or $BROWSER), not an ssh login, where a
    console browser would take over the terminal."""
    if not any(os.environ.get(v) for v in ("DISPLAY", "WAYLAND_DISPLAY", "BROWSER")) and sys.platform != "darwin":
        return False
    try:
        webbrowser.get()
    except webbrowser.Error:
        return False
    return True


@app.command("ui")
def web_ui(
    name: Annotated[
        str | None,
        typer.Argument(
            help="Open this session's review (default: the session list).",
            metavar="NAME",
            autocompletion=complete.sessions,
        ),
    ] = None,
    port: Annotated[int, typer.Option("--port", help="Port on 127.0.0.1 (default: a free one).")] = 0,
    no_browser: Annotated[bool, typer.Option("--no-browser", help="Print the URL only.")] = False,
) -> None:
    """Review sessions in your browser.

    Review sessions in your browser: diffs with syntax highlighting, choices per file and per hunk, merges,
    a fan-out side by side, console and egress live. Served on 127.0.0.1 behind a token; Ctrl-C stops it.

    Example: `vmsandbox ui exp1`"""
    serve(name, port=port, browser=not no_browser)


def serve(name: str | None, *, port: int = 0, browser: bool = True, until_applied: bool = False) -> None:
    """Serve the page until Ctrl-C (with `until_applied`: or until a review is applied)."""
    import uvicorn

    from vmsandbox.web import app as web

    if name is not None:
        from vmsandbox.session.record import Record

        Record.load(name)  # a session that does not exist is said now, with its hint, not on the page
    token = secrets.token_urlsafe(32)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError as exc:
        sock.close()
        raise VmsandboxError(
            f"cannot listen on 127.0.0.1:{port}: {exc.strerror}",
            hint="choose another port with --port, or leave it out for a free one",
        ) from None
    sock.listen(128)  # before the URL is printed: a browser that is quick must queue, not be refused
    bound = sock.getsockname()[1]
    url = url_of(bound, token, name)
    print(url, flush=True)  # stdout: the URL is the command's data
    ui.info("The review is served at the URL above (only on this machine); Ctrl-C stops it.")
    if browser and has_browser():
        webbrowser.open(url)
    server: uvicorn.Server | None = None

    def applied() -> None:
        if until_applied and server is not None:
            server.should_exit = True  # (the answer in flight is finished first)

    config = uvicorn.Config(
        web.make(token=token, port=bound, on_applied=applied), log_level="warning", access_log=False, log_config=None
    )  # log_config=None: its errors go to our log (stderr, -v), not to a configuration of its own
    server = uvicorn.Server(config)
    server.run(sockets=[sock])
