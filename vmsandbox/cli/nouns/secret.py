"""`vmsandbox secret set|ls|rm`: secrets kept on the host, injected by the egress proxy, never in a VM."""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from vmsandbox import ui
from vmsandbox.cli.base import AsJson, Quiet, columns, print_json, secret_app
from vmsandbox.errors import VmsandboxError


@secret_app.command("set")
def secret_set(
    name: Annotated[str, typer.Argument(help="Secret name, e.g. anthropic-api-key.", metavar="NAME")],
) -> None:
    """Store a secret on the host; it never enters a VM.

    Store a secret on the host (read from stdin, or typed without echo). It never enters a VM.

    Example: `vmsandbox secret set anthropic-api-key`"""
    import getpass

    from vmsandbox.egress import secrets as secretstore

    secretstore.validate_name(name)
    value = getpass.getpass(f"Value for {name}: ", stream=sys.stderr) if sys.stdin.isatty() else sys.stdin.read()
    secretstore.put(name, value)
    ui.info(f"Secret {name} stored in {secretstore.directory()} (0600)")
    _handed_again(name)
    if (unused := unused_warning(name, secret_users())) is not None:
        ui.warn(unused)


def secret_users() -> dict[str, str]:
    """Which secret names something reads: each blueprint's mappings and the user's config."""
    from vmsandbox.image import blueprint
    from vmsandbox.session import settings as config

    users: dict[str, str] = {}
    for bp in sorted(blueprint.available(Path.cwd())):
        with contextlib.suppress(VmsandboxError):  # a broken blueprint says so when it is used
            for mapping in blueprint.load(bp, Path.cwd()).secrets:
                users.setdefault(str(mapping.get("secret")), f"the {bp} blueprint")
    for m in config.load().secrets:
        users.setdefault(m.secret, "your config")
    return users


def unused_warning(name: str, users: dict[str, str]) -> str | None:
    """A warning when nothing reads a secret of this name (a typo, `_` for `-`), naming the close ones."""
    if name in users:
        return None

    def norm(n: str) -> str:
        return n.lower().replace("_", "-").replace(".", "-")

    close = [u for u in users if norm(u) == norm(name)]
    if close:
        return f"nothing reads a secret named {name!r}; {users[close[0]]} reads {close[0]!r}: " + (
            f"store it as `vmsandbox secret set {close[0]}` (and `vmsandbox secret rm {name}`)"
        )
    known = ", ".join(sorted(users)) or "none"
    return f"no blueprint or config reads a secret named {name!r} yet (the names they read: {known})"


@secret_app.command("ls")
def secret_ls(as_json: AsJson = False, quiet: Quiet = False) -> None:
    """List stored secrets (names only, never values).

    Example: `vmsandbox secret ls --json`"""
    from vmsandbox.egress import secrets as secretstore

    stored = secretstore.list_all()
    if as_json:
        print_json([{"name": s.name, "set_at": s.set_at, "bytes": s.length} for s in stored])
        return
    if quiet:
        for s in stored:
            print(s.name)
        return
    if not stored:
        ui.info("No secrets. Store one with `vmsandbox secret set NAME`.")
        return
    columns(["NAME", "SET"], [[s.name, time.strftime("%Y-%m-%d %H:%M", time.localtime(s.set_at))] for s in stored])


@secret_app.command("rm")
def secret_rm(name: Annotated[str, typer.Argument(help="Secret name.", metavar="NAME")]) -> None:
    """Remove a stored secret (running sessions stop getting it at once).

    Example: `vmsandbox secret rm anthropic-api-key`"""
    from vmsandbox.egress import secrets as secretstore

    if not secretstore.remove(name):
        raise VmsandboxError(f"no secret named {name!r}", hint="list them with `vmsandbox secret ls`")
    ui.info(f"Secret {name} removed")
    _handed_again(name)


def _handed_again(name: str) -> None:
    """Running sessions that inject the secret get it anew (their egress daemon restarts: it holds only what it
    was handed)."""
    from vmsandbox.session.running import reach as runtime

    for session, failed in runtime.secret_changed(name).items():
        if failed is None:
            ui.info(f"session {session}: its egress proxy restarted with the change (open connections were cut)")
        else:
            ui.warn(
                f"session {session}: its egress proxy did not restart ({failed}); `vmsandbox stop {session}` "
                f"and `vmsandbox start {session}` retry"
            )
