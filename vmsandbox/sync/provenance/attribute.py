"""A review's provenance: the guest journal's answer traced over the review's changes, beside the host's steps.

A live review asks the guest's journal (answer.py) and traces each changed file it names over the texts the
review reads (the baseline's, and the guest's as the review saw it: blame.py), then keeps the result in the
session directory (store.py); a review of a stopped VM's disk or of its outbox, where no journal answers, takes
the one kept. Provenance only informs a person: whatever goes wrong making it leaves a review without it (saying
why), never without the review.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path

from vmsandbox import ui
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest.ssh import Endpoint
from vmsandbox.paths import SessionPaths
from vmsandbox.sync.land import write
from vmsandbox.sync.provenance import answer, blame, steps, store
from vmsandbox.sync.provenance.answer import Answer
from vmsandbox.sync.provenance.model import FileOrigin, Provenance, Step
from vmsandbox.sync.review.threeway import Change
from vmsandbox.sync.tree.manifest import FILE

log = logging.getLogger(__name__)

LIMIT = answer.MAX_VERSION_BYTES  # the largest text traced (a larger one has no versions kept: nothing to trace)
GUEST_STEP = "(registered in the guest)"  # the command of a step only the guest names
NO_ANSWER = "the guest's journal did not answer"
NOT_ASKED = "the guest's journal was not asked while the VM ran"
UNREAD = "its content could not be read again to trace it"
MAX_GUEST_STEPS = 100  # steps only the guest registered, kept (the rest counted)
MAX_TRACED_LINES = 2_000_000  # lines traced per review over all its files (then the rest have only their writers)
TOO_MANY_LINES = f"not traced per line: the review's files have more than {MAX_TRACED_LINES:,} lines traced"
TRACE_SECONDS = 20.0  # spent tracing a review's files at most (then the rest have their writers, not their lines)


def provenance(
    found: Answer | None, host: tuple[Step, ...], changes: list[Change], baseline_root: Path, source_root: Path
) -> Provenance:
    """The journal's answer (`found`; None: there was none) over the review's `changes`: each changed file it names
    traced over the baseline's text (under `baseline_root`) and the guest's (under `source_root`, as reviewed).
    The steps are the host's (`host`), and those only the guest registered."""
    every = _steps(host, found.steps if found is not None else {})
    if found is None:
        return Provenance(every, {}, {}, incomplete=NO_ANSWER)
    more = _more_guest_steps(host, found.steps)
    deadline = time.monotonic() + TRACE_SECONDS
    files: dict[str, FileOrigin] = {}
    traced = 0  # lines (and removals) kept over all files: what a frozen review stores
    for c in changes:
        if c.path not in found.files and c.path not in found.versions:
            continue
        o = _origin(found, c, baseline_root, source_root, deadline)
        if o.lines is not None:
            size = len(o.lines) + len(o.removed)
            if traced + size > MAX_TRACED_LINES:
                o = FileOrigin(o.writers, incomplete=TOO_MANY_LINES)
            else:
                traced += size
        files[c.path] = o
    named = {n for o in files.values() for n in (*o.writers, *(o.lines or ()), *o.removed.values())}
    writers = {n: w for n, w in found.writers.items() if n in named}  # (those of files not changed left out)
    return Provenance(every, writers, files, _partial(found.incomplete, more), usage=found.usage)


def for_review(
    files: SessionPaths, changes: list[Change], source: Path, endpoint: Endpoint | None
) -> Provenance | None:
    """The provenance of a review of `changes` (the guest's content under `source`): asked of the journal at
    `endpoint` and kept, or (no endpoint: the VM does not run) as last kept, with the host's steps of now. None
    when there is neither an answer kept nor a step."""
    try:
        host = steps.read(files)
    except (OSError, ValueError) as exc:
        log.warning("the session's steps could not be read: %s", exc)
        host = ()
    if endpoint is None:
        kept = store.load(files.root, changes)
        if kept is None:
            return Provenance(host, {}, {}, incomplete=NOT_ASKED) if host else None
        guest_only = {s.id: 0 for s in kept.steps if s.how == "guest"}
        return Provenance(_steps(host, guest_only), kept.writers, kept.files, kept.incomplete)
    try:
        with ui.step("Asking the guest which process wrote each change"):
            found = answer.ask(endpoint)
        prov = provenance(found, host, changes, files.baseline, source)
    except (VmsandboxError, OSError, ValueError) as exc:
        log.warning("no provenance for this review: %s", exc)
        return Provenance(host, {}, {}, incomplete=f"who wrote what could not be found out ({exc})")
    try:
        store.save(files.root, prov, changes)
    except OSError as exc:
        log.warning("the provenance of this review was not kept: %s", exc)
    return prov


def _steps(host: tuple[Step, ...], registered: Mapping[str, int]) -> tuple[Step, ...]:
    """The host's steps, then those only the guest registered (no time: no egress), at most MAX_GUEST_STEPS of
    them in the answer's order."""
    known = {s.id for s in host}
    guest = [i for i in registered if i not in known][:MAX_GUEST_STEPS]
    return host + tuple(Step(i, GUEST_STEP, 0.0, how="guest") for i in guest)


def _more_guest_steps(host: tuple[Step, ...], registered: Mapping[str, int]) -> str | None:
    """What is said of the steps only the guest registered past MAX_GUEST_STEPS (None: none left out)."""
    known = {s.id for s in host}
    more = sum(1 for i in registered if i not in known) - MAX_GUEST_STEPS
    return f"{more} more step(s) registered in the guest are not shown" if more > 0 else None


def _partial(*why: str | None) -> str | None:
    said = [w for w in why if w]
    return "; ".join(said) if said else None


def _origin(found: Answer, c: Change, baseline_root: Path, source_root: Path, deadline: float) -> FileOrigin:
    versions = found.versions.get(c.path, [])
    flag, writers = found.files.get(c.path, ("-", tuple(dict.fromkeys(w for w, _ in versions))))
    if c.binary or any(e is not None and e.kind != FILE for e in (c.base, c.guest)):
        return FileOrigin(writers)  # no lines to trace (not text, or not a file)
    try:
        base = write.read_nofollow(baseline_root, c.path, limit=LIMIT) if c.base is not None else None
        final = write.read_as_reviewed(source_root, c.path, c.guest, limit=LIMIT)
    except (VmsandboxError, OSError):
        return FileOrigin(writers, incomplete=UNREAD)
    if final is None or (c.base is not None and base is None):
        return FileOrigin(writers, incomplete=blame.TOO_LONG)
    return blame.origin(base, final, versions, writers, flag, deadline=deadline)
