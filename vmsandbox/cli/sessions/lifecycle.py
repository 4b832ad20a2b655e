"""`vmsandbox stop`, `start` and `rm`: pausing sessions and ending them — one, several, all, a fan-out, or what a
crash left — never silently losing unsynced changes."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Annotated

import typer

from vmsandbox import ui
from vmsandbox.cli.base import AllSessions, SessionNames, app, each_session
from vmsandbox.errors import UsageError, VmsandboxError


def _in_state(*states: str) -> Callable[[], list[str]]:
    def which() -> list[str]:
        from vmsandbox.core import listing

        return listing.in_state(*states)

    return which


@app.command()
def stop(names: SessionNames = None, every: AllSessions = False) -> None:
    """Stop sessions, keeping them on disk to start again.

    Unlike `docker stop`, nothing is killed: their VMs (memory and devices) are saved to disk, freeing CPU and RAM,
    and `vmsandbox start NAME` resumes one where it was, its processes running on. `pull`, `diff` and `rm` work
    while a session is stopped. `--all`: every running one.

    Examples: `vmsandbox stop exp1` · `vmsandbox stop --all`"""
    from vmsandbox.core import sessions

    def one(name: str) -> None:
        saved = sessions.stop(name)
        ui.info(f"Stopped session [bold]{name}[/] ({saved}); `vmsandbox start {name}` resumes it")

    each_session(names, every, verb="stop", which=_in_state("running", "paused"), act=one)


@app.command()
def start(names: SessionNames = None, every: AllSessions = False) -> None:
    """Start stopped sessions again, where they were.

    Their processes, files, egress and published ports come back. `--all`: every stopped one.

    Examples: `vmsandbox start exp1` · `vmsandbox start --all`"""
    from vmsandbox.core import sessions

    def one(name: str) -> None:
        sessions.start(name)
        ui.info(f"Session [bold]{name}[/] is running again: `vmsandbox shell {name}`")

    each_session(names, every, verb="start", which=_in_state("stopped"), act=one)


Force = Annotated[
    bool, typer.Option("--force", "-f", help="Even with unsynced changes: they are kept in its outbox first.")
]
Discard = Annotated[bool, typer.Option("--discard", help="Even with unsynced changes: they are thrown away.")]
Group = Annotated[bool, typer.Option("--group", help="NAME is a fan-out: every session of it.")]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="With --all: do not ask first.")]
Stale = Annotated[
    bool, typer.Option("--stale", help="What a crash left: sessions whose VM or run is gone, VMs without a session.")
]
DryRun = Annotated[bool, typer.Option("--dry-run", "-n", help="With --stale: say what would go; change nothing.")]


@app.command("rm")
def rm(
    names: SessionNames = None,
    every: AllSessions = False,
    force: Force = False,
    discard: Discard = False,
    group: Group = False,
    yes: Yes = False,
    stale: Stale = False,
    dry_run: DryRun = False,
) -> None:
    """Remove sessions: their VMs and files, never silently losing unsynced changes.

    A running session goes too (no -f needed, unlike `docker rm`). One holding changes not yet pulled is refused:
    `-f` keeps them in its outbox first, for `vmsandbox pull NAME`; `--discard` throws them away. A session whose
    record is damaged goes with `--discard`. `--all` asks first at a terminal (`--yes` does not). `--stale`
    removes what crashes and kill -9 left (a session holding unsynced changes stays), here and on every host of
    your config.

    Examples: `vmsandbox rm exp1 exp2` · `vmsandbox rm -f exp1` · `vmsandbox rm --group exp` (a fan-out) ·
    `vmsandbox rm --all --yes` · `vmsandbox rm --stale --dry-run`"""
    if stale:
        if names or every or group or force or discard:
            raise UsageError("--stale finds what to remove itself: it takes no names, --all, --group, -f or --discard")
        _stale(dry_run)
        return
    if dry_run:
        raise UsageError("--dry-run goes with --stale", hint="`vmsandbox rm --stale --dry-run`")
    if every and group:
        raise UsageError("--group names fan-outs; it does not go with --all", hint="`vmsandbox rm --all`")

    def one(name: str) -> None:
        if group:
            _remove_group(name, force=force, discard=discard)
        else:
            _remove(name, force=force, discard=discard)

    def which() -> list[str]:
        from vmsandbox.core import listing

        found = listing.names()
        if found and not yes:
            _ask_all(found)
        return found

    each_session(names, every, verb="rm", which=which, act=one)


def _ask_all(found: list[str]) -> None:
    listed = ", ".join(found)
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        raise UsageError(
            f"`rm --all` would remove {len(found)} session(s): {listed}",
            hint="add --yes to remove them without asking (unsynced changes still keep a session)",
        )
    if not typer.confirm(f"Remove {len(found)} session(s): {listed}?", default=False, err=True):
        raise typer.Exit(1)


def _remove(name: str, *, force: bool, discard: bool) -> None:
    from vmsandbox.core import sessions

    gone = sessions.destroy(name, force=force, discard=discard, take=force or discard)
    if gone.damaged is not None:
        ui.info(f"Removed the damaged session directory {gone.damaged}")
        return
    ui.info(f"[green]✓[/] Removed session {name}")
    if gone.outbox is not None:
        ui.info(f"{gone.left} unsynced change(s) kept in {gone.outbox}")
        ui.info(f"Review them with `vmsandbox pull {name}`; drop them with `vmsandbox rm {name} --discard`.")


def _remove_group(group: str, *, force: bool, discard: bool) -> None:
    """A fan-out's sessions removed; the ones holding unsynced changes are kept (unless -f/--discard) and named,
    and the command fails if any was."""
    from vmsandbox.core import sessions

    refused = []
    for name in sessions.group(group):
        try:
            gone = sessions.destroy(name, force=force, discard=discard, take=force or discard)
        except VmsandboxError as exc:
            refused.append(name)
            ui.warn(exc.message)
            continue
        kept = f" ({gone.left} change(s) kept in {gone.outbox})" if gone.outbox else ""
        ui.info(f"[green]✓[/] Removed session {name}{kept}")
    if refused:
        raise VmsandboxError(
            f"{len(refused)} session(s) of {group} were kept: {', '.join(refused)}",
            hint=f"pull what you want first; `vmsandbox rm --group {group} --discard` throws the rest away",
        )


def _stale(dry: bool) -> None:
    from vmsandbox.core import sessions

    done = list(sessions.stale(dry=dry))
    for line in done:
        ui.info(line)
    if not done:
        ui.info("Nothing stale: every session's VM is where its record says.")
