"""`vmsandbox policy allow|deny|ls|log`: what a running session's egress proxy lets through, changed while it
runs (from the next connection on), and every decision it made."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from vmsandbox import ui
from vmsandbox.cli import complete, output
from vmsandbox.cli.base import SessionName, noun
from vmsandbox.cli.output import AsJson, Column, Listing, Output, Quiet
from vmsandbox.cli.sessions.logs import Follow, Tail, lines_wanted, parse_age

policy = noun(
    "policy",
    "What a running session may reach: allow, deny, ls, log.\n\n"
    "Its egress proxy's allowlist, widened or narrowed while it runs (from the next connection on), and every "
    "decision it made.\n\nExample: `vmsandbox policy allow exp1 crates.io '*.crates.io'`",
)
Hosts = Annotated[list[str], typer.Argument(help="HOST, *.DOMAIN or HOST:PORT (one or more).", metavar="HOST...")]


@policy.command("allow")
def allow(name: SessionName, hosts: Hosts) -> None:
    """Let a running session reach more hosts.

    Its proxy lets them through from the next connection on; the change is in `vmsandbox policy log NAME`.

    Example: `vmsandbox policy allow exp1 crates.io '*.crates.io'`"""
    from vmsandbox.core import watch

    added = watch.allow(name, hosts)
    ui.info(f"Session {name} now also reaches {', '.join(added)}" if added else "Already allowed; nothing changed")


@policy.command("deny")
def deny(
    name: SessionName,
    hosts: Annotated[
        list[str],
        typer.Argument(
            help="Entries of its allowlist (HOST also takes its HOST:PORT entries).",
            metavar="HOST...",
            autocompletion=complete.allowed,
        ),
    ],
) -> None:
    """Take hosts off a running session's allowlist.

    New connections to them are refused; open ones go on.

    Example: `vmsandbox policy deny exp1 registry.npmjs.org`"""
    from vmsandbox.core import watch

    removed = watch.deny(name, hosts)
    ui.info(f"Session {name} no longer reaches {', '.join(removed)} (new connections)")


ALLOWED = Listing(
    fields=("entry", "kind"), columns=(Column("entry"), Column("kind")), example="{{.Entry}}", key="entry"
)


@policy.command("ls")
def ls(
    name: SessionName,
    as_json: AsJson = False,
    quiet: Quiet = False,
    fmt: Annotated[str | None, output.format_option(ALLOWED.example)] = None,
    wide: Output = None,
) -> None:
    """List a session's allowlist, as its proxy reads it now.

    Its network mode first (allowlist: only these; open: any public host; none: no way out), then each entry, and
    the private networks allowed names may resolve to.

    Examples: `vmsandbox policy ls exp1` · `vmsandbox policy ls exp1 --format '{{.Kind}} {{.Entry}}'`"""
    from vmsandbox.core import watch

    shape = ALLOWED.shape(as_json=as_json, quiet=quiet, fmt=fmt, output=wide)
    found = watch.allowlist(name)
    rows = [{"entry": e, "kind": "host"} for e in found.entries]
    rows += [{"entry": n, "kind": "network"} for n in found.networks]
    if not (as_json or quiet or fmt):
        ui.info(f"Session {name}: network {found.mode.value}")
    empty = (
        f"Nothing is allowed: `vmsandbox policy allow {name} HOST` lets a host through"
        if found.mode.value == "allowlist"
        else f"(network {found.mode.value}: no allowlist)"
    )
    ALLOWED.show(rows, shape, empty=empty)


@policy.command("log")
def log(
    name: SessionName,
    follow: Follow = False,
    as_json: Annotated[bool, typer.Option("--json", help="The JSON lines as they are.")] = False,
    tail: Tail = None,
    since: Annotated[
        str | None, typer.Option("--since", metavar="AGE", help="Only what happened in the last 30s, 10m, 2h or 1d.")
    ] = None,
) -> None:
    """Show every egress decision of a session: allowed or refused, host, bytes.

    Each request its proxy let through or refused, and each change of its allowlist, oldest first.

    Examples: `vmsandbox policy log exp1 --since 10m` · `vmsandbox policy log exp1 -f --json`"""
    from vmsandbox.core import listing

    cutoff = None if since is None else time.time() - parse_age(since)
    shown = 0
    for line, event in listing.proxy(name, follow=follow, tail=lines_wanted(tail), since=cutoff):
        shown += 1
        if as_json:
            print(line, flush=follow)
        else:
            ui.out.print(listing.describe(event), soft_wrap=True)
    if not shown and not follow:
        ui.info(f"Session {name} has made no requests through its egress proxy yet.")
