"""The memory guard's choices, from fakes of the machine's memory and its sessions (nothing stopped for real)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from vmsandbox.errors import VmsandboxError
from vmsandbox.session.host import guard
from vmsandbox.session.host.guard import Held
from vmsandbox.vm.memory import usage


def test_it_stops_kept_sessions_with_most_memory_of_their_own_first() -> None:
    held = [Held("idle", 120, True), Held("big", 900, True), Held("mid", 400, True), Held("run", 2000, False)]
    assert [h.name for h in guard.order(held)] == ["big", "mid", "idle"]  # never a `run` session, however big
    assert [h.name for h in guard.order([Held("b", 10, True), Held("a", 10, True)])] == ["a", "b"]  # ties: by name


class Machine:
    """MemAvailable, and what each stop frees of it."""

    def __init__(self, available: int, held: list[Held], *, busy: frozenset[str] = frozenset()) -> None:
        self.available, self.held, self.busy = available, held, busy
        self.stopped: list[tuple[str, str]] = []

    def stop(self, name: str, why: str) -> None:
        if name in self.busy:
            raise VmsandboxError(f"session {name} is busy: vmsandbox (pid 1) is pulling it")
        self.stopped.append((name, why))
        gone = next(h for h in self.held if h.name == name)
        self.held.remove(gone)
        self.available += gone.private_mib


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> Machine:
    m = Machine(300, [Held("idle", 150, True), Held("big", 700, True), Held("mid", 400, True)])
    monkeypatch.setattr(guard, "available_mib", lambda: m.available)
    monkeypatch.setattr(guard, "running", lambda: m.held)
    monkeypatch.setattr(guard, "_stop", m.stop)
    return m


def test_nothing_is_stopped_while_the_floor_holds(machine: Machine) -> None:
    assert guard.relieve(300) == []
    assert machine.stopped == []


def test_it_stops_until_the_floor_holds_again(machine: Machine) -> None:
    assert guard.relieve(512) == ["big"]
    assert guard.relieve(1500) == ["mid", "idle"]  # 1000 after `big`: `mid` leaves it 100 short
    _, why = machine.stopped[0]
    assert why.startswith("stopped by the memory guard at ") and "300 MiB" in why and "floor of 512 MiB" in why


def test_a_busy_session_is_passed_over_for_the_next(machine: Machine) -> None:
    machine.busy = frozenset({"big"})
    assert guard.relieve(1000) == ["mid", "idle"]  # short 700: `big` would have covered it alone


def test_only_the_sessions_asked_for(machine: Machine) -> None:
    assert guard.relieve(1000, among=["idle", "mid"]) == ["mid", "idle"]


def test_memory_the_kernel_does_not_tell_stops_nothing(machine: Machine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(guard, "available_mib", lambda: None)
    assert guard.relieve(10**6) == []


@pytest.mark.parametrize(("kernel", "rounds"), [(550, 3), (613, 0)])
def test_the_guard_relieves_while_short_and_ends_once_no_session_runs(
    monkeypatch: pytest.MonkeyPatch, kernel: int, rounds: int
) -> None:
    """Short is the kernel's figure less what is reserved (550 - 100 < 512; 613 - 100 is not)."""
    looks = []

    def records() -> Iterator[object]:
        looks.append(1)
        return iter([object()] if len(looks) <= 3 else [])  # a session runs for three rounds, then none

    relieved: list[int] = []
    monkeypatch.setattr(guard, "_records", records)
    monkeypatch.setattr(guard, "IDLE_LOOK", 0.0)
    monkeypatch.setattr(guard, "IDLE_EXIT", 0.0)
    monkeypatch.setattr(usage, "reserved_mib", lambda: 100)
    monkeypatch.setattr(guard, "kernel_available_mib", lambda: kernel)

    def relieve(floor: int) -> list[str]:
        relieved.append(floor)
        return []

    monkeypatch.setattr(guard, "relieve", relieve)
    monkeypatch.setattr(time, "sleep", lambda _s: None)
    guard.watch(512)
    assert relieved == [512] * rounds
