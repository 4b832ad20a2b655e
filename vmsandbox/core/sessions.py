"""Operations on one session by name, for every front end: each opens the session the one way (Record.load),
takes its lock where two commands must not interleave, and does its one thing."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from vmsandbox import paths
from vmsandbox.confine import accounts
from vmsandbox.core import flow, reviews
from vmsandbox.core.person import Person
from vmsandbox.session import lock, state
from vmsandbox.session import settings as config
from vmsandbox.session.end import lifecycle
from vmsandbox.session.options import RunFlags
from vmsandbox.session.record import Record
from vmsandbox.session.start import create as creating
from vmsandbox.session.start import resolve


def listing() -> list[dict[str, Any]]:
    """Every session of this account as `ls --json` gives it (state, host, project, age, unsynced changes…)."""
    return [s.as_dict() for s in state.all_status(config.load().libvirt_uri)]


def private_dir(name: str) -> Path:
    """A directory of the state dir only this account reads (0700, made if missing): where a front end keeps
    what must not be on a command line."""
    where = paths.state_dir() / name
    accounts.make_private_dir(where, traverse=False)
    return where


def destroy(name: str, *, force: bool = False, discard: bool = False) -> lifecycle.End:
    """The session's VM and files gone: refused while changes are unsynced, unless `force` (they wait in its
    outbox first) or `discard` (thrown away)."""
    record = Record.load(name)
    with lock.held(record.files, name, "destroying"):
        return lifecycle.destroy(Record.load(name), force=force, discard=discard, limit=reviews.limit())


def create(path: Path, blueprint: str, flags: RunFlags, person: Person) -> Record:
    """A session on `path` made and left running (detached: nothing run in it), the project's credentials
    screened going in as for a run."""
    flags = dataclasses.replace(flags, keep=True)
    planned = flow.screen(resolve.resolve(path, blueprint, None, flags, agent=False), person, send=flags.send_secrets)
    return creating.create(planned.options)
