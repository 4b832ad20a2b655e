"""`vmsandbox port ls|publish|rm`: the guest ports a session publishes on this machine, opened and closed while
it runs."""

from __future__ import annotations

from typing import Annotated

import typer

from vmsandbox import ui
from vmsandbox.cli import complete, output
from vmsandbox.cli.base import SessionName, noun
from vmsandbox.cli.output import AsJson, Column, Listing, Output, Quiet

port = noun(
    "port",
    "A session's published ports: ls, publish, rm.\n\n"
    "A guest port reached on this machine's 127.0.0.1 and ::1, opened and closed while the session runs.\n\n"
    "Example: `vmsandbox port publish exp1 3000`",
)
Spec = Annotated[str, typer.Argument(help="[HOST_PORT:]GUEST_PORT", metavar="PORT")]


PORTS = Listing(
    fields=("guest", "host", "addresses", "places"),
    columns=(Column("guest", lambda r: f"{r['guest']}/tcp"), Column("places")),
    example="{{.Guest}} {{.Host}}",
    key="guest",
)


@port.command("ls")
def ls(
    name: SessionName,
    as_json: AsJson = False,
    quiet: Quiet = False,
    fmt: Annotated[str | None, output.format_option(PORTS.example)] = None,
    wide: Output = None,
) -> None:
    """List a session's published ports.

    Examples: `vmsandbox port ls exp1` · `vmsandbox port ls exp1 --format '{{.Guest}} {{join .Places " "}}'`"""
    from vmsandbox.core import watch

    shape = PORTS.shape(as_json=as_json, quiet=quiet, fmt=fmt, output=wide)
    rows = [{**p.as_dict(), "places": p.places()} for p in watch.ports(name)]
    empty = f"Session {name} publishes no ports: `vmsandbox port publish {name} [HOST_PORT:]GUEST_PORT`"
    PORTS.show(rows, shape, empty=empty)


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
