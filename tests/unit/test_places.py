"""A session on this machine and one on another host take the same path through the policy modules: the same
Place steps in the same order, chosen by session.places from the record alone. The policy runs for real (locks,
records, checkpoints' files, states asked of libvirt's in-process test:/// driver, where both places' domains
live); the places record the steps they are asked for and do the least that keeps libvirt's answers true."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from vmsandbox.egress.netpolicy import Mode
from vmsandbox.image.store import Image
from vmsandbox.session.end import lifecycle
from vmsandbox.session.moments import checkpoint, suspend
from vmsandbox.session.options import Options
from vmsandbox.session.place import choose as places
from vmsandbox.session.place.checkpoints import Checkpoint
from vmsandbox.session.place.hostspec import HostSpec
from vmsandbox.session.place.interface import Place, SavedVM
from vmsandbox.session.place.local.place import LocalPlace
from vmsandbox.session.place.remote.place import RemotePlace
from vmsandbox.session.record import Record
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


class Steps:
    """What the policy asked of a place, in order, and the little a place must do for libvirt to agree."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.saved: set[str] = set()

    def __call__(self, name: str, place: Place, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.asked.append(name)
        record = next((a for a in args if isinstance(a, Record)), None)
        hv = next((a for a in args if isinstance(a, Hypervisor)), None)
        if record is not None and hv is not None:
            self._emulate(name, record, hv, args, kwargs)
        answers = {
            "admit": accel.choose(accel.Accel.TCG),
            "holds_save": record is not None and record.name in self.saved,
            "stopped": SavedVM(),
            "memory_of": SavedVM(),
            "sizes": {},
            "forget_unanswered": False,
        }
        return args[-1] if name == "unanswered" else answers.get(name)

    def _emulate(self, name: str, record: Record, hv: Hypervisor, args: tuple[Any, ...], kw: dict[str, Any]) -> None:
        if name in ("boot", "restore"):
            _running(hv, record.domain)
        if name == "boot":
            kw["launched"]()
        if name in ("save", "freeze"):
            hv.destroy(record.domain)  # the VM is down once it is saved
            self.saved.add(record.name)
        if name == "freeze":
            args[-1]()  # publish: the checkpoint's record is whole


def _recording(kind: type[Place], steps: Steps) -> type[Place]:
    """`kind` with every step of the interface recorded (and emulated) instead of carried out."""

    def step(name: str) -> Callable[..., Any]:
        def method(self: Place, *args: Any, **kwargs: Any) -> Any:
            return steps(name, self, args, kwargs)

        return method

    overrides = {name: step(name) for name in sorted(Place.__abstractmethods__) if name not in ("where", "release")}
    overrides["libvirt_for"] = lambda self, here: HERE
    return type(f"Recording{kind.__name__}", (kind,), overrides)


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
    monkeypatch.setattr(places, "LocalPlace", _recording(LocalPlace, here))
    monkeypatch.setattr(places, "RemotePlace", _recording(RemotePlace, there))
    # the project's capture and the session's keys and identity files are made the same way for every place
    monkeypatch.setattr(create, "_prepare", lambda record, *_: record.save())
    project = tmp_path / "project"
    project.mkdir()

    _walk("s1", None, project)
    _walk("s2", HostSpec("far", THERE), project)

    assert here.asked == there.asked
    assert here.asked == [
        "admit",  # run --keep: room and accelerator there, the VM started
        "boot",
        "check_room",  # checkpoint: room in the disk chain, the VM saved into it, resumed from it
        "freeze",
        "memory_of",
        "restore",
        "save",  # stop
        "holds_save",  # start: the VM is gone, its save is there: stopped
        "stopped",
        "restore",
        "started",
        "drop",  # checkpoint rm
        "forget",  # destroy
    ]
    assert not (one_libvirt.info("vmsandbox-s1") or one_libvirt.info("vmsandbox-s2"))


def test_the_chooser_reads_the_place_from_the_record_alone() -> None:
    here = Record("a", "/p", "v", "tcg", "", 1, 512, 1024, 0, "u", 1000, 1000, "qemu:///system")
    there = Record("b", "/p", "v", "tcg", "", 1, 512, 1024, 0, "u", 1000, 1000, THERE, host="far")
    assert type(places.of(here)) is LocalPlace and places.of(here).where == ""
    assert type(places.of(there)) is RemotePlace and places.of(there).where == " on host far"
    assert type(places.of_uri(THERE)) is RemotePlace and places.of_uri(THERE).name == "far.example"
    assert [p.name for p in places.every("qemu:///system", ())] == ["local"]


def test_a_checkpoint_carries_no_place(tmp_path: Path) -> None:
    cp = Checkpoint("c1", 1.0, ["o.qcow2"], tmp_path / "c1")
    assert cp.overlay == "o.qcow2" and cp.memory == tmp_path / "c1" / "memory.save"
