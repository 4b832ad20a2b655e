"""`vmsandbox serve`: the HTTP API (vmsandbox/api) that E2B's SDK drives, on 127.0.0.1: in a terminal, or in the
background (`--detach`, `--stop`), and the settings of the running one as shell lines (`--env`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from vmsandbox import ui
from vmsandbox.cli.base import app
from vmsandbox.errors import UsageError

if TYPE_CHECKING:
    from vmsandbox.api.running import Settings
    from vmsandbox.core.sandbox.interface import Backend


def core_backend() -> Backend:
    """The sessions `serve` drives: the core's (core/sandbox/backend.py)."""
    from vmsandbox.core.sandbox.backend import SessionBackend

    return SessionBackend()


def _print_lines(lines: list[str]) -> None:
    for line in lines:
        print(line, flush=True)  # stdout: the settings (or their unsetting) are the command's data, for eval


def _serving(settings: Settings, how: str) -> None:
    where = f" and on {settings.socket}" if settings.socket else ""
    ui.info(f"Serving E2B's API at {settings.url}{where} (only on this machine, only for you){how}")


def _say(note: str | None, warnings: list[str]) -> None:
    for warning in warnings:
        ui.warn(warning)
    if note:
        ui.info(note)


def _in_terminal(settings: Settings, note: str | None, warnings: list[str]) -> None:
    _print_lines(settings.exports())
    _say(note, warnings)
    _serving(settings, '; Ctrl-C stops it. Elsewhere: eval "$(vmsandbox serve --env)"')


def _in_background(settings: Settings, note: str | None, warnings: list[str]) -> None:
    """The child of `--detach`: its stderr is serve.log, and its stdout prints nothing (the key stays out of logs)."""
    _say(note, warnings)
    _serving(settings, "")


def _detach(args: list[str], *, port: int) -> None:
    from vmsandbox.api import running, server

    server.refuse_root()
    found = running.running()
    if found is not None:
        _print_lines(running.current().exports())
        ui.info(
            f"`vmsandbox serve` runs already (pid {found.get('pid')}): its settings; to start one with other options, "
            "`vmsandbox serve --stop` first"
        )
        return
    stale, last = running.forget_stale(), 0 if port else running.last_port()  # (said here: the child's go to its log)
    settings = running.start_detached(args)
    _print_lines(settings.exports())
    moved = [running.moved_note(last)] if last and not settings.url.endswith(f":{last}") else []
    _say(None, [*([running.stale_note(stale)] if stale else []), *moved])
    _serving(settings, " in the background; `vmsandbox serve --stop` stops it")


def _stop() -> None:
    """`--stop`: `unset` lines first (`eval` them, whether a serve ran or not), then the stop, said on stderr."""
    from vmsandbox.api import running

    _print_lines(running.unsets())
    pid, url = running.stop()
    ui.info(f"`vmsandbox serve` (pid {pid}) stopped")
    ui.warn(running.stopped_note(url))


@app.command("serve")
def serve_api(
    port: Annotated[int, typer.Option("--port", metavar="PORT", help="Port on 127.0.0.1 \\[default: a free one].")] = 0,
    unix: Annotated[
        Path | None, typer.Option("--socket", help="Also serve on this Unix socket (made 0600).", metavar="PATH")
    ] = None,
    detach: Annotated[
        bool, typer.Option("--detach", "-d", help="Serve in the background; print its settings once it listens.")
    ] = False,
    keep_key: Annotated[
        bool, typer.Option("--keep-key", help="Keep the key across restarts (0600, in the state directory).")
    ] = False,
    env: Annotated[
        bool, typer.Option("--env", help="Print the running server's settings as `export` lines, and exit.")
    ] = False,
    stop: Annotated[
        bool, typer.Option("--stop", help="Stop the server that runs for this account; print `unset` lines.")
    ] = False,
    background: Annotated[bool, typer.Option("--background", hidden=True)] = False,  # the process --detach starts
) -> None:
    """Serve an HTTP API that E2B's SDK drives, with the review as its extension.

    It serves E2B's control plane and sandbox API (commands, files, pause, connect, snapshots) over vmsandbox sessions,
    and under /vmsandbox/v1 sessions on a project, their changes as a frozen review, apply, rollback and fork
    (/openapi.json describes both), on 127.0.0.1 for your account only (never as root). It prints the settings E2B's
    SDK reads (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY, E2B_DOMAIN) as `export` lines on stdout, and keeps them in a
    0600 file of the state directory while it serves: `vmsandbox serve --env` prints them again, in any shell. The key
    is new at each start, unless --keep-key (a start without it drops a kept key). In a terminal, Ctrl-C stops it;
    --detach serves in the background until `vmsandbox serve --stop`, which prints `unset` lines: a shell that keeps
    the settings of a serve that is gone points at a port any account may take. Each start takes the port of the
    last one back while it is free.

    Examples: `eval "$(vmsandbox serve --detach)"` · `eval "$(vmsandbox serve --env)"` ·
    `eval "$(vmsandbox serve --stop)"`"""
    from vmsandbox.api import running, server

    serving = port != 0 or unix is not None or keep_key or detach or background
    if (env or stop) and (serving or (env and stop)):
        raise UsageError(
            "--env and --stop go alone", hint="`vmsandbox serve --env` prints the running server's settings"
        )
    if not 0 <= port <= 65535:
        raise UsageError(f"--port {port} is not a port", hint="give 1 to 65535, or leave --port out for a free one")
    if env:
        _print_lines(running.current().exports())
        return
    if stop:
        _stop()
        return
    where = unix.absolute() if unix is not None else None
    if detach and not background:
        args = ["--background", *(["--port", str(port)] if port else []), *(["--keep-key"] if keep_key else [])]
        _detach([*args, *(["--socket", str(where)] if where is not None else [])], port=port)
        return
    ready = _in_background if background else _in_terminal
    server.serve(core_backend(), port=port, unix=where, ready=ready, keep_key=keep_key)
