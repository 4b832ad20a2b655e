"""A run, start to end, in one place: credentials screened going in, the session created, the command or the
agent run, the review, the apply, the login offer, the end. Whoever runs it (the terminal's `run` and agent
commands, a program through the API) hands in a Person (core.person) to ask; the order of the steps is this
module's alone."""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from vmsandbox import ui
from vmsandbox.core import reviews
from vmsandbox.core.person import Person
from vmsandbox.errors import UsageError, VmsandboxError
from vmsandbox.guest import commands
from vmsandbox.image import blueprint
from vmsandbox.session import lock, state
from vmsandbox.session.end import lifecycle
from vmsandbox.session.moments import fanout
from vmsandbox.session.options import Run, RunFlags, take_of
from vmsandbox.session.record import Record
from vmsandbox.session.running import logins
from vmsandbox.session.start import create, resolve
from vmsandbox.sync.inward import leftout
from vmsandbox.sync.provenance import steps

__all__ = ["RunFlags", "take_of"]  # (the flags of a run, and what --yes takes by them, for the front ends)
RUN_FAILED = 125  # the run itself failed (as docker's): the command's own codes are its own


@dataclass(frozen=True)
class Ask:
    """What a run is asked to do: on `path`, with `blueprint`, run `command` (None: a shell; with `agent`, the
    blueprint's agent with these arguments), as `flags` say."""

    path: Path
    blueprint: str
    command: list[str] | None
    flags: RunFlags
    agent: bool = False


@dataclass(frozen=True)
class Ran:
    """How a run ended: the command's exit code, the session, and whether it was kept running."""

    code: int
    record: Record | None
    kept: bool = False
    left: int = 0  # changes not synced back, waiting in the outbox


# What a fan-out never reads: its sessions are kept (`--keep`) for the person to compare and pull one of them.
NOT_FANNED = {"yes": "--yes", "include_risky": "--include-risky", "include_ignored": "--include-ignored",
              "include_binary": "--include-binary", "include_mass": "--include-mass", "keep": "--keep"}  # fmt: skip


def check_fanout(flags: RunFlags) -> None:
    """A fan-out asked of the flags, checked before anything is looked up: a number of sessions it can start,
    and no option it would not read (UsageError)."""
    if flags.check is not None and flags.fanout is None:
        raise UsageError("--check goes with --fanout", hint="e.g. `vmsandbox run --fanout 3 --check 'make test' .`")
    if flags.fanout is None:
        return
    if not 1 <= flags.fanout <= fanout.MAX_SESSIONS:
        raise UsageError(f"--fanout {flags.fanout}: a fan-out starts 1 to {fanout.MAX_SESSIONS} sessions")
    unread = [flag for key, flag in NOT_FANNED.items() if getattr(flags, key)]
    unread += ["--review web"] if flags.review != "terminal" else []
    unread += ["--tty"] if flags.tty is not None else []
    if unread:
        raise UsageError(
            f"{unread[0]} does not go with --fanout: a fan-out keeps every session, reviewed by none",
            hint="compare them with `vmsandbox diff NAME-1 --against NAME-2 --stat`, then `vmsandbox pull NAME-1`",
        )


def run(ask: Ask, person: Person) -> Ran:
    """The whole run (see the module's notes)."""
    check_fanout(ask.flags)
    resolved = resolve.resolve(ask.path, ask.blueprint, ask.command, ask.flags, agent=ask.agent)
    planned = screen(resolved, person, send=ask.flags.send_secrets)
    if ask.flags.fanout is not None:
        return fan_out(planned, ask.flags.fanout, ask.flags.check, person)
    record = create.create(planned.options)
    code, left = RUN_FAILED, 0
    try:
        endpoint, how = record.endpoint(), "agent" if ask.agent else "run"
        code = steps.run(
            record.files, planned.command, how,
            lambda step: commands.attach(endpoint, record.project, planned.command, tty=planned.tty, step=step),
        )  # fmt: skip
        if code == commands.SSH_FAILED and state.stops_within(record, seconds=15):
            ui.warn(f"the VM shut down while the command ran; its console log: `vmsandbox logs {record.name}`")
    finally:
        if not planned.options.keep:
            left = end(record, person)
    if planned.options.keep:
        return Ran(code, record, kept=True)
    return Ran(code, record, left=left)


def screen(planned: Run, person: Person, *, send: bool) -> Run:
    """`planned` with the project's files that look like credentials left out of the VM, unless the run sends
    them (--send-secrets) or the person says so."""
    with ui.step("Looking for credentials in the project before it goes into the VM"):
        found = leftout.credentials_in(planned.options.project.resolve())
    if not found or send or not person.leave_out(found):
        return planned
    ui.info(
        "They stay out of the VM (the project keeps them). To send them: `--send-secrets`; to leave out more, or to "
        f"silence this, name paths in {leftout.IGNORE_FILE} (gitignore syntax); secrets the agent needs go through "
        "`vmsandbox secret set` (the VM sees a placeholder)"
    )
    options = dataclasses.replace(planned.options, leave_out=tuple(f.path for f in found))
    return dataclasses.replace(planned, options=options)


def fan_out(planned: Run, n: int, check: str | None, person: Person) -> Ran:
    """N sessions from one capture, each running the command; what each did told to the person. Exit 0 when
    every session's command (and check) passed."""
    group, names = fanout.names(planned, n)
    named = dataclasses.replace(planned, options=dataclasses.replace(planned.options, name=group))
    ui.info(f"Fan-out [bold]{group}[/]: {n} session(s), {names[0]} … {names[-1]}")
    outcomes = fanout.fan_out(named, n, check, limit=reviews.limit())  # (the group named once: the one printed)
    person.fanned_out(group, outcomes)
    return Ran(0 if outcomes and all(o.ok for o in outcomes) else 1, None, kept=True)


def end(record: Record, person: Person) -> int:
    """The end of a run: its changes reviewed by the person and applied, a login the guest made offered, and the
    VM destroyed in the background (what was not synced waits in the outbox first: nothing is lost). The number
    of changes left."""
    with lock.held(record.files, record.name, reviews.REVIEWING):
        record = Record.load(record.name)
        plan = lifecycle.review(record, limit=reviews.limit())
        outcome = reviews.conduct(record, plan, person)
        offer_login(record, person)
        keeping = ui.step("Keeping the unsynced changes in the session's outbox") if outcome.left else nullcontext()
        with keeping:
            ended = lifecycle.finish(record, plan.gathered, background=True)
    ui.info(f"[dim]{record.domain} goes in the background (`vmsandbox rm --stale` finishes it if interrupted)[/]")
    if ended.left:
        ui.warn(
            f"{ended.left} change(s) were not synced back; review them in the browser with `vmsandbox ui "
            f"{record.name}`, or at the terminal with `vmsandbox pull {record.name}`"
        )
    return ended.left


def offer_login(record: Record, person: Person) -> None:
    """A login the guest made (or refreshed) kept for later sessions, if the person says so."""
    try:
        bp = blueprint.load(record.blueprint, Path(record.project))
        fresh = logins.changed(record, bp) if bp.login_files else {}
    except VmsandboxError:
        return  # no blueprint any more, or a guest that no longer answers: nothing to offer
    if fresh and person.keep_login(bp.name, sorted(fresh)):
        kept = logins.keep(bp, fresh)
        ui.info(f"[green]✓[/] {bp.name}'s login kept ({', '.join(kept)}); later {bp.name} sessions start signed in")
