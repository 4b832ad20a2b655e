"""The review at the end of a run, in the browser (`run --review web`): a Person (core.person) that puts the
frozen review the run made to the person on the page and hands their choices back to the run, which applies them
and hands the outcome back for the page to show. What else a run asks (credentials going in, a login) is asked
of `other` (the terminal)."""

from __future__ import annotations

import queue
from collections.abc import Sequence

from vmsandbox import ui
from vmsandbox.core.person import FanOutcome, Finding, Person
from vmsandbox.core.views import Decisions, Outcome, Plan
from vmsandbox.web import server


class Page:
    def __init__(self, other: Person, *, browser: bool = True) -> None:
        self.other = other
        self.browser = browser
        self.review: Plan | None = None
        self._chosen: queue.Queue[Decisions] = queue.Queue(maxsize=1)
        self._outcome: queue.Queue[Outcome] = queue.Queue(maxsize=1)
        self._server: server.Server | None = None

    def leave_out(self, found: Sequence[Finding]) -> bool:
        return self.other.leave_out(found)

    def keep_login(self, agent: str, files: Sequence[str]) -> bool:
        return self.other.keep_login(agent, files)

    def fanned_out(self, group: str, outcomes: Sequence[FanOutcome]) -> None:
        self.other.fanned_out(group, outcomes)

    def decide(self, review: Plan) -> Decisions:
        """Served until the person applies on the page (or Ctrl-C: nothing applied, all of it waits)."""
        self.review = review
        self._server = server.Server(handoff=self)
        self._server.start()
        ui.info("Review the changes in your browser; the VM ends once they are applied (Ctrl-C: leave them pending)")
        self._server.give(server.path_of(review.gathered.target.name, review.id), browser=self.browser)
        try:
            return self._chosen.get()
        except KeyboardInterrupt:
            self._server.stop()
            self._server = None
            return Decisions()

    def told(self, review: Plan, outcome: Outcome) -> None:
        if self._server is None:
            return
        self._outcome.put(outcome)
        self._server.stop()  # (the page's answer, in flight, is finished first)
        self._server = None

    # -- the page's side (web/app.py, in a request's thread) --------------------------------------------------
    def takes(self, name: str, review_id: str) -> Plan | None:
        """The review the run waits for, if that is the one a page's apply names."""
        r = self.review
        return r if r is not None and r.gathered.target.name == name and r.id == review_id else None

    def hand_back(self, decisions: Decisions) -> Outcome:
        """The page's choices to the run; the outcome once the run applied them."""
        self._chosen.put(decisions)
        return self._outcome.get()
