"""Reviews, for every front end: a session's changes as a frozen review (sync.review.frozen), a person's
decisions on exactly that review carried out, the outcome told. The terminal's `pull` and `recover`, the end of
a run, the session page, the compare page and the API all come through here; none of them gathers, decides and
applies in an order of its own."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from vmsandbox.core.person import Person
from vmsandbox.session import lock, settings
from vmsandbox.session.end import lifecycle
from vmsandbox.session.record import Record
from vmsandbox.sync.review.frozen import StaleError
from vmsandbox.sync.review.plan import Decisions, Outcome, Plan

REVIEWING = lock.REVIEWING
__all__ = ["StaleError"]  # (a review that was applied already, or replaced: raised by apply)
T = TypeVar("T")


def limit() -> int:
    """The sync budget: bytes a pull writes at most (the user's config)."""
    return settings.sync_limit()


def record(name: str) -> Record:
    """The session `name` (raises, with the hint, when there is none)."""
    return Record.load(name)


def exists(name: str) -> None:
    """Raise, with the hint, unless `name` is a session."""
    Record.load(name)


def review(name: str, *, only: list[str] | None = None, freeze: bool = True) -> Plan:
    """The session's changes now, frozen as they are shown (fetched from the guest, or its disk or outbox); not
    frozen when it is only read (`diff`: no apply takes it)."""
    record = Record.load(name)
    with lock.held(record.files, name, REVIEWING):
        return lifecycle.review(Record.load(name), limit=limit(), only=only, freeze=freeze)


def look(name: str, show: Callable[[Plan], T], *, review_id: str | None = None, only: list[str] | None = None) -> T:
    """What `show` makes of a review of the session, under the session's lock (no pull changes the mirror
    meanwhile): a new review (fetched, frozen), or the one `review_id` names as it was shown (nothing fetched)."""
    record = Record.load(name)
    with lock.held(record.files, name, REVIEWING):
        record = Record.load(name)
        if review_id:
            return show(lifecycle.reviewed(record, review_id))
        return show(lifecycle.review(record, limit=limit(), only=only))


def reviewed(name: str, review_id: str) -> Plan:
    """A review of the session made earlier, as it was shown (nothing fetched again)."""
    return lifecycle.reviewed(Record.load(name), review_id)


def conduct(record: Record, plan: Plan, person: Person) -> Outcome:
    """A frozen review put to a person, what they decided carried out on it, and the outcome told (an empty
    review is told too: a person waits to hear that nothing changed)."""
    decisions = Decisions() if plan.empty else person.decide(plan)
    outcome = lifecycle.decide(record, plan, decisions)
    person.told(plan, outcome)
    return outcome


@dataclass(frozen=True)
class Settled:
    outcome: Outcome
    removed: bool  # every change of a session whose VM was gone is dealt with: the session went with it


def pull(name: str, person: Person, *, only: list[str] | None = None) -> Settled:
    """`pull`/`recover`: the session's changes reviewed by `person` and applied; a session whose VM is gone and
    whose every change is dealt with is removed."""
    record = Record.load(name)
    with lock.held(record.files, name, REVIEWING):
        record = Record.load(name)  # as the holder before us left it
        plan = lifecycle.review(record, limit=limit(), only=only)
        outcome = conduct(record, plan, person)
        return Settled(outcome, lifecycle.settle(record, outcome))


def apply(name: str, review_id: str, decide: Callable[[Plan], Decisions]) -> Settled:
    """Decisions (`decide`, on the review a page or a client was shown) carried out on that frozen review."""
    record = Record.load(name)
    with lock.held(record.files, name, REVIEWING):
        record = Record.load(name)
        plan = lifecycle.reviewed(record, review_id)
        outcome = lifecycle.decide(record, plan, decide(plan))
        return Settled(outcome, lifecycle.settle(record, outcome))
