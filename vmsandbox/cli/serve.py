"""`vmsandbox serve`: the HTTP API (vmsandbox/api) that E2B's SDK drives, on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from vmsandbox import ui
from vmsandbox.cli.base import app
from vmsandbox.errors import UsageError

if TYPE_CHECKING:
    from vmsandbox.api.server import Settings
    from vmsandbox.core.sandbox.interface import Backend


def core_backend() -> Backend:
    """The sessions `serve` drives: the core's (core/sandbox/backend.py)."""
    from vmsandbox.core.sandbox.backend import SessionBackend

    return SessionBackend()


def _ready(settings: Settings) -> None:
    for line in settings.lines():
        print(line, flush=True)  # stdout: the settings are the command's data
    where = f" and on {settings.socket}" if settings.socket else ""
    ui.info(f"Serving E2B's API at {settings.url}{where} (only on this machine, only for you); Ctrl-C stops it.")


@app.command("serve")
def serve_api(
    port: Annotated[int, typer.Option("--port", metavar="PORT", help="Port on 127.0.0.1 \\[default: a free one].")] = 0,
    unix: Annotated[
        Path | None, typer.Option("--socket", help="Also serve on this Unix socket (made 0600).", metavar="PATH")
    ] = None,
) -> None:
    """Serve an HTTP API that E2B's SDK drives, with the review as its extension.

    It serves E2B's control plane and sandbox API (commands, files, pause, connect, snapshots) over vmsandbox sessions,
    and under /vmsandbox/v1 sessions on a project, their changes as a frozen review, apply, rollback and fork
    (/openapi.json describes both). Prints E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY on stdout, one a line:
    set them where the SDK runs. The key is new each time and kept only in memory. Ctrl-C stops it.

    Example: `vmsandbox serve --port 49999`"""
    from vmsandbox.api import server

    if not 0 <= port <= 65535:
        raise UsageError(f"--port {port} is not a port", hint="give 1 to 65535, or leave --port out for a free one")
    backend = core_backend()
    server.serve(backend, port=port, unix=unix.absolute() if unix is not None else None, ready=_ready)
