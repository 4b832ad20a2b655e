"""`vmsandbox login AGENT`: an agent's sign-in kept on the host for every later session of that agent
(session.logins); and the question at the end of a run whose guest signed in."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from vmsandbox import ui
from vmsandbox.cli import complete
from vmsandbox.cli.base import app, sync_limit
from vmsandbox.errors import UsageError, VmsandboxError

if TYPE_CHECKING:
    from vmsandbox.image.blueprint import Blueprint
    from vmsandbox.session.record import Record


@app.command()
def login(
    agent: Annotated[
        str,
        typer.Argument(
            help="claude, codex, gemini, opencode (a blueprint).", metavar="AGENT", autocompletion=complete.blueprints
        ),
    ],
    source: Annotated[
        str | None,
        typer.Option(
            "--from",
            metavar="NAME",
            help="Keep the login made in this running session.",
            autocompletion=complete.sessions,
        ),
    ] = None,
    forget: Annotated[bool, typer.Option("--forget", help="Remove the kept login.")] = False,
) -> None:
    """Sign an agent in once; every later session of it starts signed in.

    Without --from, a disposable VM of the agent's blueprint runs its sign-in (claude: `/login` in it, then
    quit; codex: `codex login`; …) and what it writes in the guest's home is kept on the host (0600, in your
    config directory), then copied into each later session of that agent. With --from, the login made in a
    running session is kept. An API key needs none of this: `vmsandbox secret set` keeps it out of the VM.

    Examples:

    `vmsandbox login claude`

    `vmsandbox login codex --from exp1`

    `vmsandbox login gemini --forget`"""
    from vmsandbox.image import blueprint
    from vmsandbox.session.running import logins

    bp = blueprint.load(agent)
    if forget:
        gone = logins.forget(bp)
        ui.info(f"Forgot {agent}'s login ({', '.join(gone)})" if gone else f"No login of {agent} is kept.")
        return
    if not bp.login_files:
        raise UsageError(
            f"blueprint {agent} names no login files", hint=f"add `login: {{files: [...]}}` to {bp.source}"
        )
    if source is not None:
        from vmsandbox.cli.attach import ready

        record = ready(source)
        if record.blueprint != agent:
            raise UsageError(f"session {source} is a {record.blueprint} session, not {agent}")
        _keep(bp, record)
        return
    _login_session(bp)


def _keep(bp: Blueprint, record: Record) -> None:
    from vmsandbox.session.running import logins

    found = logins.read(record, bp)
    if not found:
        raise VmsandboxError(
            f"no login of {bp.name} in session {record.name} (none of ~/{', ~/'.join(bp.login_files)})",
            hint=f"sign in there first ({shlexed(bp)}), then run this again",
        )
    kept = logins.keep(bp, found)
    ui.info(f"[green]✓[/] {bp.name}'s login kept ({', '.join(kept)}); later {bp.name} sessions start signed in")


def shlexed(bp: Blueprint) -> str:
    import shlex

    return shlex.join(bp.login_command or bp.command)


def _login_session(bp: Blueprint) -> None:
    """A disposable session of the blueprint on an empty project: its sign-in, then its login kept."""
    from vmsandbox.guest import commands
    from vmsandbox.session import lock
    from vmsandbox.session.end import lifecycle
    from vmsandbox.session.options import RunFlags
    from vmsandbox.session.start import create, resolve

    project = Path(tempfile.mkdtemp(prefix="vmsandbox-login-"))
    try:
        planned = resolve.resolve(project, bp.name, None, RunFlags(keep=True), agent=False)
        record = create.create(planned.options)
        try:
            ui.info(f"Sign in to {bp.name} here; the VM ends when `{shlexed(bp)}` does.")
            tty = sys.stdin.isatty() and sys.stdout.isatty()
            code = commands.attach(record.endpoint(), record.project, list(bp.login_command or bp.command), tty=tty)
            if code != 0:
                ui.warn(f"`{shlexed(bp)}` exited with {code}")
            _keep(bp, record)
        finally:
            with lock.held(record.files, record.name, "destroying"):
                lifecycle.destroy(record, force=False, discard=True, limit=sync_limit())
    finally:
        shutil.rmtree(project, ignore_errors=True)


def offer(record: Record) -> None:
    """At the end of a run at a terminal: a login the guest made (or refreshed) is kept if the person says so.
    Without a terminal nothing is asked and nothing kept (a guest's bytes reach later sessions only by a yes)."""
    from vmsandbox.image import blueprint
    from vmsandbox.session.running import logins

    if not ui.is_interactive():
        return
    try:
        bp = blueprint.load(record.blueprint, Path(record.project))
        fresh = logins.changed(record, bp) if bp.login_files else {}
    except VmsandboxError:
        return  # no blueprint any more, or a guest that no longer answers: nothing to offer
    if fresh and typer.confirm(
        f"The session signed in to {bp.name} ({', '.join(sorted(fresh))}). Keep that login for later sessions?",
        default=False,
        err=True,
    ):
        ui.info(f"[green]✓[/] kept ({', '.join(logins.keep(bp, fresh))})")
