"""The memory guard on real VMs: the holes of the file two sessions share are reserved until read in; when this
machine is short of memory (the figure the guard reads made short until one of the two is stopped: other tests'
VMs come and go meanwhile), the guard stops the session holding most memory of its own to disk, not the quiet
one, and that session resumes with what its memory held; a guest that holds its flush is passed over for the
next session, and the guard does not wait on it; and a guard watches once a session runs."""

from __future__ import annotations

import fcntl
import mmap
import time
from pathlib import Path

import pytest

from tests.integration.conftest import VmFactory, guest_sh
from vmsandbox import paths, pids
from vmsandbox.core import listing
from vmsandbox.session.host import memoryguard
from vmsandbox.session.moments import suspend
from vmsandbox.session.record import Record
from vmsandbox.vm.memory import usage

pytestmark = pytest.mark.root("the guard reads every QEMU's memory, as only root may")

BALLAST_MIB = 256


@pytest.fixture(scope="module")
def quiet_and_big(module_vms: VmFactory, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """Two kept sessions: one idle, one that wrote BALLAST_MIB into its memory (and a marker beside it)."""
    project = tmp_path_factory.mktemp("guard") / "guard project"
    project.mkdir()
    (project / "README").write_text("guarded\n")
    quiet, big = module_vms.make(project), module_vms.make(project)
    guest_sh(big, f"head -c {BALLAST_MIB}M /dev/zero > /dev/shm/ballast; echo kept-in-memory > /dev/shm/marker")
    return quiet.name, big.name


def read_through_a_private_mapping(record: Record) -> None:
    """Read every page of the memory file the session's QEMU maps, through a private mapping, as its save would."""
    pid = int(Path(f"/run/libvirt/qemu/{record.domain}.pid").read_text())
    fd = next(f for f in Path(f"/proc/{pid}/fd").iterdir() if str(f.readlink()).startswith("/memfd:vmsandbox-"))
    with fd.open("rb") as f, mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ) as m:
        for at in range(0, len(m), mmap.PAGESIZE):
            m[at]


def held(names: tuple[str, str]) -> dict[str, memoryguard.Held]:
    return {h.name: h for h in memoryguard.running() if h.name in names}


def test_the_holes_of_the_file_they_share_are_reserved_until_read_in(quiet_and_big: tuple[str, str]) -> None:
    """The two map one file; what it holds no page for yet is reserved (not available to admission or the guard)
    until read through a private mapping, as a save reads every page: then it is memory, and reserved no more."""
    quiet, big = (Record.load(n) for n in quiet_and_big)
    # (the guests run meanwhile, and a page of the file a guest reads in is a hole no more: each look finds as many
    # holes as the one before, or fewer, so each is compared with one taken before it)
    reserved = usage.reserved_mib()
    one, two = usage.shared_file(quiet.domain), usage.shared_file(big.domain)
    assert one is not None and two is not None and one.inode == two.inode and one.size_mib == 2048, (one, two)
    listed = usage.shared_files()[one.key]
    assert listed.size_mib == one.size_mib and listed.holes_mib <= one.holes_mib, (listed, one)
    assert reserved >= one.holes_mib  # (a root holder's file, mapped: its holes are owed)
    for _ in range(3):  # (one full read left 1 MiB of holes once, in CI, on a host busy with another worker's VMs)
        read_through_a_private_mapping(quiet)
        after = usage.shared_file(big.domain)
        if after is None or after.holes_mib == 0:
            break
    assert after is not None and after.holes_mib == 0, after
    assert usage.shared_files()[one.key].holes_mib == 0


@pytest.fixture
def short_until_one_stops(quiet_and_big: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine as the guard reads it: FLOOR_MIB less one available until one of the two is stopped (other
    tests' VMs start and end meanwhile: the machine's own figure would be theirs too)."""

    def available() -> int:
        one_stopped = any(Record.load(n).saved for n in quiet_and_big)
        return memoryguard.FLOOR_MIB if one_stopped else memoryguard.FLOOR_MIB - 1

    monkeypatch.setattr(memoryguard, "available_mib", available)


@pytest.mark.usefixtures("short_until_one_stops")
def test_a_guest_that_holds_its_flush_is_passed_over(
    quiet_and_big: tuple[str, str], monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    quiet, big = quiet_and_big
    sizes = held(quiet_and_big)
    assert sizes[big].own_mib > sizes[quiet].own_mib + BALLAST_MIB // 2, sizes
    record = Record.load(big)
    # its root makes `sync` wait ten minutes, as a guest could to keep the guard waiting while the machine runs out
    guest_sh(record, "mv /usr/bin/sync /usr/bin/sync.real && printf '#!/bin/sh\\nsleep 600\\n' > /usr/bin/sync "
             "&& chmod 755 /usr/bin/sync", root=True)  # fmt: skip
    monkeypatch.setattr(memoryguard, "FLUSH_TIMEOUT", 3.0)
    try:
        started = time.monotonic()
        stopped = memoryguard.relieve(among=quiet_and_big)
        waited = time.monotonic() - started
    finally:
        guest_sh(record, "mv /usr/bin/sync.real /usr/bin/sync", root=True)
    assert stopped == [quiet]  # the big one could not be flushed: the next one was stopped instead
    said = capfd.readouterr().err
    assert f"stopping {big}" in said and f"could not stop {big}" in said and "did not finish within 3 s" in said, said
    assert waited < 60, f"the guard waited {waited:.0f} s on a guest"
    assert not Record.load(big).saved and set(held(quiet_and_big)) == {big}  # the big one runs on
    suspend.start(quiet)


@pytest.mark.usefixtures("short_until_one_stops")
def test_the_session_holding_most_of_its_own_is_stopped_and_resumes_whole(quiet_and_big: tuple[str, str]) -> None:
    quiet, big = quiet_and_big
    assert memoryguard.relieve(among=quiet_and_big) == [big]
    stopped = Record.load(big)
    assert stopped.saved and stopped.stop_note.startswith("stopped by the memory guard at "), stopped.stop_note
    assert "under its floor" in (listing.inspect(big)["stopped_by"] or "")
    assert set(held(quiet_and_big)) == {quiet}  # the quiet one runs on
    assert guest_sh(Record.load(quiet), "cat README") == "guarded\n"
    resumed = suspend.start(big)
    assert not resumed.saved and resumed.stop_note == ""
    assert guest_sh(resumed, "cat /dev/shm/marker; stat -c %s /dev/shm/ballast").split() == [
        "kept-in-memory",
        str(BALLAST_MIB << 20),
    ]


def test_the_guard_watches_once_a_session_runs(quiet_and_big: tuple[str, str], state_dir: Path) -> None:
    """Started by the first session of this sessions directory: its lock is held, its pid file names it, its log
    says it watches."""
    sessions = state_dir / "sessions"
    # a guard holds its lock (asked without taking it, should no one hold it)
    with (sessions / memoryguard.LOCK).open() as f, pytest.raises(BlockingIOError):
        fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
    pid, start = (sessions / paths.GUARD_PID).read_text().split()
    assert pids.alive(int(pid), start)
    assert paths.GUARD_MODULE.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    assert "the memory guard of" in (sessions / paths.GUARD_LOG).read_text()
