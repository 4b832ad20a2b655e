"""`vmsandbox secret set|ls|rm`: secrets kept on the host, injected by the egress proxy, never in a VM."""

from __future__ import annotations

import sys
import time
from typing import Annotated

import typer
from rich.table import Table

from vmsandbox import ui
from vmsandbox.cli.base import AsJson, print_json, secret_app
from vmsandbox.errors import VmsandboxError


@secret_app.command("set")
def secret_set(name: Annotated[str, typer.Argument(help="Secret name, e.g. anthropic-api-key.")]) -> None:
    """Store a secret on the host (read from stdin, or typed without echo). It never enters a VM."""
    import getpass

    from vmsandbox.egress import secrets as secretstore

    secretstore.validate_name(name)
    value = getpass.getpass(f"Value for {name}: ", stream=sys.stderr) if sys.stdin.isatty() else sys.stdin.read()
    secretstore.put(name, value)
    ui.info(f"Secret {name} stored in {secretstore.directory()} (0600)")


@secret_app.command("ls")
def secret_ls(as_json: AsJson = False) -> None:
    """List stored secrets (names only, never values)."""
    from vmsandbox.egress import secrets as secretstore

    stored = secretstore.list_all()
    if as_json:
        print_json([{"name": s.name, "set_at": s.set_at, "bytes": s.length} for s in stored])
        return
    if not stored:
        ui.info("No secrets. Store one with `vmsandbox secret set NAME`.")
        return
    table = Table("NAME", "SET", box=None)
    for s in stored:
        table.add_row(s.name, time.strftime("%Y-%m-%d %H:%M", time.localtime(s.set_at)))
    ui.out.print(table)


@secret_app.command("rm")
def secret_rm(name: Annotated[str, typer.Argument(help="Secret name.")]) -> None:
    """Remove a stored secret (running sessions stop getting it at once)."""
    from vmsandbox.egress import secrets as secretstore

    if not secretstore.remove(name):
        raise VmsandboxError(f"no secret named {name!r}", hint="list them with `vmsandbox secret ls`")
    ui.info(f"Secret {name} removed")
