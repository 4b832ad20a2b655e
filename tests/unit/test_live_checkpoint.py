"""A rollback to a checkpoint taken live, without VMs: its memory holds the workspace frozen, so the VM restored
from it is thawed before its egress link is made; and when that restore fails, the session is left stopped on that
memory, and `start` thaws it in turn (the VM's own steps are stand-ins that record what is asked)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from vmsandbox.errors import VmsandboxError
from vmsandbox.paths import SessionPaths
from vmsandbox.session.moments import checkpoint, suspend
from vmsandbox.session.place.checkpoints import Checkpoint


def vm_at(root: Path, asked: list[str]) -> Any:
    record = SimpleNamespace(name="s", files=SessionPaths(root), domain="vmsandbox-s")
    snapshots = SimpleNamespace(
        memory_of=lambda cp: f"memory of {cp.label}", leave_stopped=lambda memory: asked.append(f"stopped {memory}")
    )
    return SimpleNamespace(record=record, snapshots=snapshots)


@pytest.mark.parametrize("live", [True, False])
def test_a_rollback_thaws_only_what_a_live_checkpoint_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, live: bool
) -> None:
    asked: list[str] = []
    monkeypatch.setattr(suspend, "thawing", lambda record: lambda: asked.append("thaw"))

    def resume(vm: Any, memory: str, title: str, *, restored: Any = None) -> None:
        asked.append(f"restore {memory}")
        if restored is not None:
            restored()

    monkeypatch.setattr(suspend, "resume", resume)
    cp = Checkpoint("c1", 0.0, ["overlay.qcow2"], tmp_path / "c1", live)
    checkpoint._resume(vm_at(tmp_path, asked), cp, "Restoring")
    assert asked == (["restore memory of c1", "thaw"] if live else ["restore memory of c1"])
    assert not suspend.held_still(SessionPaths(tmp_path)).exists()


def test_a_failed_rollback_to_a_live_checkpoint_leaves_start_to_thaw_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []

    def fails(vm: Any, memory: str, title: str, *, restored: Any = None) -> None:
        raise VmsandboxError("the VM did not answer on SSH within 60 s")

    monkeypatch.setattr(suspend, "resume", fails)
    cp = Checkpoint("c1", 0.0, ["overlay.qcow2"], tmp_path / "c1", True)
    with pytest.raises(VmsandboxError):
        checkpoint._resume(vm_at(tmp_path, asked), cp, "Restoring")
    assert asked == ["stopped memory of c1"]
    assert suspend.held_still(SessionPaths(tmp_path)).exists()  # what `start` reads: it thaws, then drops it
