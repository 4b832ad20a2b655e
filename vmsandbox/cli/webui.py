"""`vmsandbox ui`: the web review on 127.0.0.1 (vmsandbox/web)."""

from __future__ import annotations

import html
import os
import socket
import sys
import tempfile
import threading
import webbrowser
from pathlib import Path
from typing import Annotated
from urllib.parse import quote

import typer

from vmsandbox import ui
from vmsandbox.cli import complete
from vmsandbox.cli.base import app
from vmsandbox.errors import VmsandboxError


def path_of(name: str | None) -> str:
    return f"/s/{quote(name, safe='')}" if name else "/"


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
    from vmsandbox.web.guard import loopback_address

    if name is not None:
        from vmsandbox.session.record import Record

        Record.load(name)  # a session that does not exist is said now, with its hint, not on the page
    address = loopback_address()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, port))
    except OSError as exc:
        sock.close()
        raise VmsandboxError(
            f"cannot listen on {address}:{port}: {exc.strerror}",
            hint="choose another port with --port, or leave it out for a free one",
        ) from None
    sock.listen(128)  # before the URL is printed: a browser that is quick must queue, not be refused
    bound = sock.getsockname()[1]
    launchers: dict[str, Path] = {}
    server: uvicorn.Server | None = None

    def applied() -> None:
        if until_applied and server is not None:
            server.should_exit = True  # (the answer in flight is finished first)

    def used(ticket: str) -> None:
        gone = launchers.pop(ticket, None)
        if gone is not None:
            gone.unlink(missing_ok=True)

    guard = web.make(address=address, port=bound, on_applied=applied, on_exchange=used)
    print(guard.url(path_of(name)), flush=True)  # stdout: the URL is the command's data (it works once)
    ui.info("The review is served at the URL above (only on this machine; the link works once); Ctrl-C stops it.")
    try:
        if browser and has_browser():
            ticket_url = guard.url(path_of(name))
            launcher = launcher_file(ticket_url)
            launchers[ticket_url.rpartition("ticket=")[2]] = launcher
            # in a thread of its own: a browser command may wait until the browser is closed (a console browser,
            # $BROWSER=firefox started fresh), and the page must be served meanwhile
            threading.Thread(target=webbrowser.open, args=(launcher.as_uri(),), daemon=True).start()
        config = uvicorn.Config(guard, log_level="warning", access_log=False, log_config=None)
        # (log_config=None: its errors go to our log (stderr, -v), not to a configuration of its own)
        server = uvicorn.Server(config)
        server.run(sockets=[sock])
    finally:
        for launcher in launchers.values():
            launcher.unlink(missing_ok=True)


def launcher_file(url: str) -> Path:
    """A page that sends the browser to `url`, readable by this account only: the browser is opened on it, so
    the ticket is never on a command line (which every local account reads in /proc)."""
    from vmsandbox import paths
    from vmsandbox.confine import accounts as confine

    where = paths.state_dir() / "ui"
    confine.make_private_dir(where, traverse=False)
    fd, name = tempfile.mkstemp(prefix="open-", suffix=".html", dir=where)
    with os.fdopen(fd, "w") as f:  # mkstemp: 0600, made by this account only
        f.write(f'<!doctype html><meta http-equiv="refresh" content="0;url={html.escape(url)}">\n')
    return Path(name)
