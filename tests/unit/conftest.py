"""Unit tests cannot touch the host: any subprocess fails the test, and every vmsandbox directory is a tmp dir."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp.client.stdio  # noqa: F401  (the MCP SDK reads subprocess.Popen's annotations once, when imported:
import pytest  # before the guard below stands in for it)

from vmsandbox.session.record import Record


class UnexpectedSubprocessError(AssertionError):
    pass


@pytest.fixture(autouse=True)
def a_host_of_sixteen_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings are checked against the host's CPUs, memory and free disk: the same answers on every machine
    the tests run on (16 CPUs, 32 GiB, 500 GiB free)."""
    from vmsandbox.session import settingrows, settings

    monkeypatch.setattr(settingrows, "host_cpus", lambda: 16)
    monkeypatch.setattr(settings, "host_memory_mib", lambda: 32 * 1024)
    monkeypatch.setattr(settings, "free_disk_mib", lambda: 500 * 1024)


@pytest.fixture(autouse=True)
def no_subprocesses(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **_kwargs: Any) -> Any:
        raise UnexpectedSubprocessError(f"unit tests may not run subprocesses: {args[0] if args else '?'}")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(subprocess, "run", refuse)


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """vmsandbox's data, state and config directories of the test, beside its tmp_path (not in it: a project in
    tmp_path must not hold vmsandbox's own state, which is refused)."""
    base = tmp_path.parent / f"{tmp_path.name}.vmsandbox"
    for var in ("DATA", "STATE", "CONFIG", "RUNTIME"):
        d = base / var.lower()
        d.mkdir(parents=True)
        monkeypatch.setenv(f"VMSANDBOX_{var}_DIR", str(d))
    from vmsandbox.confine import pool

    monkeypatch.setattr(pool, "ROOT", base / "accounts")  # (the host's pool of session accounts: never read)
    monkeypatch.delenv("VMSANDBOX_ACCEL", raising=False)
    monkeypatch.delenv("VMSANDBOX_CPUS", raising=False)
    monkeypatch.delenv("VMSANDBOX_LIBVIRT_URI", raising=False)
    yield base


def saved_record(name: str, **fields: Any) -> Record:
    """A session record written to its (temporary) session directory; `fields` override the defaults."""
    values: dict[str, Any] = {
        "name": name,
        "project": "/p",
        "image_version": "v",
        "accel": "tcg",
        "accel_reason": "",
        "cpus": 1,
        "memory_mib": 512,
        "disk_mib": 1024,
        "ssh_port": 1,
        "user": "u",
        "uid": 1000,
        "gid": 1000,
        "libvirt_uri": "test:///default",
    }
    record = Record(**(values | fields))
    record.files.root.mkdir(parents=True)
    record.save()
    return record


@pytest.fixture
def looks_in_this_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Root's looks at a process's descriptors (vm.memory.foreign) answered by the look helper's own code in this
    process (no helper process is started), at this process's own descriptors only; each test starts with nothing
    shunned and nothing said."""
    import ctypes
    import os

    from vmsandbox.vm.memory import foreign, look

    mount, libc = look.memfd_mount(), ctypes.CDLL(None, use_errno=True)

    def here(request: dict[str, Any]) -> dict[str, Any] | str:
        assert request["pid"] == os.getpid(), "a unit test looks at its own process only"
        said, held = look.answer(request, mount, libc)
        for fd in held:  # (a test's own pipes and files: their close never waits)
            os.close(fd)
        return said

    monkeypatch.setattr(foreign, "_asked", here)
    monkeypatch.setattr(foreign, "_SHUNNED", set())
    monkeypatch.setattr(foreign, "_NOTES", {})
    yield
