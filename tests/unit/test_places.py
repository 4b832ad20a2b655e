"""A session on this machine and one on another host take the same path through the policy modules: the same
steps of the place interfaces (Host, VM and what they reach) in the same order, chosen by session.place.choose from
the record alone. The policy runs for real (locks, records, checkpoints' files, states asked of libvirt's in-process
test:/// driver, where both places' domains live); the places record the steps they are asked for and do the
least that keeps libvirt's answers true."""

from __future__ import annotations

import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from vmsandbox.egress.rules.netpolicy import Mode
from vmsandbox.errors import SaveInFlightError
from vmsandbox.image.store import Image
from vmsandbox.session import lock, state
from vmsandbox.session.end import lifecycle
from vmsandbox.session.moments import checkpoint, fork, suspend
from vmsandbox.session.options import Options
from vmsandbox.session.place import choose, hostspec
from vmsandbox.session.place.checkpoints import Checkpoint
from vmsandbox.session.place.hostspec import HostSpec
from vmsandbox.session.place.interface import VM, Facts, Forks, Host, Images, Saved, SavedVM, Sharing, Snapshots
from vmsandbox.session.place.local.place import (
    LocalFacts,
    LocalForks,
    LocalHost,
    LocalImages,
    LocalSaved,
    LocalSnapshots,
    LocalVM,
)
from vmsandbox.session.place.remote.place import (
    RemoteFacts,
    RemoteForks,
    RemoteHost,
    RemoteImages,
    RemoteSaved,
    RemoteSnapshots,
    RemoteVM,
)
from vmsandbox.session.record import Record, State
from vmsandbox.session.settings import Settings
from vmsandbox.session.start import create
from vmsandbox.vm import accel
from vmsandbox.vm.virt import Hypervisor

HERE = "test:///default"
THERE = "qemu+ssh://me@far.example/system"


def _running(hv: Hypervisor, name: str) -> None:
    root = ET.Element("domain", {"type": "test"})
    ET.SubElement(root, "name").text = name
    ET.SubElement(root, "memory").text = "65536"
    ET.SubElement(ET.SubElement(root, "os"), "type").text = "hvm"
    hv.create(ET.tostring(root, encoding="unicode"))


Bound = Host | Images | Facts | VM | Saved | Snapshots | Forks
OF_HOST = (Images, Facts)  # reached from a Host
OF_VM = (Saved, Snapshots, Forks)  # reached from a VM
HERE_KINDS = (LocalHost, LocalImages, LocalFacts, LocalVM, LocalSaved, LocalSnapshots, LocalForks)
THERE_KINDS = (RemoteHost, RemoteImages, RemoteFacts, RemoteVM, RemoteSaved, RemoteSnapshots, RemoteForks)


def _bound(bound: Bound, args: tuple[Any, ...]) -> tuple[Record | None, Hypervisor]:
    """The record a step is about (bound to it, or given to a Host) and the connection it runs on."""
    if isinstance(bound, OF_VM):
        return bound.vm.record, bound.vm.host.libvirt()
    if isinstance(bound, VM):
        return bound.record, bound.host.libvirt()
    if isinstance(bound, OF_HOST):
        return None, bound.host.libvirt()
    return next((a for a in args if isinstance(a, Record)), None), bound.libvirt()


