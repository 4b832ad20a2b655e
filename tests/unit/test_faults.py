"""The pieces the fault matrix leans on, without a VM: the boot diagnosis read from a console, the session
lock, the record's copy, the capture's space check and the fail-point names."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import threading
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from vmsandbox import failpoint, paths
from vmsandbox.egress.ports import Publish
from vmsandbox.errors import VmsandboxError
from vmsandbox.paths import SessionPaths
from vmsandbox.session import lock, state
from vmsandbox.session.place import choose, console
from vmsandbox.session.place.console import Cpu, Stage
from vmsandbox.session.record import Record, State
from vmsandbox.session.running import reach
from vmsandbox.sync.inward import capture

from .conftest import saved_record

BOOT = """\
[    0.000000] Linux version 6.1.0-41-cloud-amd64 (debian-kernel@lists.debian.org)
Loading, please wait...
Begin: Mounting root file system ... done.
Welcome to \x1b[1mDebian GNU/Linux 12 (bookworm)\x1b[0m!
[\x1b[0;32m  OK  \x1b[0m] Finished \x1b[0;1;39mvmsandbox-identit…tity (hostname, user, SSH keys).
vmsandbox-boot: identity applied (vmsandbox-s1)
[\x1b[0;32m  OK  \x1b[0m] Started \x1b[0;1;39mssh.service\x1b[0m - OpenBSD Secure Shell server.
"""


@pytest.mark.parametrize(
    ("lines", "stage"),
    [
        (0, Stage.FIRMWARE),
        (1, Stage.KERNEL),
        (3, Stage.INITRAMFS),
        (5, Stage.INIT),
        (6, Stage.IDENTITY),
        (7, Stage.SSHD),
    ],
)
def test_stage_is_the_furthest_marker_seen(lines: int, stage: Stage) -> None:
    text = console.plain("".join(BOOT.splitlines(keepends=True)[:lines]))
    assert console.stage_of(text) is stage
    assert stage.described


def test_plain_strips_whole_and_cut_escape_sequences() -> None:
    cut = "Mounting dev-mqueue.mount\x1b…POSIX; Starting udev-trig…[0m - Coldplug; x.mount\x1b[…- POSIX"
    assert console.plain(BOOT + cut).count("\x1b") == 0
    assert "[0m" not in console.plain(cut)
    assert console.plain("[\x1b[0;32m  OK  \x1b[0m] Started") == "[  OK  ] Started"


def test_trouble_lines_name_failures() -> None:
    text = "ok\n[FAILED] Failed to start ssh.service - OpenBSD Secure Shell server.\nKernel panic - not syncing: VFS\n"
    assert console.trouble(text) == [
        "[FAILED] Failed to start ssh.service - OpenBSD Secure Shell server.",
        "Kernel panic - not syncing: VFS",
    ]
    assert console.trouble("fine\n") == []


def test_cpu_verdicts() -> None:
    starved = Cpu(seconds=30, wall=300, load=9.0, host_cpus=2).verdict()
    assert starved is not None and starved.startswith("this host is short of CPU") and "10% of one core" in starved
    idle = Cpu(seconds=3, wall=300, load=0.5, host_cpus=2).verdict()
    assert idle is not None and idle.startswith("the guest sat idle")
    assert Cpu(seconds=250, wall=300, load=9.0, host_cpus=2).verdict() is None  # busy host, busy guest: slow
    assert Cpu(seconds=0, wall=0, load=0, host_cpus=1).share == 0


def test_watch_shows_progress_and_says_once_when_the_host_starves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [0.0]
    monkeypatch.setattr("vmsandbox.session.place.console.time.monotonic", lambda: clock[0])
    monkeypatch.setattr(console, "host_load", lambda: (9.0, 2))
    console_log = tmp_path / "console.log"
    w = console.Watch(console_log, cpu_start=10.0, started=0.0)
    assert w.advanced() is None  # no console yet: still the firmware
    console_log.write_text("[    0.000000] Linux version 6.1.0\n")
    assert w.advanced() is Stage.KERNEL and w.advanced() is None
    clock[0] = 20.0
    assert w.starving(12.0) is None  # too early to judge
    clock[0] = 60.0
    said = w.starving(16.0)  # 6 s of CPU in 60 s, load 9 on 2 CPUs
    assert said is not None and said.startswith("this host is short of CPU") and "10% of one core" in said
    clock[0] = 120.0
    assert w.starving(16.0) is None  # said once
    assert w.cpu(None) is None  # the VM is gone: no figures


def test_failed_boot_console_is_kept_bounded_and_few(tmp_path: Path) -> None:
    console_log = tmp_path / "console.log"
    console_log.write_bytes(b"A" * console.KEEP_BYTES + b"B" * console.KEEP_BYTES + b"C" * console.KEEP_BYTES)
    kept = console.keep(console_log, "s1")
    assert kept is not None and kept.parent == paths.failed_boots_dir()
    data = kept.read_bytes()
    assert data.startswith(b"A" * console.KEEP_BYTES) and data.endswith(b"C" * console.KEEP_BYTES)
    assert b"bytes left out" in data and b"B" * 100 not in data
    for i in range(console.KEEP_FAILED + 5):
        (paths.failed_boots_dir() / f"2000{i:04d}-old.console.log").write_text("x")
    console.keep(console_log, "s2")
    assert len(list(paths.failed_boots_dir().iterdir())) == console.KEEP_FAILED
    assert console.keep(tmp_path / "none.log", "s3") is None


def test_a_panic_is_read_from_the_end_of_the_console(tmp_path: Path) -> None:
    """A guest whose kernel panicked spins on (its domain runs): the waits for its sshd read the console's end."""
    console_log = tmp_path / "console.log"
    assert console.panicked(console_log) is None  # (no console yet)
    console_log.write_bytes(b"boot\n" * 100 + b"[ 25.7] Kernel panic - not syncing: Fatal exception in interrupt\n")
    assert console.panicked(console_log) == "its kernel panicked (its console says so)"
    with console_log.open("ab") as f:
        f.write(b"later\n" * (console.PANIC_BYTES // 6 + 1))  # a panic long past (a reboot since) is not read
    assert console.panicked(console_log) is None


def test_a_failed_fork_keeps_its_console_and_says_what_it_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vmsandbox.errors import SaveInFlightError
    from vmsandbox.session.end import lifecycle
    from vmsandbox.session.moments import fork

    files = SessionPaths(tmp_path)
    removed: list[str] = []

    def remove(record: Any) -> None:  # as the real one: the fork's files go (its console with them)
        removed.append(record.name)
        files.console_log.unlink(missing_ok=True)

    monkeypatch.setattr(lifecycle, "remove", remove)
    record: Any = SimpleNamespace(name="f1", files=files)
    files.console_log.write_text(
        "[ 25.7] BUG: kernel NULL pointer dereference\nKernel panic - \x1b]0;owned\x07x\nOops: " + "A" * 5000 + "\n"
    )
    failed = SaveInFlightError("the VM did not answer on SSH within 60 s", "vmsandbox-f1", lambda: False)
    fork._undo(record, failed)
    assert removed == ["f1"]
    assert failed.message.splitlines()[1:] == [  # the same error, its type kept; the guest's lines cut, escaped
        "The fork's console reports:",
        "  [ 25.7] BUG: kernel NULL pointer dereference",
        "  Kernel panic - \\x1b]0;owned\\x07x",
        "  Oops: " + "A" * (fork.LINE_SHOWN - 6),
    ]
    kept = next(paths.failed_boots_dir().glob("*-f1.console.log"))
    assert failed.hint is not None and failed.hint.startswith(f"the fork's console is kept at {kept}; `vmsandbox ls`")
    # an empty console (the VM never wrote one), no console, or not the product's error: removed, nothing added
    for console_text, error in (("", VmsandboxError("restore failed")), (None, VmsandboxError("no room"))):
        if console_text is None:
            files.console_log.unlink(missing_ok=True)
        else:
            files.console_log.write_text(console_text)
        fork._undo(record, error)
        assert error.message in ("restore failed", "no room") and error.hint is None
    fork._undo(record, KeyboardInterrupt())
    assert removed == ["f1"] * 4 and len(list(paths.failed_boots_dir().glob("*-f1.console.log"))) == 1


def test_a_fork_on_another_host_has_its_console_fetched_to_see_a_panic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its console is the other host's (read through libvirt): fetched while the fork is waited for, at most every
    REMOTE_CONSOLE_EVERY seconds, so a kernel panic there ends the wait as one here does."""
    from vmsandbox.session.moments import handover

    files = SessionPaths(tmp_path)
    fetches: list[bool] = []
    there = ["booting\n"]

    def fetch(*, follow: bool) -> Path:  # as RemotePlace.console: the other host's console, copied here
        fetches.append(follow)
        files.console_log.write_text("".join(there))
        return files.console_log

    def vm(elsewhere: bool) -> Any:
        host = SimpleNamespace(abilities=SimpleNamespace(elsewhere=elsewhere))
        info = SimpleNamespace(name="f1", state="running", pid=None, stopped=False)
        return SimpleNamespace(record=SimpleNamespace(files=files), host=host, info=lambda: info, console=fetch)

    clock = [100.0]
    monkeypatch.setattr("vmsandbox.session.moments.handover.time.monotonic", lambda: clock[0])
    alive = handover.alive(vm(elsewhere=True))
    assert alive() is None and fetches == [False]
    there.append("[ 25.7] Kernel panic - not syncing: Fatal exception\n")
    clock[0] += handover.REMOTE_CONSOLE_EVERY / 2
    assert alive() is None and fetches == [False]  # (not fetched again yet)
    clock[0] += handover.REMOTE_CONSOLE_EVERY / 2
    assert alive() == "its kernel panicked (its console says so)" and fetches == [False, False]

    files.console_log.unlink()
    assert handover.alive(vm(elsewhere=False))() is None and len(fetches) == 2  # a local console is read where it is


def test_another_host_s_console_is_copied_as_its_bytes_and_a_fetch_that_fails_stops_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guest writes the console: a byte no locale encodes is copied as it is (it stopped a failed fork's
    removal), and a fetch that fails for any reason leaves the wait (and the removal) to go on."""
    from vmsandbox.session.moments import handover
    from vmsandbox.session.place.remote import log

    files = SessionPaths(tmp_path)
    record: Any = SimpleNamespace(domain="vmsandbox-f1", files=files)
    said = b"boot \xff\x1b]0;owned\x07 Kernel panic - not syncing\n"
    hv: Any = SimpleNamespace(
        volumes=lambda _pool: {"vmsandbox-f1.console.log": "/pool/vmsandbox-f1.console.log"},
        download=lambda *_a, **_kw: SimpleNamespace(kept=bytearray(said)),
    )
    assert log.fetch(record, hv) == said and files.console_log.read_bytes() == said

    def fails(*, follow: bool) -> Path:
        raise UnicodeEncodeError("latin-1", "\ufffd", 0, 1, "not in this locale")

    handover.fetch_console(SimpleNamespace(console=fails))  # type: ignore[arg-type]


def test_session_lock_names_its_holder_and_goes_with_it() -> None:
    r = saved_record("s1")
    busy = rf"session s1 is busy: vmsandbox \(pid {os.getpid()}\) is pulling"
    with (
        lock.held(r.files, "s1", "pulling"),
        pytest.raises(lock.BusyError, match=busy),
        lock.held(r.files, "s1", "destroying"),
    ):
        pass
    with lock.held(r.files, "s1", "destroying"):  # released: free again
        pass
    with pytest.raises(VmsandboxError, match="no session named"), lock.held(paths.session_paths("ghost"), "ghost", "x"):
        pass


def test_a_damaged_record_is_read_from_its_copy_and_mended() -> None:
    r = saved_record("s1", ssh_port=2222)
    r.files.record.write_text(r.files.record.read_text()[:30])
    assert Record.load("s1") == r
    assert Record.load("s1").ssh_port == 2222 and r.files.record.read_text().endswith("}\n")
    r.files.record.write_text("{")
    r.files.record.with_name("session.json.copy").write_text("")
    with pytest.raises(VmsandboxError, match="is damaged, and so is its copy") as caught:
        Record.load("s1")
    assert caught.value.hint is not None and "--discard" in caught.value.hint


def test_capture_refuses_before_copying_when_the_state_disk_is_too_small(
    tmp_path: Path, isolated_dirs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "p"
    project.mkdir()
    (project / "f").write_bytes(b"x" * 100_000)
    (project / "link").symlink_to("/etc/passwd")  # not followed, not counted
    assert capture.project_bytes(project) == 100_000
    capture.check_space(project, tmp_path)  # room enough on the real tmp disk
    monkeypatch.setattr(
        "vmsandbox.sync.inward.capture.shutil.disk_usage", lambda _p: type("U", (), {"free": 10 * 1024**2})()
    )
    with pytest.raises(VmsandboxError, match=r"needs about 64 MiB .* it has 10 MiB free") as caught:
        capture.check_space(project, isolated_dirs / "state" / "sessions")
    assert caught.value.hint is not None and "VMSANDBOX_STATE_DIR" in caught.value.hint


def test_every_fail_point_is_named_and_placed_once() -> None:
    used: list[str] = []
    for source in Path(failpoint.__file__).parent.rglob("*.py"):
        used += re.findall(r'failpoint\.hit\("([a-z.]+)"\)', source.read_text())
    assert sorted(used) == sorted(failpoint.POINTS)
    doc = failpoint.__doc__ or ""
    assert all(f"    {name} " in doc for name in failpoint.POINTS)
    with pytest.raises(ValueError, match="unknown fail-point"):
        failpoint.hit("no.such")


def test_a_teardown_holding_the_lock_is_waited_for(capsys: pytest.CaptureFixture[str]) -> None:
    r = saved_record("s1")
    held = threading.Event()

    def teardown() -> None:
        with lock.held(r.files, "s1", lock.TEARDOWN):
            held.set()
            time.sleep(0.3)
            r.files.record.unlink()  # it removed the session

    t = threading.Thread(target=teardown)
    t.start()
    held.wait(5)
    with pytest.raises(lock.GoneError, match="no session named 's1'"), lock.held(r.files, "s1", "pulling"):
        pass
    t.join()
    assert "Waiting for the VM of session s1 to be destroyed" in capsys.readouterr().err


def test_a_save_writes_what_it_changed_over_what_another_saved_meanwhile() -> None:
    """A checkpoint holds its record while it works and saves new overlays; a port published meanwhile (without
    the session's lock) saves its ports: neither save writes back what the other changed, each takes in the
    other's, and a key this version does not know (a newer vmsandbox's) is kept."""
    saved_record("s1", publish=(Publish(80, 8080),))
    data = json.loads(paths.session_paths("s1").record.read_text())
    paths.session_paths("s1").record.write_text(json.dumps(data | {"newer_key": 7}))
    checkpoint, publisher = Record.load("s1"), Record.load("s1")
    publisher.publish = (*publisher.publish, Publish(3000, 9090))
    publisher.save()
    checkpoint.overlays = [*checkpoint.overlays, "disk-2.qcow2"]
    checkpoint.save()
    assert checkpoint.publish == publisher.publish  # taken in
    publisher.ssh_port = 2200
    publisher.save()
    assert publisher.overlays == checkpoint.overlays
    now = Record.load("s1")
    assert now.publish == (Publish(80, 8080), Publish(3000, 9090)) and now.overlays == checkpoint.overlays
    assert now.ssh_port == 2200 and json.loads(now.files.record.read_text())["newer_key"] == 7
    assert json.loads(now.files.record.with_name("session.json.copy").read_text()) == json.loads(
        now.files.record.read_text()
    )
    both = Record.load("s1")
    now.unsynced, both.unsynced = 3, 5  # a field both changed: the last save's
    now.save()
    both.save()
    assert Record.load("s1").unsynced == 5


def test_a_command_with_patience_waits_for_any_holder_then_says_who_kept_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    r = saved_record("s1")
    taken, let_go = threading.Event(), threading.Event()

    def checkpoint() -> None:
        with lock.held(r.files, "s1", "taking a checkpoint of"):
            taken.set()
            let_go.wait(5)

    t = threading.Thread(target=checkpoint)
    t.start()
    taken.wait(5)
    still = r"session s1 is still busy: .* is taking a checkpoint of it"
    with pytest.raises(lock.BusyError, match=still), lock.held(r.files, "s1", "publishing a port of", patience=0.2):
        pass
    said = f"Waiting for session s1: vmsandbox (pid {os.getpid()}) is taking a checkpoint of it"
    assert said in capsys.readouterr().err
    publishing = lock.held(r.files, "s1", "publishing a port of", beside=lock.REVIEWING)
    with pytest.raises(lock.BusyError, match="is busy"), publishing:  # beside a review only, not a checkpoint
        pass
    threading.Timer(0.2, let_go.set).start()
    with lock.held(r.files, "s1", "publishing a port of", patience=5):  # the holder lets go within it
        assert let_go.is_set()
    t.join()


@pytest.fixture
def ports_of_s1(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Publish, ...]]:
    """Session s1, running as `port publish` sees it, port 8080 published; the ports each change served."""
    saved_record("s1", publish=(Publish(80, 8080),))
    monkeypatch.setattr("vmsandbox.session.running.reach.state.is_running", lambda _record: True)
    monkeypatch.setattr("vmsandbox.egress.ports.choose", lambda wanted: tuple(replace(p, host=9090) for p in wanted))
    applied: list[tuple[Publish, ...]] = []
    monkeypatch.setattr(reach, "_apply_ports", lambda record: applied.append(record.publish))
    return applied


def test_a_port_published_waits_for_a_checkpoint_and_both_are_kept(ports_of_s1: list[tuple[Publish, ...]]) -> None:
    """A checkpoint (or a stop, a rollback, an `rm`) starts and stops the session's egress daemon under the
    session's lock: `port publish` waits for it, then reads the record as the checkpoint left it."""
    files = paths.session_paths("s1")
    taken, publishing = threading.Event(), threading.Event()

    def checkpoint() -> None:
        with lock.held(files, "s1", "taking a checkpoint of"):
            record = Record.load("s1")
            taken.set()
            publishing.wait(5)
            time.sleep(0.2)  # (the publish waits meanwhile: without the lock it would have served its port by now)
            assert ports_of_s1 == []
            record.overlays = ["disk-3.qcow2"]
            record.save()

    t = threading.Thread(target=checkpoint)
    t.start()
    taken.wait(5)
    publishing.set()
    chosen = reach.publish("s1", Publish(3000))
    t.join()
    saved = Record.load("s1")
    assert saved.overlays == ["disk-3.qcow2"] and saved.publish == (Publish(80, 8080), chosen)
    assert chosen.host == 9090 and ports_of_s1 == [saved.publish]
    for field, value, said in (("saved", True, "stopped"), ("ending", "remove", "ending")):
        changed = Record.load("s1")
        setattr(changed, field, value)
        changed.save()
        with pytest.raises(VmsandboxError, match=f"session s1 is {said}"):
            reach.unpublish("s1", 3000, None)
        setattr(changed, field, Record.load("s1").__dataclass_fields__[field].default)
        changed.save()
    assert [p.guest for p in reach.unpublish("s1", 3000, None)] == [3000]
    assert Record.load("s1").publish == (Publish(80, 8080),) and Record.load("s1").overlays == ["disk-3.qcow2"]


def test_a_page_of_a_review_publishes_under_the_review_s_lock_and_the_review_keeps_it(
    ports_of_s1: list[tuple[Publish, ...]],
) -> None:
    """`run --review web`: the review holds the session's lock while the person decides, and the page it serves
    (threads of the same process) publishes a port: at once, and the review's own save afterwards keeps it."""
    files = paths.session_paths("s1")
    with lock.held(files, "s1", lock.REVIEWING):
        review = Record.load("s1")
        served: list[Publish] = []
        page = threading.Thread(target=lambda: served.append(reach.publish("s1", Publish(3000))))
        page.start()
        page.join(5)
        assert served and not page.is_alive()
        review.unsynced = 0
        review.save()
    assert Record.load("s1").publish == (Publish(80, 8080), served[0]) and Record.load("s1").unsynced == 0


def test_a_save_takes_in_nothing_when_its_write_fails_and_never_writes_over_another_session(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    r = saved_record("s1")
    data = json.loads(r.files.record.read_text())
    data["publish"] = [{"guest": 80, "host": 8080}]  # (an older vmsandbox's: no addresses; read with the default)
    r.files.record.write_text(json.dumps(data))
    old, other = Record.load("s1"), Record.load("s1")
    other.publish = (*other.publish, Publish(3000, 9090))
    other.save()
    old.overlays = ["disk-2.qcow2"]
    old.save()  # (its publish, read as this version reads it, is not a change of its own)
    assert Record.load("s1").publish == (Publish(80, 8080), Publish(3000, 9090))
    stale, newer = Record.load("s1"), Record.load("s1")
    newer.ssh_port = 2200
    newer.save()

    def full(*_: object) -> None:
        raise OSError(28, "No space left on device")

    stale.unsynced = 4
    with monkeypatch.context() as m, pytest.raises(OSError):
        m.setattr("vmsandbox.session.record.filewrite.write_atomically", full)
        stale.save()
    assert stale.ssh_port == 1  # nothing taken in from a save that did not happen
    stale.save()
    assert Record.load("s1").ssh_port == 2200 and Record.load("s1").unsynced == 4
    gone = Record.load("s1")
    shutil.rmtree(r.files.root)
    saved_record("s1", project="/new")  # removed, and another made with its name
    gone.unsynced = 9
    with pytest.raises(VmsandboxError, match="was removed, and another made with its name"):
        gone.save()
    assert Record.load("s1").project == "/new" and Record.load("s1").unsynced is None


def test_a_save_waits_for_another_a_while_then_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    r = saved_record("s1")
    monkeypatch.setattr("vmsandbox.session.recordfile.SAVE_WAIT", 0.2)
    fd = os.open(r.files.root / "session.json.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # (a command stopped while it saved)
        with pytest.raises(VmsandboxError, match="was held by another command for 0 s") as caught:
            r.save()
        assert caught.value.hint is not None and "`fg` it" in caught.value.hint
    finally:
        os.close(fd)
    r.save()


def test_an_ending_session_is_listed_as_ending() -> None:
    r = saved_record("s1", ending="remove")
    with choose.vm_of(r) as vm:
        assert state.status(vm).state is State.ENDING
    with pytest.raises(VmsandboxError, match="session s1 is ending"):
        state.usable(r)


def test_a_boot_that_stalls_after_its_last_reset_is_given_up_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two resets of a stalled early boot; a third stall fails the boot then, not at the boot timeout."""
    from vmsandbox.session.place.local import bootwait
    from vmsandbox.vm.node import DomainInfo

    clock = [0.0]
    monkeypatch.setattr("vmsandbox.session.place.console.time.monotonic", lambda: clock[0])
    monkeypatch.setattr(console, "host_load", lambda: (0.5, 2))
    console_log = tmp_path / "console.log"
    resets: list[str] = []

    class Host:
        def info(self, name: str) -> DomainInfo:
            return DomainInfo(name, "running", None)

        def cpu_seconds(self, _name: str) -> float:
            return clock[0]

        def reset(self, name: str) -> None:
            resets.append(name)

    def until(alive: bootwait.Alive) -> float:
        booted = -1
        while clock[0] < 300:  # the boot timeout: never reached
            if booted < len(resets):  # each boot (the first, and one after each reset) stops in the initramfs
                booted = len(resets)
                with console_log.open("a") as f:
                    f.write("[    0.000000] Linux version 6.1.0\nLoading, please wait...\n")
            assert alive() is None
            clock[0] += 1.0
        raise AssertionError("the third stall was waited out")

    b = bootwait.Booting("vmsandbox-s1", console_log, "s1", "tcg", "Booting")
    with pytest.raises(VmsandboxError) as caught:
        bootwait.wait(b, Host(), 300, until)  # type: ignore[arg-type]
    assert resets == ["vmsandbox-s1", "vmsandbox-s1"]
    assert clock[0] < 4 * console.STALL_MAX  # three stall limits, not the 300 s timeout
    message = caught.value.message
    assert message.startswith("the guest stopped early in each of its 3 boots (60 s without output after")
    assert "the boot got as far as: the initramfs ran; systemd did not start (after 2 reset(s)" in message
