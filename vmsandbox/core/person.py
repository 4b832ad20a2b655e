"""The one port through which the core asks a person: each front end implements it (the terminal's prompts,
the web page, the API's caller), and `Nobody` stands for no one to ask (`--yes`, or no terminal).

What is asked, and when, is the core's (core.flow, core.reviews): a front end only shows what it is handed and
hands back a choice. A choice on a review is a choice on that frozen review (sync.review.frozen): what a person
saw is what is applied."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from vmsandbox import ui
from vmsandbox.session.moments import fanout
from vmsandbox.sync.review.plan import Decisions, Outcome, Plan
from vmsandbox.sync.review.take import Take
from vmsandbox.sync.scan.credentials import Finding

__all__ = ["FanOutcome", "Finding", "Nobody", "Person"]  # (what a person is shown is the core's to hand out)
FanOutcome = fanout.Outcome  # how each session of a fan-out ended


class Person(Protocol):
    """Whoever a session's work asks."""

    def leave_out(self, found: Sequence[Finding]) -> bool:
        """Files of the project that look like credentials, before it goes into the VM: leave them out?"""

    def decide(self, review: Plan) -> Decisions:
        """The guest's changes, as a frozen review: what to apply of it."""

    def told(self, review: Plan, outcome: Outcome) -> None:
        """What the apply did."""

    def keep_login(self, agent: str, files: Sequence[str]) -> bool:
        """The session signed in to `agent` (its login `files` changed): keep that login for later sessions?"""

    def fanned_out(self, group: str, outcomes: Sequence[FanOutcome]) -> None:
        """A fan-out's sessions and what each did."""


@dataclass(frozen=True)
class Nobody:
    """No one to ask: `--yes` (the safe changes, and what `take` takes) or, without it, nothing applied. Files
    that look like credentials stay out; no login is kept (a guest's bytes reach later sessions only on a
    person's yes)."""

    yes: bool = False
    take: Take = field(default_factory=Take)

    def leave_out(self, found: Sequence[Finding]) -> bool:
        return True

    def decide(self, review: Plan) -> Decisions:
        if self.yes:
            return Decisions.safe(review, self.take)
        ui.warn(
            "no terminal to review on and no --yes: nothing applied (rerun with --yes to apply the safe "
            "changes, or on a terminal to choose)"
        )
        return Decisions()

    def told(self, review: Plan, outcome: Outcome) -> None:
        return None

    def keep_login(self, agent: str, files: Sequence[str]) -> bool:
        return False

    def fanned_out(self, group: str, outcomes: Sequence[FanOutcome]) -> None:
        return None
