"""One flow, every front end: a run driven by the person at a terminal (`--yes`), by the page in a browser
(`--review web`) and by nobody takes the same steps in the same order, all of them the core's (core.flow); the
front ends differ only in what the person answers. The steps below the core are recorded, not carried out."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vmsandbox.core import flow
from vmsandbox.core.person import Nobody, Person
from vmsandbox.session.options import Options, Run, RunFlags
from vmsandbox.sync.review.plan import Decisions, Outcome
from vmsandbox.sync.review.take import Take
from vmsandbox.sync.scan.credentials import Finding

from .conftest import saved_record

STEPS = [
    "resolve", "credentials", "create", "attach", "lock", "review", "decide", "apply", "told", "login",
    "finish", "unlock",
]  # fmt: skip


class Recorder:
    def __init__(self) -> None:
        self.steps: list[str] = []
        self.decisions: list[Decisions] = []


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Recorder]:
    """The modules the flow calls, each recording its step and answering the least the flow needs."""
    import contextlib

    from vmsandbox.guest import commands
    from vmsandbox.image import blueprint
    from vmsandbox.session import lock
    from vmsandbox.session.end import lifecycle
    from vmsandbox.session.running import logins
    from vmsandbox.session.start import create, resolve
    from vmsandbox.sync.inward import leftout
    from vmsandbox.sync.review import plan

    rec = Recorder()
    record = saved_record("flow-1", project=str(tmp_path))

    def step(name: str, answer: Any = None) -> Any:
        def recorded(*args: Any, **kwargs: Any) -> Any:
            rec.steps.append(name)
            return answer(*args, **kwargs) if callable(answer) else answer

        return recorded

    planned = Run(Options(project=tmp_path, name="flow-1", settings=None), ["true"], False, False,  # type: ignore[arg-type]
                  Take())  # fmt: skip
    from vmsandbox.sync.review.gather import Gathered, Origin
    from vmsandbox.sync.review.threeway import Change, Status
    from vmsandbox.sync.tree.manifest import Entry

    change = Change("a.txt", None, Entry("file", 0o644, 1, digest="d"), None, Status.APPLY)
    gathered = Gathered(record.target(), [change], tmp_path, False, Origin.LIVE, None, 1024)
    review = plan.Plan(gathered, [change], [plan.Item("a.txt", (change,))], None)
    review.id = "f" * 32

    @contextlib.contextmanager
    def held(*_: Any, **__: Any) -> Iterator[None]:
        rec.steps.append("lock")
        yield
        rec.steps.append("unlock")

    def applied(_record: Any, _plan: Any, decisions: Decisions) -> Outcome:
        rec.steps.append("apply")
        rec.decisions.append(decisions)
        return Outcome()

    monkeypatch.setattr(resolve, "resolve", step("resolve", planned))
    monkeypatch.setattr(leftout, "credentials_in", step("credentials", [Finding(".env", "a credential file's name")]))
    monkeypatch.setattr(create, "create", step("create", record))
    monkeypatch.setattr(commands, "attach", step("attach", 0))
    monkeypatch.setattr(lock, "held", held)
    monkeypatch.setattr(lifecycle, "review", step("review", review))
    monkeypatch.setattr(lifecycle, "decide", applied)
    monkeypatch.setattr(blueprint, "load", lambda *_: blueprint.Blueprint(name="base", source="x", login_files=("l",)))
    monkeypatch.setattr(logins, "changed", step("login", {"l": b"token"}))
    monkeypatch.setattr(lifecycle, "finish", step("finish", lifecycle.End()))
    yield rec


class Told:
    """What a front end adds to its person: the `told` step recorded, and the review each decision was on."""

    def __init__(self, person: Person, rec: Recorder) -> None:
        self.person, self.rec = person, rec

    def leave_out(self, found: Any) -> bool:
        return self.person.leave_out(found)

    def decide(self, review: Any) -> Decisions:
        self.rec.steps.append("decide")
        return self.person.decide(review)

    def told(self, review: Any, outcome: Outcome) -> None:
        self.rec.steps.append("told")
        self.person.told(review, outcome)

    def keep_login(self, agent: str, files: Any) -> bool:
        return self.person.keep_login(agent, files)

    def fanned_out(self, group: str, outcomes: Any) -> None:
        self.person.fanned_out(group, outcomes)


def _page(other: Person, monkeypatch: pytest.MonkeyPatch) -> Person:
    """The page of `run --review web`, its server played: what a person's apply on the page sends back comes
    through the page's handoff (web/app.py's apply does the same), in another thread."""
    from vmsandbox.web import person, server

    class Played:
        def __init__(self, *, handoff: person.Page, **_: Any) -> None:
            self.handoff = handoff

        def start(self) -> None:
            plan = self.handoff.review
            assert plan is not None and self.handoff.takes("flow-1", plan.id) is plan
            threading.Thread(target=self.handoff.hand_back, args=(Decisions(accept=tuple(plan.todo)),)).start()

        def give(self, path: str, *, browser: bool) -> None:
            assert path == f"/s/flow-1?review={'f' * 32}"

        def stop(self) -> None:
            return None

    monkeypatch.setattr(server, "Server", Played)
    return person.Page(other, browser=False)


@pytest.mark.parametrize("front", ["terminal --yes", "page", "nobody"])
def test_every_front_end_takes_the_same_steps_in_the_same_order(
    front: str, recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vmsandbox.cli.review import prompts

    monkeypatch.setattr(prompts, "show", lambda plan: True)  # (the terminal's summary table: shown, not tested)
    people: dict[str, Person] = {
        "terminal --yes": prompts.Terminal(yes=True),
        "page": _page(Nobody(), monkeypatch),
        "nobody": Nobody(),
    }
    ran = flow.run(flow.Ask(Path(), "base", ["true"], RunFlags()), Told(people[front], recorder))
    assert ran.code == 0 and not ran.kept
    assert recorder.steps == STEPS
    taken = {"terminal --yes": 1, "page": 1, "nobody": 0}[front]
    assert len(recorder.decisions[0].accept) == taken  # what differs is what the person answered, nothing else


def test_a_fan_out_makes_the_group_it_prints(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without --name, a fan-out's group is drawn from the project with a random suffix: the group printed, the one
    its sessions are made in (`GROUP-1` … `GROUP-N`) and the one its closing hint names (`rm --group`) are one.
    (It printed one draw and made the sessions under another: `rm --group` as printed found no fan-out.)"""
    from vmsandbox.core import reviews
    from vmsandbox.session.moments import fanout

    made: list[tuple[str, list[str]]] = []

    def fan_out(run: Run, n: int, check: str | None, *, limit: int) -> list[fanout.Outcome]:
        group, names = fanout.names(run, n)  # how the fan-out names what it makes
        made.append((group, names))
        return [fanout.Outcome(name, i, 0, 1.0) for i, name in enumerate(names, 1)]

    told: list[tuple[str, list[str]]] = []

    class Told(Nobody):
        def fanned_out(self, group: str, outcomes: Any) -> None:
            told.append((group, [o.name for o in outcomes]))

    planned = Run(Options(project=tmp_path / "My Project", name=None, settings=None), ["true"], False, False,  # type: ignore[arg-type]
                  Take())  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fanout, "fan_out", fan_out)
        patch.setattr(reviews, "limit", lambda: 1)
        assert flow.fan_out(planned, 4, None, Told()).code == 0
    (group, names), printed = made[0], " ".join(capsys.readouterr().err.split())
    assert group.startswith("my-project-") and names == [f"{group}-{i}" for i in range(1, 5)]
    assert f"Fan-out {group}: 4 session(s), {group}-1 … {group}-4" in printed
    assert told == [(group, names)]
