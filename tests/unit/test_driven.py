"""A session rule written once, in the core: while the `vmsandbox run` that made a session drives it, the
terminal's `stop`, `checkpoint restore` and `rm` (without --force) and the API's pause, rollback and kill are all
refused, in the same words (core.sessions.not_driven); with no live run, each goes on to its work. On libvirt's
test driver, with the session's VM running there."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.unit.conftest import saved_record
from vmsandbox import pids
from vmsandbox.core import moments, sessions
from vmsandbox.core.sandbox.backend import SessionBackend
from vmsandbox.core.sandbox.interface import ConflictError
from vmsandbox.core.sandbox.names import CheckpointLabel, SessionName
from vmsandbox.errors import VmsandboxError
from vmsandbox.session.end import lifecycle
from vmsandbox.session.moments import checkpoint, suspend
from vmsandbox.vm.virt import Hypervisor

HERE = "test:///default"


class ReachedError(Exception):
    """The step after the rule was reached: the rule let the command through."""


@pytest.fixture
def running(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """Every connection is one connection to the test driver; `running(owner_pid=…, owner_start=…)` saves session
    s1's record (kept, ready) and starts its VM there."""
    shared = Hypervisor(HERE)
    conn = shared._conn

    def opened(self: Hypervisor, uri: str = HERE) -> None:
        self.uri = uri
        self._conn = conn

    monkeypatch.setattr(Hypervisor, "__init__", opened)
    monkeypatch.setattr(Hypervisor, "close", lambda self: None)

    def start(**owner: Any) -> None:
        record = saved_record("s1", keep=True, status="ready", **owner)
        root = ET.Element("domain", {"type": "test"})
        ET.SubElement(root, "name").text = record.domain
        ET.SubElement(root, "memory").text = "65536"
        ET.SubElement(ET.SubElement(root, "os"), "type").text = "hvm"
        shared.create(ET.tostring(root, encoding="unicode"))

    yield start
    conn.close()


def _refusal(call: Callable[[], object]) -> tuple[str, str | None]:
    with pytest.raises(VmsandboxError) as raised:
        call()
    return raised.value.message, raised.value.hint


def _four(api: SessionBackend) -> dict[str, Callable[[], object]]:
    """The terminal's stop, checkpoint restore and rm, and the API's kill, pause and rollback, of session s1."""
    s1, c1 = SessionName("s1"), CheckpointLabel("c1")
    return {
        "stop": lambda: sessions.stop("s1"),
        "checkpoint restore": lambda: moments.restore("s1", "c1"),
        "rm": lambda: sessions.destroy("s1"),
        "kill": lambda: api.kill(s1),
        "pause": lambda: api.pause(s1),
        "rollback": lambda: api.rollback(s1, c1),
    }


def _reached(monkeypatch: pytest.MonkeyPatch) -> None:
    """The work after the rule (saving the VM, going back to a checkpoint, ending the session) only says so."""

    def step(what: str) -> Callable[..., Any]:
        def reached(*_a: Any, **_k: Any) -> Any:
            raise ReachedError(what)

        return reached

    monkeypatch.setattr(suspend, "stop", step("stop"))
    monkeypatch.setattr(checkpoint, "rollback", step("rollback"))
    monkeypatch.setattr(lifecycle, "destroy", step("destroy"))


def test_a_run_that_drives_a_session_refuses_stop_restore_and_kill_in_the_same_words(
    running: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = os.getppid()  # a live process that is not this one: the `vmsandbox run` that made s1
    running(owner_pid=run, owner_start=pids.process_start(run))
    _reached(monkeypatch)
    refused = {what: _refusal(call) for what, call in _four(SessionBackend()).items()}
    message, hint = refused["stop"]
    assert f"session s1 is driven by the command that made it (pid {run}" in message
    assert hint is not None and "`vmsandbox rm s1 --force`" in hint
    assert set(refused.values()) == {(message, hint)}, refused  # one rule, one error, the same words everywhere
    with pytest.raises(sessions.DrivenError):
        sessions.stop("s1")
    with pytest.raises(ConflictError):  # the API's 409
        SessionBackend().kill(SessionName("s1"))
    with pytest.raises(ReachedError, match="destroy"):  # a person's `rm --force` still takes it
        sessions.destroy("s1", force=True, take=True)


def test_the_compare_page_refuses_to_end_a_driven_session_before_it_applies_a_pick(
    running: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its "apply the picks, destroy the rest" ends sessions too: a session a run drives is refused first, so no
    pick is applied and then left unsaid behind the refusal."""
    from vmsandbox.core import reviews
    from vmsandbox.web import compare

    run = os.getppid()
    running(owner_pid=run, owner_start=pids.process_start(run))
    _reached(monkeypatch)
    monkeypatch.setattr(reviews, "reviewed", lambda *_a: (_ for _ in ()).throw(ReachedError("a review looked at")))
    with pytest.raises(sessions.DrivenError):
        compare.apply({"r-s1": "review-1", "c0": "s1:0:digest", "destroy": "rest"})
    with pytest.raises(ReachedError, match="a review looked at"):  # without "destroy the rest": no rule to keep
        compare.apply({"r-s1": "review-1", "c0": "s1:0:digest"})


@pytest.mark.parametrize(
    "owner",
    [
        {},  # no command drives it (made by `vmsandbox create`, or a run that ended and said so)
        {"owner_pid": os.getppid(), "owner_start": "1"},  # that process is gone (its pid is another's now)
        {"owner_pid": os.getpid(), "owner_start": pids.process_start(os.getpid())},  # this process made it (the API)
    ],
)
def test_without_a_live_run_the_rule_lets_each_through(
    running: Callable[..., None], monkeypatch: pytest.MonkeyPatch, owner: dict[str, Any]
) -> None:
    running(**owner)
    _reached(monkeypatch)
    reached = []
    for call in _four(SessionBackend()).values():
        with pytest.raises(ReachedError) as raised:
            call()
        reached.append(str(raised.value))
    assert reached == ["stop", "rollback", "destroy", "destroy", "stop", "rollback"]


def test_a_stop_whose_words_fail_is_a_stop_made(running: Callable[..., None], monkeypatch: pytest.MonkeyPatch) -> None:
    """The words come after the save (its size asked of the host): a host that stops answering then fails
    nothing, so the API's pause is not an error for a sandbox that is paused."""
    running()
    monkeypatch.setattr(suspend, "stop", sessions.record)  # (saved: what the words are made of)

    def unanswered(_record: object) -> str:
        raise VmsandboxError("host far does not answer")

    monkeypatch.setattr(suspend, "where_saved", unanswered)
    assert sessions.stop("s1") == "its memory saved"