class Steps:
    """What the policy asked of a place, in order, and the little a place must do for libvirt to agree."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.saved: set[str] = set()

    def __call__(self, name: str, bound: Bound, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.asked.append(name)
        record, hv = _bound(bound, args)
        if name == "Host.forget":
            hv.destroy(args[1])  # the VM goes with what its place kept of it
        if record is not None:
            self._emulate(name, record, hv, args, kwargs)
        answers = {
            "Host.admit": accel.choose(accel.Accel.TCG),
            "Saved.held": record is not None and record.name in self.saved,
            "Saved.memory": SavedVM(),
            "Snapshots.memory_of": SavedVM(),
            "Snapshots.sizes": {},
        }
        if name == "Host.boot" and isinstance(bound, Host) and record is not None:
            return bound.vm(record)
        return answers.get(name)

    def _emulate(self, name: str, record: Record, hv: Hypervisor, args: tuple[Any, ...], kw: dict[str, Any]) -> None:
        if name in ("Host.boot", "Saved.restore"):
            _running(hv, record.domain)
        if name == "Host.boot":
            kw["launched"]()
        if name in ("Saved.take", "Snapshots.freeze"):
            hv.destroy(record.domain)  # the VM is down once it is saved
            self.saved.add(record.name)
        if name == "Snapshots.freeze":
            args[-1]()  # publish: the checkpoint's record is whole


NOT_STEPS = ("vm", "libvirt", "close", "info")


def _steps(interface: type[Any], steps: Steps, reached: dict[str, type[Any]]) -> dict[str, Any]:
    """Every step of `interface` recorded (and emulated) instead of carried out, but for what it reaches (the
    interfaces its properties give, by name: recording too), the binding of a VM (left to the class), and the
    connection and what libvirt says of a VM (the test driver's own)."""

    def step(name: str) -> Callable[..., Any]:
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            return steps(f"{interface.__name__}.{name}", self, args, kwargs)

        return method

    made = {name: step(name) for name in sorted(interface.__abstractmethods__) if name not in (*reached, *NOT_STEPS)}
    return made | {name: property(kind) for name, kind in reached.items()}


def _recorded(kinds: tuple[type[Any], ...], interface: type[Any], steps: Steps, **reached: type[Any]) -> type[Any]:
    """The place's implementation of `interface` (one of `kinds`), recording its steps."""
    kind = next(k for k in kinds if issubclass(k, interface))
    return type(f"Recording{kind.__name__}", (kind,), _steps(interface, steps, reached))


def _recording(kinds: tuple[type[Any], ...], steps: Steps) -> type[Host]:
    """A place's Host (and the VMs and what they reach, that it binds) with every step recorded instead of
    carried out; `kinds`: the place's implementations of the interfaces."""
    of_vm = {i.__name__.lower(): _recorded(kinds, i, steps) for i in OF_VM}
    recorded_vm = _recorded(kinds, VM, steps, **of_vm)

    def vm(self: Host, record: Record) -> VM:
        return recorded_vm(self, record)  # type: ignore[no-any-return]

    of_host = {i.__name__.lower(): _recorded(kinds, i, steps) for i in OF_HOST}
    recorded_host = _recorded(kinds, Host, steps, **of_host)
    recorded_host.vm = vm
    return recorded_host


@pytest.fixture
def one_libvirt(monkeypatch: pytest.MonkeyPatch) -> Iterator[Hypervisor]:
    """Every connection, to any URI, is one connection to the test driver (its domains are per connection)."""
    shared = Hypervisor(HERE)
    conn = shared._conn  # the one connection every Hypervisor of the test shares

    def opened(self: Hypervisor, uri: str = HERE) -> None:
        self.uri = uri
        self._conn = conn

    monkeypatch.setattr(Hypervisor, "__init__", opened)
    monkeypatch.setattr(Hypervisor, "close", lambda self: None)
    yield shared
    conn.close()


@pytest.fixture
def quiet_guest(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guest and the egress daemon are not there: their steps are place-blind and not what is compared."""
    from vmsandbox.egress import control
    from vmsandbox.guest import commands, ssh

    monkeypatch.setattr(commands, "run_as_root", lambda *a, **k: None)
    monkeypatch.setattr(ssh, "wait_for_banner", lambda *a, **k: 0.0)
    monkeypatch.setattr(control, "stop", lambda *a, **k: None)


def _walk(name: str, host: HostSpec | None, project: Path) -> None:
    """A session made with `run --keep` (here, or on `host`), then checkpointed, stopped, started, its checkpoint
    removed, and destroyed."""
    settings = Settings(libvirt_uri=HERE, network=Mode.NONE)
    image = Image("v", project, {})
    create.create(Options(project=project, name=name, settings=settings, keep=True, image=image, host=host))
    checkpoint.take(name, "c1")
    suspend.stop(name)
    suspend.start(name)
    checkpoint.remove(name, "c1")
    lifecycle.destroy(Record.load(name), force=False, discard=True, limit=1)


def test_a_session_here_and_one_there_take_the_same_steps(
    monkeypatch: pytest.MonkeyPatch, one_libvirt: Hypervisor, quiet_guest: None, tmp_path: Path
) -> None:
    here, there = Steps(), Steps()
    monkeypatch.setattr(choose, "LocalHost", _recording(HERE_KINDS, here))
    monkeypatch.setattr(choose, "RemoteHost", _recording(THERE_KINDS, there))
    # the project's capture and the session's keys and identity files are made the same way for every place
    monkeypatch.setattr(create, "_prepare", lambda record, *_: record.save())
    project = tmp_path / "project"
    project.mkdir()

    _walk("s1", None, project)
    _walk("s2", HostSpec("far", THERE), project)

    assert here.asked == there.asked
    assert here.asked == [
        "Host.admit",  # run --keep: room and accelerator there, the VM started
        "Host.boot",
        "Snapshots.freeze_live",  # checkpoint: while it runs, where the place can (neither can here)
        "Snapshots.freeze",  # else (room in the disk chain: the host's abilities say) saved into it, resumed
        "Snapshots.memory_of",  # from it
        "Saved.restore",
        "Saved.take",  # stop
        "Saved.held",  # start: the VM is gone, its save is there: stopped
        "Saved.memory",
        "Saved.restore",
        "Saved.discard",
        "Snapshots.drop",  # checkpoint rm
        "Host.forget",  # destroy
    ]
    assert not (one_libvirt.info("vmsandbox-s1") or one_libvirt.info("vmsandbox-s2"))


def test_the_chooser_reads_the_place_from_the_record_alone() -> None:
    here = Record("a", "/p", "v", "tcg", "", 1, 512, 1024, 0, "u", 1000, 1000, "qemu:///system")
    there = Record("b", "/p", "v", "tcg", "", 1, 512, 1024, 0, "u", 1000, 1000, THERE, host="far")
    with choose.vm_of(here) as vm:  # nothing is asked of libvirt: no connection is opened
        assert type(vm) is LocalVM and type(vm.host) is LocalHost and state.where(vm.host) == ""
        assert type(vm.saved) is LocalSaved and type(vm.host.images) is LocalImages
    with choose.vm_of(there) as vm:
        assert type(vm) is RemoteVM and type(vm.host) is RemoteHost and state.where(vm.host) == " on host far"
        assert type(vm.forks) is RemoteForks and type(vm.host.facts) is RemoteFacts
    with choose.host(choose.spec_at(THERE)) as host:
        assert type(host) is RemoteHost and host.spec.name == "far.example"
    assert [h.name for h in hostspec.every("qemu:///system", ())] == ["local"]


def test_a_place_answers_with_data_and_its_caller_says_it(tmp_path: Path) -> None:
    """No words for people in a place: what a stopped session's save takes, where a VM runs and what its forks
    share are data, said by the policy that shows them."""
    here = Record("a", "/p", "v", "tcg", "", 1, 512, 1024, 0, "u", 1000, 1000, "qemu:///system")
    there = Record("b", "/p", "v", "tcg", "", 1, 512, 1024, 0, "u", 1000, 1000, THERE, host="far")
    here.files.root.mkdir(parents=True)
    here.files.saved_memory.write_bytes(b"\0" * 3 * 1024**2)
    assert suspend.where_saved(here) == "3 MiB of memory saved"
    with choose.vm_of(there) as vm:
        assert state.where(vm.host) == " on host far"
        with vm.forks.share(Checkpoint("c1", 1.0, ["o.qcow2"], tmp_path / "c1")) as how:
            assert how.mapped is None and how.unshared
    assert fork._shared(how) == f"each restores a copy ({how.unshared})"
    assert fork._shared(Sharing(5 * 1024**2)) == "5 MiB mapped copy-on-write, one copy for all"


def test_a_checkpoint_carries_no_place(tmp_path: Path) -> None:
    cp = Checkpoint("c1", 1.0, ["o.qcow2"], tmp_path / "c1")
    assert cp.overlay == "o.qcow2" and cp.memory == tmp_path / "c1" / "memory.save"


class HeldSaves(Steps):
    """A place whose save libvirt could not abort past its deadline: the file is being written, the VM runs on, and
    the save ends when the test says (`ends`), saved or not (`saves`)."""

    def __init__(self) -> None:
        super().__init__()
        self.ends = threading.Event()
        self.saves = False

    def __call__(self, name: str, bound: Bound, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if name == "Saved.take" and isinstance(bound, Saved):
            from vmsandbox.errors import SaveInFlightError

            bound.vm.record.files.saved_memory.write_bytes(b"being written")
            raise SaveInFlightError("the save ended neither in 60 s nor 30 s after abortJob", "d", self.outcome)
        return super().__call__(name, bound, args, kwargs)

    def outcome(self) -> bool:
        self.ends.wait(30)
        return self.saves


def _until(what: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not what():
        assert time.monotonic() < deadline, "the save was not settled"
        time.sleep(0.02)


@pytest.mark.parametrize("saves", [True, False])
def test_a_save_that_outlives_its_abort_is_settled_when_it_ends(
    monkeypatch: pytest.MonkeyPatch, one_libvirt: Hypervisor, quiet_guest: None, tmp_path: Path, saves: bool
) -> None:
    """The guard's stop whose save libvirt did not abort in time: until the save ends, the session runs and its file
    (which may yet hold all of its memory) is kept; then it is stopped (saved: `start` resumes it), or the file
    goes and it runs on (not saved)."""
    steps = HeldSaves()
    monkeypatch.setattr(choose, "LocalHost", _recording(HERE_KINDS, steps))
    monkeypatch.setattr(create, "_prepare", lambda record, *_: record.save())
    project = tmp_path / "project"
    project.mkdir()
    settings = Settings(libvirt_uri=HERE, network=Mode.NONE)
    create.create(Options(project=project, name="s3", settings=settings, keep=True, image=Image("v", project, {})))

    with pytest.raises(SaveInFlightError, match="abortJob") as err:
        suspend.stop("s3", why="stopped by the memory guard", save_deadline=60)
    assert err.value.hint is not None and "virsh domjobabort d" in err.value.hint
    record = Record.load("s3")
    assert not record.saved and record.files.saved_memory.read_bytes() == b"being written"
    with choose.vm_of(record) as vm:
        assert state.status(vm).state is State.RUNNING

    steps.saves = saves
    if saves:  # the save ended after all: the VM is down, its memory in the file
        one_libvirt.destroy(record.domain)
        steps.saved.add("s3")
    steps.ends.set()
    if saves:
        _until(lambda: Record.load("s3").saved)
        with lock.held(record.files, "s3", "waiting for the settle to let go", wait=True):  # (it saves, then lets go)
            pass
        assert Record.load("s3").stop_note == "stopped by the memory guard"
        suspend.start("s3")
        assert not Record.load("s3").saved and one_libvirt.info(record.domain)
    else:
        _until(lambda: not record.files.saved_memory.exists())
        assert not Record.load("s3").saved and one_libvirt.info(record.domain)
