"""`vmsandbox port ls|publish|rm`: the guest ports a session publishes on this machine, opened and closed while
it runs."""

from __future__ import annotations

from typing import Annotated

import typer

from vmsandbox import ui
from vmsandbox.cli import complete, output
from vmsandbox.cli.base import SessionName, noun
from vmsandbox.cli.output import AsJson, Column, Format, Quiet

port = noun(
    "port",
    "A session's published ports: ls, publish, rm.\n\n"
    "A guest port reached on this machine's 127.0.0.1 and ::1, opened and closed while the session runs.\n\n"
    "Example: `vmsandbox port publish exp1 3000`",
)
Spec = Annotated[str, typer.Argument(help="[HOST_PORT:]GUEST_PORT", metavar="PORT")]


@port.command("ls")
def ls(name: SessionName, as_json: AsJson = False, quiet: Quiet = False, fmt: Format = None) -> None:
    """List a session's published ports.

    Example: `vmsandbox port ls exp1`"""
    from vmsandbox.core import watch

    output.formats(fmt)
    rows = [{**p.as_dict(), "places": p.places()} for p in watch.ports(name)]
    table = (Column("GUEST", lambda r: f"{r['guest']}/tcp"), Column("ON", lambda r: ", ".join(r["places"])))
    empty = f"Session {name} publishes no ports: `vmsandbox port publish {name} [HOST_PORT:]GUEST_PORT`"
    output.listing(rows, table, as_json=as_json, quiet=quiet, fmt=fmt, key="guest", empty=empty,
                   fields=("guest", "host", "addresses", "places"))  # fmt: skip


@port.command("publish")
def publish(
    name: SessionName,
    spec: Spec,
    address: Annotated[
        str | None,
        typer.Option("--publish-address", metavar="ADDRESS", help="Publish on this address instead of loopback."),
    ] = None,
) -> None:
    """Publish a guest port of a running session.

    On a free host port unless HOST_PORT says which, on 127.0.0.1 and ::1 unless --publish-address says where.

    Examples: `vmsandbox port publish exp1 3000` · `vmsandbox port publish exp1 8080:3000`"""
    from vmsandbox.core import watch

    done = watch.publish(name, spec, address)
    ui.info(f"Guest port {done.guest} is published on {', '.join(done.places())}")


@port.command("rm")
def rm(
    name: SessionName,
    spec: Annotated[str, typer.Argument(help="[HOST_PORT:]GUEST_PORT", metavar="PORT", autocompletion=complete.ports)],
) -> None:
    """Stop publishing a guest port of a running session.

    Every host port it has, or only the one HOST_PORT names.

    Example: `vmsandbox port rm exp1 3000`"""
    from vmsandbox.core import watch

    for gone in watch.unpublish(name, spec):
        ui.info(f"Guest port {gone.guest} is no longer published on {', '.join(gone.places())}")
