"""Operations on one session by name, for every front end: each opens the session the one way (Record.load),
takes its lock where two commands must not interleave, and does its one thing — make one and leave it running,
stop and start it, run a command or a shell in it, copy files into it, send host edits into it, end it (alone,
as a fan-out, or what a crash left)."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vmsandbox import paths
from vmsandbox.confine import accounts
from vmsandbox.errors import UsageError, VmsandboxError
from vmsandbox.guest import commands
from vmsandbox.guest.ssh import Endpoint
from vmsandbox.session import lock, settings, state
from vmsandbox.session.lock import BusyError
from vmsandbox.session.options import RunFlags
from vmsandbox.session.record import Record, validate_name
from vmsandbox.sync.provenance import steps

if TYPE_CHECKING:
    from vmsandbox.core.person import Person

# What makes, forks, stops, ends or reviews a session is imported by the function that does it: `exec`, `shell`,
# `cp` and `ls` start without it (the review's whole machinery, 28 ms of every such command's start here).

# the record a front end is handed back, the flags of a run, how a session's guest is reached, what a session's
# name is made of (raises with the rule), and another command holding the session
__all__ = ["BusyError", "Endpoint", "Record", "RunFlags", "validate_name"]
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def listing() -> list[dict[str, Any]]:
    """Every session of this account as `ls --json` gives it (state, host, project, age, unsynced changes…)."""
    return [s.as_dict() for s in state.all_status(settings.load().libvirt_uri)]


def private_dir(name: str) -> Path:
    """A directory of the state dir only this account reads (0700, made if missing): where a front end keeps
    what must not be on a command line."""
    where = paths.state_dir() / name
    accounts.make_private_dir(where, traverse=False)
    return where


def empty_project(name: str) -> Path:
    """The empty project, of its own, that a session made on none stands on (E2B's own sandboxes): a private
    directory of the state dir (0700, made if missing), removed with the session by whoever made it."""
    where = paths.sandbox_projects() / name
    accounts.make_private_dir(where, traverse=False)
    return where


def record(name: str) -> Record:
    """The session `name` (raises, with the hint, when there is none)."""
    return Record.load(name)


def create(path: Path, blueprint: str, flags: RunFlags, person: Person) -> Record:
    """A session on `path` made and left running (detached: nothing run in it), the project's credentials
    screened going in as for a run."""
    import vmsandbox.session.start.create
    from vmsandbox.core import flow
    from vmsandbox.session.start import resolve

    flags = dataclasses.replace(flags, keep=True)
    planned = flow.screen(resolve.resolve(path, blueprint, None, flags, agent=False), person, send=flags.send_secrets)
    return vmsandbox.session.start.create.create(planned.options)


def copy_of(name: str, new: str, *, label: str | None = None) -> Record:
    """A new session `new` made from `name`'s state now (or its checkpoint `label`): its files, disks and
    running processes, with its own identity, keys and egress, and the same baseline for its review."""
    from vmsandbox.session.moments import fork

    return fork.fork(name, validate_name(new), label=label)


class DrivenError(VmsandboxError):
    """A session another command drives (the `vmsandbox run` that made it), asked to stop, to go back to a
    checkpoint or to end: refused, the same way and in the same words for every front end."""


def not_driven(found: Record) -> None:
    """Raise DrivenError while the command that made the session still drives it: a person's `vmsandbox run`
    reviews the changes at its end, and would meet a VM stopped, rolled back or gone under it. The one rule for
    `stop`, `checkpoint restore` and `rm` without --force, and for the API's pause, rollback and kill. A session
    this process made is its own (the API server's)."""
    if found.owner_alive() and found.owner_pid != os.getpid():
        raise DrivenError(
            f"session {found.name} is driven by the command that made it (pid {found.owner_pid}, a `vmsandbox run` "
            "or the API server): it is not stopped, restored or ended from elsewhere while that command goes on",
            hint="end that command first (a run reviews the changes at its end), then try again; "
            f"`vmsandbox rm {found.name} --force` takes the session anyway (its unsynced changes kept in its outbox)",
        )


def stop(name: str) -> str:
    """The session's VM saved to disk (memory and devices): what was kept, and where, in words. Refused while a
    run drives it (not_driven)."""
    from vmsandbox.session.moments import suspend

    not_driven(Record.load(name))
    saved = suspend.stop(name)
    try:
        return suspend.where_saved(saved)
    except VmsandboxError:  # (the save is made: a host that no longer answers how big it is fails nothing)
        return "its memory saved"


def start(name: str) -> Record:
    """A stopped session resumed where it was: processes, files, egress, published ports."""
    from vmsandbox.session.moments import suspend

    return suspend.start(name)


def stopped(name: str) -> bool:
    """Whether the session is stopped (saved to disk, to be started again)."""
    return Record.load(name).saved


def ready(name: str) -> Record:
    """The session, able to take a command: raises (with the fix) unless its VM runs; its egress daemon started
    again if it had died (without it the guest has no network)."""
    found = Record.load(name)
    if state.usable(found) is None:
        return found
    # under the session's lock: a `stop`, a checkpoint or an `rm` stops the daemon under it, and another command
    # may be restarting it too
    with lock.briefly(found.files, name, "restarting the egress proxy of"):
        found = Record.load(name)
        why = state.usable(found)  # looked at again: what held the lock may have stopped the VM or restarted it
        if why is not None:
            import vmsandbox.session.start.create
            from vmsandbox import ui

            ui.warn(f"the egress proxy of session {found.name} {why}, so the guest had no network; restarting it")
            with ui.step("Restarting the egress proxy"):
                vmsandbox.session.start.create.open_egress(found)
    return found


@dataclass(frozen=True)
class Where:
    """Where and with what a command runs in a session: `workdir` (relative: to the project directory; None:
    the project directory) and environment variables set for it."""

    workdir: str | None = None
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)


def environment(given: list[str]) -> dict[str, str]:
    """`KEY=VALUE` words as variables (UsageError for one that is not)."""
    found: dict[str, str] = {}
    for word in given:
        key, eq, value = word.partition("=")
        if not eq or ENV_NAME.fullmatch(key) is None:
            raise UsageError(f"--env {word!r}: expected KEY=VALUE", hint="e.g. -e DEBUG=1 (KEY: letters, digits, _)")
        found[key] = value
    return found


def attach(name: str, argv: list[str] | None, *, tty: bool | None, where: Where | None = None) -> int:
    """Run `argv` (None: a login shell) in a running session, in its project directory (or `where`); its exit
    code."""
    found = ready(name)
    where = where or Where()
    workdir = found.project if not where.workdir else str(Path(found.project) / where.workdir)
    if "\n" in workdir or "\x00" in workdir:
        raise UsageError(f"--workdir {where.workdir!r}: a directory name has no newline")
    how = "exec" if argv else "shell"
    endpoint = found.endpoint()
    return steps.run(
        found.files, argv, how, lambda step: commands.attach(endpoint, workdir, argv, tty=tty, env=where.env, step=step)
    )


Step = steps.Step  # one command the session ran (sync.provenance.steps): the API's processes are steps too


def step_begun(record: Record, command: str, how: str) -> Step:
    """A step of the session started now (the guest's wrapper registers its process by the step's id)."""
    return steps.begin(record.files, command, how)


def step_ended(record: Record, step: Step, code: int | None) -> None:
    steps.finish(record.files, step, code)


def copy_in(name: str, sources: list[Path], where: str) -> str:
    """Files of this machine copied into a running session at `where` (relative: under the project); the
    guest path written to."""
    from vmsandbox.sync.inward import cp

    found = ready(name)
    return cp.copy_in(found.target(), found.endpoint(), sources, where)


def push(name: str) -> tuple[list[str], list[str]]:
    """Host edits made during the session sent into its guest, never over a change the guest made: (the paths
    sent, the paths the guest changed too, left as they are on both sides)."""
    import vmsandbox.sync.inward.push
    from vmsandbox.core import reviews

    found = Record.load(name)
    state.usable(found)
    with lock.held(found.files, name, "pushing into"):
        found = Record.load(name)
        return vmsandbox.sync.inward.push.push(found.target(), found.endpoint(), limit=reviews.limit())


@dataclass(frozen=True)
class Removed:
    """How a session went: its unsynced changes (`left`) kept in `outbox`, or a damaged session's directory
    removed (`damaged`)."""

    outbox: Path | None = None
    left: int = 0
    damaged: Path | None = None


def destroy(name: str, *, force: bool = False, discard: bool = False, take: bool = False) -> Removed:
    """The session's VM and files gone: refused while changes are unsynced, unless `force` (they wait in its
    outbox first) or `discard` (thrown away), and while a run drives it (not_driven), unless `take` (a person's
    `rm --force` or `--discard`). With `discard`, a session whose record is damaged goes too."""
    from vmsandbox.core import reviews
    from vmsandbox.session.end import lifecycle

    try:
        found = Record.load(name)
    except VmsandboxError:
        if discard and (gone := lifecycle.remove_damaged(validate_name(name), settings.load().libvirt_uri)):
            return Removed(damaged=gone)
        raise
    if not take:
        not_driven(found)
    with lock.held(found.files, name, "destroying"):
        ended = lifecycle.destroy(Record.load(name), force=force, discard=discard, limit=reviews.limit())
    return Removed(ended.outbox, ended.left)


def group(name: str) -> list[str]:
    """The sessions of the fan-out `name` (raises when there is none)."""
    from vmsandbox.session.moments import fanout

    members = [r.name for r in fanout.group_members(name)]
    if not members:
        raise VmsandboxError(f"no fan-out named {name!r}", hint="`vmsandbox ls --filter group=NAME` lists one")
    return members


def stale(*, dry: bool) -> Iterator[str]:
    """What a crash left, removed (with `dry`, only said): sessions whose VM is gone or whose run was killed
    (kept while they hold unsynced changes, a stopped VM's exported first), and vmsandbox VMs without a session,
    here and on every host of the config. A line per thing done."""
    from vmsandbox.core import reviews
    from vmsandbox.session.end import gc

    loaded = settings.load()
    return gc.gc(loaded.libvirt_uri, limit=reviews.limit(), hosts=loaded.hosts, dry=dry)
