"""`vmsandbox stop`, `start`, `destroy` (and `rm`) and `gc`: pausing sessions and ending them, one, several
or all at once, never silently losing unsynced changes."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Annotated

import typer

from vmsandbox import ui
from vmsandbox.cli.base import ALIASES, AllSessions, SessionNames, app, each_session, sync_limit
from vmsandbox.errors import UsageError, VmsandboxError


def _in_state(*states: str) -> Callable[[], list[str]]:
    def which() -> list[str]:
        from vmsandbox.session import settings as config
        from vmsandbox.session import state

        return [s.record.name for s in state.all_status(config.load().libvirt_uri) if s.state.value in states]

    return which


@app.command()
def stop(names: SessionNames = None, every: AllSessions = False) -> None:
    """Stop sessions, keeping them on disk to start again.

    Their VMs (memory and devices) are saved to disk, freeing CPU and RAM; `vmsandbox start NAME` resumes one
    where it was. `pull`, `diff` and `destroy` work while a session is stopped. `--all`: every running one.

    Examples:

    `vmsandbox stop exp1`

    `vmsandbox stop --all`"""
    from vmsandbox.session.moments import suspend

    def one(name: str) -> None:
        saved = suspend.where_saved(suspend.stop(name))
        ui.info(f"Stopped session [bold]{name}[/] ({saved}); `vmsandbox start {name}` resumes it")

    each_session(names, every, verb="stop", which=_in_state("running", "paused"), act=one)


@app.command()
def start(names: SessionNames = None, every: AllSessions = False) -> None:
    """Start stopped sessions again, where they were.

    Their processes, files, egress and published ports come back. `--all`: every stopped one.

    Examples:

    `vmsandbox start exp1`

    `vmsandbox start --all`"""
    from vmsandbox.session.moments import suspend

    def one(name: str) -> None:
        suspend.start(name)
        ui.info(f"Session [bold]{name}[/] is running again: `vmsandbox shell {name}`")

    each_session(names, every, verb="start", which=_in_state("stopped"), act=one)


Force = Annotated[
    bool, typer.Option("--force", help="Destroy even with unsynced changes (they are exported to the outbox).")
]
Discard = Annotated[bool, typer.Option("--discard", help="Destroy and throw unsynced changes away.")]
Group = Annotated[bool, typer.Option("--group", help="NAME is a fan-out: destroy every session of it.")]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="With --all: do not ask first.")]


@app.command()
def destroy(
    names: SessionNames = None,
    every: AllSessions = False,
    force: Force = False,
    discard: Discard = False,
    group: Group = False,
    yes: Yes = False,
) -> None:
    """Destroy sessions: their VMs and files, never silently losing unsynced changes.

    A session holding changes not yet pulled is refused (`--force` exports them to its outbox first,
    `--discard` throws them away); the others are destroyed. A session whose record is damaged is removed
    with `--discard`. `--all` asks first at a terminal (`--yes` does not ask).

    Examples:

    `vmsandbox destroy exp1 exp2`

    `vmsandbox destroy --group exp` (a fan-out)

    `vmsandbox destroy --all --yes`"""

    def one(name: str) -> None:
        if group:
            _destroy_group(name, force=force, discard=discard)
        else:
            _destroy_one(name, force=force, discard=discard)

    def which() -> list[str]:
        from vmsandbox.session.record import names as all_names

        found = all_names()
        if found and not yes:
            _ask_all(found)
        return found

    if every and group:
        raise UsageError("--group names fan-outs; it does not go with --all", hint="`vmsandbox destroy --all`")
    each_session(names, every, verb="destroy", which=which, act=one)


app.command("rm", help="Same as `destroy`.", rich_help_panel=ALIASES)(destroy)


def _ask_all(found: list[str]) -> None:
    listed = ", ".join(found)
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        raise UsageError(
            f"`destroy --all` would destroy {len(found)} session(s): {listed}",
            hint="add --yes to destroy them without asking (unsynced changes still keep a session)",
        )
    if not typer.confirm(f"Destroy {len(found)} session(s): {listed}?", default=False, err=True):
        raise typer.Exit(1)


def _destroy_one(name: str, *, force: bool, discard: bool) -> None:
    from vmsandbox.session import lock
    from vmsandbox.session import settings as config
    from vmsandbox.session.end import lifecycle
    from vmsandbox.session.record import Record, validate_name

    try:
        record = Record.load(name)
    except VmsandboxError:
        if discard:
            removed = lifecycle.remove_damaged(validate_name(name), config.load().libvirt_uri)
            if removed is not None:
                ui.info(f"Removed the damaged session directory {removed}")
                return
        raise
    with lock.held(record.files, name, "destroying"):
        record = Record.load(name)
        end = lifecycle.destroy(record, force=force, discard=discard, limit=sync_limit())
    ui.info(f"[green]✓[/] Destroyed {record.domain}")
    if end.outbox is not None:
        ui.info(f"{end.left} unsynced change(s) exported to {end.outbox}")
        ui.info(f"Review them later with `vmsandbox recover {name}`; drop them with `destroy {name} --discard`.")


def _destroy_group(group: str, *, force: bool, discard: bool) -> None:
    """Destroy a fan-out's sessions; the ones holding unsynced changes are kept (unless --force/--discard)
    and named, and the command fails if any was."""
    from vmsandbox.session import lock
    from vmsandbox.session.end import lifecycle
    from vmsandbox.session.moments import fanout
    from vmsandbox.session.record import Record

    members = fanout.group_members(group)
    if not members:
        raise VmsandboxError(f"no fan-out named {group!r}", hint="`vmsandbox ls` lists sessions")
    refused = []
    for record in members:
        try:
            with lock.held(record.files, record.name, "destroying"):
                end = lifecycle.destroy(Record.load(record.name), force=force, discard=discard, limit=sync_limit())
        except VmsandboxError as exc:
            refused.append(record.name)
            ui.warn(exc.message)
            continue
        ui.info(
            f"[green]✓[/] Destroyed {record.domain}"
            + (f" ({end.left} change(s) kept in {end.outbox})" if end.outbox else "")
        )
    if refused:
        raise VmsandboxError(
            f"{len(refused)} session(s) of {group} were kept: {', '.join(refused)}",
            hint=f"pull what you want first; `vmsandbox destroy --group {group} --discard` throws the rest away",
        )


@app.command()
def gc(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", "-n", help="Say what would be cleaned up; change nothing.")
    ] = False,
) -> None:
    """Clean up sessions whose VM is gone or whose run was killed, and orphaned VMs.

    Removes sessions whose VM is gone or whose `vmsandbox run` died, and vmsandbox domains without a session
    (here, and this machine's on every host under `hosts:`; a host that does not answer is said and skipped).
    Sessions holding unsynced changes are kept (a stopped VM's changes are exported to its outbox).

    Examples:

    `vmsandbox gc --dry-run`

    `vmsandbox gc`
    """
    from vmsandbox.session import settings as config
    from vmsandbox.session.end import gc as collect

    settings = config.load()
    done = list(collect.gc(settings.libvirt_uri, limit=sync_limit(), hosts=settings.hosts, dry=dry_run))
    for line in done:
        ui.info(line)
    if not done:
        ui.info("Nothing to clean up.")
