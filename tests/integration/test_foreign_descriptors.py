"""Root never waits on what another account hands it (docs/security.md): a process of QEMU's account with a FUSE
file whose close by root is never answered (tests/integration/fuse_standin.py) at the number root looks at — a
holder's (as one traced by a QEMU of its account would have), or a QEMU's own, raced against root's look. The
memory guard's round, gc, `doctor` and `host ls` go on within their deadline and say what they skipped; root's own
process never holds the file; a look helper that took it in a lost race hangs alone, and only once per process.
No VM: the holder and the QEMU are stand-ins, named where root reads them (its holders' records, libvirt's pid
files), each in a directory of the test's own."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from tests.integration.conftest import URI, unique_name, wait_for
from tests.integration.foreign_files import (
    NUMBER,
    ended,
    never_closing,
    own_children,
    qemu_account_process,
    state_of,
)
from vmsandbox.session.host import doctor, guard, hosts
from vmsandbox.session.place import choose as places
from vmsandbox.session.place.local import sharing
from vmsandbox.vm.memory import foreign, usage

pytestmark = [pytest.mark.no_vm, pytest.mark.root("plays QEMU's account, mounts a FUSE stand-in, reads root's holders")]
T = TypeVar("T")
DEADLINE = 4 * foreign.LOOK_DEADLINE  # one round of looks, at most (each look has its own deadline)
RACE_LOOKS = 2000  # the stand-in wins a race within a few looks here (each look ~1 ms)


def within(call: Callable[[], T], deadline: float = DEADLINE) -> T:
    """What call() returns, by `deadline` seconds (a root that hung would never return: the test fails instead)."""
    got: list[T] = []
    thread = threading.Thread(target=lambda: got.append(call()), daemon=True)
    thread.start()
    thread.join(deadline)
    assert got, f"{getattr(call, '__name__', call)} did not return within {deadline:.0f} s: root hangs"
    return got[0]


@pytest.fixture
def own_looks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Root's holders' records and libvirt's pid files read from the test's own directories; this process's looks
    start afresh (nothing shunned, nothing said, no helper)."""
    runtime, pid_files = tmp_path / "runtime", tmp_path / "pids"
    runtime.mkdir(mode=0o700)
    pid_files.mkdir()
    monkeypatch.setenv("VMSANDBOX_RUNTIME_DIR", str(runtime))
    monkeypatch.setattr(usage, "LIBVIRT_PIDS", pid_files)
    monkeypatch.setattr(foreign, "_SHUNNED", set())
    monkeypatch.setattr(foreign, "_NOTES", {})
    helper = foreign._Helper()
    monkeypatch.setattr(foreign, "_HELPER", helper)
    monkeypatch.setattr(foreign, "_asked", helper.ask)
    yield tmp_path
    wait_for(lambda: foreign.left() == 0, 30, "the look helpers left to end once the FUSE file system is gone")
    if helper.child is not None:
        helper._leave(kill=False)  # its stdin closed: it ends
        wait_for(lambda: foreign.left() == 0, 30, "the look helper to end")


def test_a_holder_with_a_fuse_file_at_its_number_is_passed_over_said_and_stopped(
    own_looks: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The file is never taken (the kernel says it is no memfd before root's look takes anything): the guard counts
    nothing of it, gives nothing back, `doctor` and `host ls` say it, gc stops the holder and drops its record."""
    entry = own_looks / "runtime" / "memory" / "t.json"
    entry.parent.mkdir(mode=0o700)
    with never_closing(own_looks) as fuse, qemu_account_process("hold", fuse) as holder:
        entry.write_text(json.dumps(holder.record("/t")))
        said = f"skipped holder pid {holder.pid}: its descriptor {NUMBER} is not a memfd"
        assert within(usage.held_keys) == set()
        assert within(lambda: guard.relieve(floor_mib=1 << 40)) == []  # short of memory: gives back nothing, stops none
        capfd.readouterr()
        within(lambda: hosts.probe(places.spec_for(None, URI)))
        assert said in capfd.readouterr().err  # `host ls` says it
        check = within(lambda: doctor._memory(URI))
        assert said in check.detail and check.level == "warn" and check.fix == doctor.SKIPPED_FIX
        verbs: list[tuple[str, str]] = []

        def tidy(verb: str, what: str, do: Callable[[], object]) -> str:
            verbs.append((verb, what))
            do()
            return what

        within(lambda: list(sharing.sweep(None, tidy)))  # type: ignore[arg-type]  # (its first branch asks no libvirt)
        assert verbs == [("stop", f"the memory holder of /t ({said})")]
        ended(holder.pid)
        assert not entry.exists()
        assert fuse.held_flushes() == []  # root took nothing: no close of root's ever reached the file
    assert foreign.left() == 0


def test_a_qemu_that_races_its_descriptor_hangs_one_look_helper_never_root(
    own_looks: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The QEMU swaps its descriptor between the kernel's word and root's take: the look helper that took the FUSE
    file hangs on its close (the file system never answers root); root's own process goes on, says it, and never
    asks about that QEMU again. Once the file system goes, the helper ends."""
    domain = f"vmsandbox-{unique_name()}"
    with never_closing(own_looks) as fuse, qemu_account_process("race", fuse, f"guest={domain},") as qemu:
        (usage.LIBVIRT_PIDS / f"{domain}.pid").write_text(f"{qemu.pid}\n")

        def race() -> int:
            for n in range(1, RACE_LOOKS + 1):
                usage.memory_files(qemu.pid)
                if foreign.left():
                    return n
            return 0

        assert within(race, 120), f"the stand-in never won the race in {RACE_LOOKS} looks: nothing was tested"
        wait_for(fuse.held_flushes, 30, "the helper that took the FUSE file to close it as it ends")
        (hung,) = fuse.held_flushes()
        assert hung in own_children() and state_of(hung) in ("S", "D")  # a helper of this process's, held up
        assert Path(f"/proc/{hung}/comm").read_text().strip() == "vmsandbox-look"
        said = f"skipped QEMU pid {qemu.pid}: its descriptor {NUMBER} was no memfd once taken"
        assert any(n.startswith(said) for n in foreign.notes())
        # the guard's round goes on (the QEMU passed over, said once), as do `doctor` and `host ls`
        monkeypatch.setattr(guard, "IDLE_EXIT", 0.0)  # one round, then it ends: no session of its directory runs
        capfd.readouterr()
        within(lambda: guard.watch(floor_mib=1 << 40))
        assert within(lambda: guard.relieve(floor_mib=1 << 40)) == []
        assert within(usage.reserved_mib) == 0
        assert within(lambda: doctor._memory(URI)).level == "warn"
        err = capfd.readouterr().err
        assert said in err and f"skipped QEMU pid {qemu.pid}: it handed root's look something else" in err
        assert usage.memory_files(qemu.pid) == []
        assert fuse.held_flushes() == [hung]  # one helper held up, however often it is asked
        assert foreign.left() == 1
    ended(hung)  # the file system gone, its close fails, and it ends
