"""`vmsandbox login add|ls|rm`: an agent's sign-in kept on the host for every later session of that agent."""

from __future__ import annotations

from typing import Annotated

import typer

from vmsandbox import ui
from vmsandbox.cli import complete, output
from vmsandbox.cli.base import noun
from vmsandbox.cli.output import AsJson, Column, Listing, Output, Quiet

login = noun(
    "login",
    "Agents signed in once for every later session: add, ls, rm.\n\n"
    "For a subscription's sign-in; an API key is a secret (`vmsandbox secret set`).\n\n"
    "Example: `vmsandbox login add claude`",
)


@login.command("add")
def add(
    agent: Annotated[
        str,
        typer.Argument(
            help="claude, codex, gemini, opencode (a blueprint with a login).",
            metavar="AGENT",
            autocompletion=complete.agents,
        ),
    ],
    source: Annotated[
        str | None,
        typer.Option(
            "--from",
            metavar="NAME",
            help="Keep the login made in this running session instead.",
            autocompletion=complete.sessions,
        ),
    ] = None,
) -> None:
    """Sign an agent in once; every later session of it starts signed in.

    A disposable VM of the agent's blueprint runs its sign-in (claude: `/login` in it, then quit; codex: `codex
    login`; …) and what it writes in the guest's home is kept on the host (0600, in your config directory). With
    --from, the login made in a running session is kept. An API key needs none of this: `vmsandbox secret set`.

    Examples: `vmsandbox login add claude` · `vmsandbox login add codex --from exp1`"""
    from vmsandbox.core import secrets, sessions

    secrets.agent(agent)
    kept = secrets.keep_from(agent, sessions.ready(source)) if source is not None else secrets.sign_in(agent)
    ui.info(f"[green]✓[/] {agent}'s login kept ({', '.join(kept)}); later {agent} sessions start signed in")


LOGINS = Listing(
    fields=("name", "files"), columns=(Column("name"), Column("files")), example='{{.Name}}: {{join .Files " "}}'
)


@login.command("ls")
def ls(
    as_json: AsJson = False,
    quiet: Quiet = False,
    fmt: Annotated[str | None, output.format_option(LOGINS.example)] = None,
    wide: Output = None,
) -> None:
    """List the agents whose login is kept.

    Examples: `vmsandbox login ls` · `vmsandbox login ls --format '{{.Name}} {{len .Files}}'`"""
    from vmsandbox.core import secrets

    shape = LOGINS.shape(as_json=as_json, quiet=quiet, fmt=fmt, output=wide)
    rows = [{"name": name, "files": files} for name, files in secrets.logged_in().items()]
    LOGINS.show(rows, shape, empty="No login is kept: `vmsandbox login add AGENT` signs one in.")


@login.command("rm")
def rm(
    agent: Annotated[
        str, typer.Argument(help="An agent whose login is kept.", metavar="AGENT", autocompletion=complete.signed_in)
    ],
) -> None:
    """Remove an agent's kept login.

    Later sessions of it start signed out; running ones keep what they have.

    Example: `vmsandbox login rm gemini`"""
    from vmsandbox.core import secrets

    gone = secrets.forget(agent)
    ui.info(f"Forgot {agent}'s login ({', '.join(gone)})" if gone else f"No login of {agent} is kept.")
