"""What gc does after a `vmsandbox` process was killed in each phase, checked on libvirt's in-process test:///
driver with saved records: the session left behind is finished, kept or removed, and its domain goes with it.
One real kill per phase stays in tests/integration/test_faults.py; these hold the recovery's every branch."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from vmsandbox import paths, pids
from vmsandbox.session import lock, state
from vmsandbox.session.end import gc
from vmsandbox.session.place import choose, pins
from vmsandbox.session.record import Record, State, domain_name
from vmsandbox.vm.virt import Hypervisor

from .conftest import saved_record
from .test_virt import test_domain

URI = "test:///default"
LIMIT = 1024**3


@pytest.fixture
def hv() -> Iterator[Hypervisor]:
    with Hypervisor(URI) as connection:
        yield connection
        for info in list(connection.domains("vmsandbox-")):  # the test driver is per process: leave it empty
            connection.destroy(info.name)


def dead_pid() -> int:
    """A pid that names no process (the `vmsandbox run` that was killed)."""
    pid = 4_000_000
    while Path(f"/proc/{pid}").exists():
        pid += 1
    return pid


def running(hv: Hypervisor, record: Record) -> None:
    hv.create(test_domain(record.domain, record.files.root))


def _status(record: Record) -> state.Status:
    """The session's status, asked of its host as every command asks it."""
    with choose.vm_of(record) as vm:
        return state.status(vm)


def collect() -> list[str]:
    return list(gc.gc(URI, limit=LIMIT))


def test_a_run_killed_before_its_command_is_removed_with_its_vm(hv: Hypervisor) -> None:
    """Killed at capture, boot, restore or egress: the record says `creating`, its owner is dead."""
    r = saved_record("early", status="creating", owner_pid=dead_pid(), owner_start="1")
    running(hv, r)
    paths.images_dir().mkdir(parents=True)
    pins.pin(r.name, "/images/v", None)
    pin = paths.images_dir() / pins.DIR / f"{os.geteuid()}.{r.name}"
    assert pin.exists()
    assert _status(r).state is State.ORPHANED
    assert collect() == ["removed session early (orphaned)"]
    assert hv.info(r.domain) is None
    assert not r.files.root.exists()
    assert not pin.exists()  # it rests on no image any more
    assert collect() == []  # nothing left to do


def test_a_session_that_never_got_ready_is_removed_even_with_a_workspace(hv: Hypervisor) -> None:
    """A `creating` record never ran a command: whatever its disk holds is nobody's work."""
    r = saved_record("half", status="creating", owner_pid=dead_pid(), owner_start="1")
    r.files.workspace_disk.write_bytes(b"\0" * 4096)
    r.files.baseline_manifest.write_text("{}")
    assert collect() == ["removed session half (exited)"]
    assert not r.files.root.exists()


@pytest.mark.parametrize("ending", ["remove", "retire"])
def test_a_teardown_killed_before_the_vm_went_is_finished(hv: Hypervisor, ending: str) -> None:
    """The review was done and the exit code given; the background teardown died. Remove: nothing stays.
    Retire: the VM and its disks go, the record and the outbox (the unsynced work) stay, and gc leaves it."""
    r = saved_record("late", status="ready", ending=ending, owner_pid=dead_pid(), owner_start="1")
    running(hv, r)
    r.files.workspace_disk.write_bytes(b"\0" * 4096)
    r.files.outbox.mkdir()
    (r.files.outbox / "kept.txt").write_text("the guest's work\n")
    assert _status(r).state is State.ENDING
    assert collect() == ["finished the teardown of session late"]
    assert hv.info(r.domain) is None
    assert not r.files.workspace_disk.exists()
    if ending == "remove":
        assert not r.files.root.exists()
    else:
        again = Record.load("late")
        assert again.exported and again.ending is None
        assert _status(again).state is State.EXPORTED
        assert (r.files.outbox / "kept.txt").read_text() == "the guest's work\n"
        assert collect() == []  # an exported session is the user's to recover or destroy


def test_a_damaged_record_with_a_disk_is_kept_and_one_without_is_removed(hv: Hypervisor) -> None:
    """A record and its copy both unreadable (a kill mid-write on a full disk): with a workspace disk it may
    hold work, so a person decides; without one (and not being made right now) it goes, its VM too."""
    for name in ("withdisk", "bare"):
        files = paths.session_paths(name)
        files.root.mkdir(parents=True)
        files.record.write_text("{not json")
    paths.session_paths("withdisk").workspace_disk.write_bytes(b"\0" * 4096)
    bare = paths.session_paths("bare")
    hv.create(test_domain(domain_name("bare"), bare.root))
    old = time.time() - 120
    os.utime(bare.root, (old, old))
    lines = collect()
    assert len(lines) == 2, lines
    assert lines[0] == f"removed damaged session directory {bare.root}"
    assert lines[1].startswith("kept damaged session withdisk: ")
    assert lines[1].endswith("`vmsandbox rm withdisk --discard` removes it")
    assert hv.info(domain_name("bare")) is None
    assert not bare.root.exists() and paths.session_paths("withdisk").workspace_disk.exists()


def test_a_damaged_record_being_made_right_now_is_left_alone(hv: Hypervisor) -> None:
    files = paths.session_paths("young")
    files.root.mkdir(parents=True)
    files.record.write_text("")
    assert collect() == []
    assert files.root.exists()


def test_a_session_being_made_by_a_live_command_is_booting_before_its_domain_exists(hv: Hypervisor) -> None:
    """A `create` still capturing its project, or a fork still copying its source, has no domain yet: while the
    command making it lives it is booting, and gc (`rm --stale`) leaves it be; once that command is dead, it goes."""
    me = os.getpid()
    making = saved_record("making", status="creating", keep=True, owner_pid=me, owner_start=pids.process_start(me))
    assert _status(making).state is State.BOOTING
    assert collect() == [] and making.files.root.exists()
    running(hv, making)
    assert _status(making).state is State.BOOTING
    hv.destroy(making.domain)
    dead = Record.load("making")
    dead.owner_pid, dead.owner_start = dead_pid(), "1"
    dead.save()
    assert _status(dead).state is State.EXITED
    assert collect() == ["removed session making (exited)"]


def test_a_session_that_came_alive_while_gc_waited_for_its_lock_is_left(
    hv: Hypervisor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gc looks at a session's state, then takes its lock: a command that held the lock meanwhile (a `start`, a
    fork's maker) may have brought it to life, so its state is looked at again under the lock."""
    r = saved_record("revived", status="creating", keep=True, owner_pid=dead_pid(), owner_start="1")
    assert _status(r).state is State.EXITED
    held = lock.held

    @contextlib.contextmanager
    def after_another_command(*args: object, **kwargs: object) -> Iterator[None]:
        alive = Record.load("revived")  # what the command that held the lock did before gc got it
        alive.owner_pid, alive.owner_start = os.getpid(), pids.process_start(os.getpid())
        alive.save()
        with held(*args, **kwargs):  # type: ignore[arg-type]
            yield

    monkeypatch.setattr(lock, "held", after_another_command)
    assert collect() == []
    assert r.files.root.exists() and _status(Record.load("revived")).state is State.BOOTING
