"""Operations on one session by name, for every front end: each opens the session the one way (Record.load),
takes its lock where two commands must not interleave, and does its one thing."""

from __future__ import annotations

from vmsandbox.core import reviews
from vmsandbox.session import lock
from vmsandbox.session.end import lifecycle
from vmsandbox.session.record import Record


def destroy(name: str, *, force: bool = False, discard: bool = False) -> lifecycle.End:
    """The session's VM and files gone: refused while changes are unsynced, unless `force` (they wait in its
    outbox first) or `discard` (thrown away)."""
    record = Record.load(name)
    with lock.held(record.files, name, "destroying"):
        return lifecycle.destroy(Record.load(name), force=force, discard=discard, limit=reviews.limit())
