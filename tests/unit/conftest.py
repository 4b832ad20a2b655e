"""Unit tests cannot touch the host: any subprocess fails the test, and every vmsandbox directory is a tmp dir."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


class UnexpectedSubprocessError(AssertionError):
    pass


@pytest.fixture(autouse=True)
def no_subprocesses(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **_kwargs: Any) -> Any:
        raise UnexpectedSubprocessError(f"unit tests may not run subprocesses: {args[0] if args else '?'}")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(subprocess, "run", refuse)


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    for var in ("DATA", "STATE", "CONFIG"):
        d = tmp_path / var.lower()
        d.mkdir()
        monkeypatch.setenv(f"VMSANDBOX_{var}_DIR", str(d))
    monkeypatch.delenv("VMSANDBOX_ACCEL", raising=False)
    monkeypatch.delenv("VMSANDBOX_LIBVIRT_URI", raising=False)
    yield tmp_path
