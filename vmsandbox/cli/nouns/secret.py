"""`vmsandbox secret set|ls|rm|wipe`: secrets kept on the host, put into a session's requests by its egress proxy
(the guest sees a placeholder), and the credentials a running session holds wiped."""

from __future__ import annotations

import sys
import time
from typing import Annotated

import typer

from vmsandbox import ui
from vmsandbox.cli import complete, output
from vmsandbox.cli.base import SessionName, noun
from vmsandbox.cli.output import AsJson, Column, Listing, Output, Quiet

secret = noun(
    "secret",
    "Secrets kept on the host, never in a VM: set, ls, rm, wipe.\n\n"
    "A session's egress proxy puts them into the requests that need them; the guest sees a placeholder.\n\n"
    "Example: `vmsandbox secret set anthropic-api-key`",
)


@secret.command("set")
def set_(
    name: Annotated[
        str,
        typer.Argument(help="Its name, e.g. anthropic-api-key.", metavar="NAME", autocompletion=complete.secret_names),
    ],
) -> None:
    """Store a secret on the host; it never enters a VM.

    It is read from stdin, or typed without echo at a terminal. Running sessions that use it get it at once.

    Example: `vmsandbox secret set anthropic-api-key`"""
    import getpass

    from vmsandbox.core import secrets

    secrets.check_name(name)
    value = getpass.getpass(f"Value for {name}: ", stream=sys.stderr) if sys.stdin.isatty() else sys.stdin.read()
    where = secrets.put(name, value)
    ui.info(f"Secret {name} stored in {where} (0600)")
    _handed_again(name)
    if (unread := secrets.unread(name, secrets.readers())) is not None:
        ui.warn(unread)


SECRETS = Listing(
    fields=("name", "set_at", "bytes"),
    columns=(
        Column("name"),
        Column("set", made=lambda r: time.strftime("%Y-%m-%d %H:%M", time.localtime(r["set_at"]))),
    ),
    example="{{.Name}} {{.Bytes}}",
)


@secret.command("ls")
def ls(
    as_json: AsJson = False,
    quiet: Quiet = False,
    fmt: Annotated[str | None, output.format_option(SECRETS.example)] = None,
    wide: Output = None,
) -> None:
    """List stored secrets (names only, never values).

    Examples: `vmsandbox secret ls --json` · `vmsandbox secret ls --format '{{.Name}} {{.Set}}'`"""
    from vmsandbox.core import secrets

    shape = SECRETS.shape(as_json=as_json, quiet=quiet, fmt=fmt, output=wide)
    rows = [{"name": s.name, "set_at": s.set_at, "bytes": s.length} for s in secrets.listed()]
    SECRETS.show(rows, shape, empty="No secrets. Store one with `vmsandbox secret set NAME`.")


@secret.command("rm")
def rm(
    name: Annotated[str, typer.Argument(help="A stored secret.", metavar="NAME", autocompletion=complete.secrets)],
) -> None:
    """Remove a stored secret; running sessions stop getting it at once.

    Example: `vmsandbox secret rm anthropic-api-key`"""
    from vmsandbox.core import secrets

    secrets.remove(name)
    ui.info(f"Secret {name} removed")
    _handed_again(name)


def _handed_again(name: str) -> None:
    from vmsandbox.core import secrets

    for session, failed in secrets.handed_again(name).items():
        if failed is None:
            ui.info(f"session {session}: its egress proxy restarted with the change (open connections were cut)")
        else:
            ui.warn(
                f"session {session}: its egress proxy did not restart ({failed}); `vmsandbox stop {session}` "
                f"and `vmsandbox start {session}` retry"
            )


@secret.command("wipe")
def wipe(name: SessionName) -> None:
    """Wipe the credentials a running session holds.

    Agent login files and git credentials in the guest are removed, and the placeholders its proxy swaps for your
    secrets stop working; the workspace is not touched.

    Example: `vmsandbox secret wipe exp1`"""
    from vmsandbox.core import watch

    removed = watch.wipe(name)
    for path in removed:
        ui.err.print(f"  [red]removed[/] {ui.printable(path)}")
    ui.info(f"Session {name}: {len(removed)} credential file(s) removed, placeholders revoked; workspace untouched.")
