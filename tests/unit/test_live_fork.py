"""A live save's pure parts: libvirt's snapshot document (only the system disk switched, every other disk left as
it is), the bound on a save that does not converge, and qemu-img's pinned chain of a fork's copy."""

from __future__ import annotations

import shutil
import threading
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.unit.conftest import saved_record
from vmsandbox import paths, proc
from vmsandbox.errors import VmsandboxError
from vmsandbox.session.place import chain, checkpoints
from vmsandbox.session.place.checkpoints import Checkpoint
from vmsandbox.session.place.local import disks
from vmsandbox.session.record import Record
from vmsandbox.vm import livesave, qemuimg

LIVE = """<domain type='qemu'><name>vmsandbox-a</name><devices>
<disk type='file' device='disk'><driver name='qemu' type='qcow2'/>
  <source file='/s/a/overlay-2.qcow2' index='3'/>
  <backingStore type='file' index='2'><format type='qcow2'/><source file='/s/a/overlay.qcow2'/></backingStore>
  <target dev='vda' bus='virtio'/></disk>
<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='/s/a/workspace.raw'/>
  <target dev='sda' bus='scsi'/></disk>
<disk type='file' device='cdrom'><target dev='sdb' bus='scsi'/></disk>
</devices></domain>"""


def test_the_snapshot_switches_the_system_disk_only() -> None:
    top, new = Path("/s/a/overlay-2.qcow2"), Path("/s/a/overlay-3.qcow2")
    doc = ET.fromstring(livesave.snapshot_xml(LIVE, Path("/s/a/checkpoints/.tmp-x/memory.save"), top, new))  # noqa: S314 - ours
    memory = doc.find("memory")
    assert memory is not None and memory.attrib == {
        "snapshot": "external",
        "file": "/s/a/checkpoints/.tmp-x/memory.save",
    }
    disks = {d.get("name"): d for d in doc.iter("disk")}
    assert set(disks) == {"vda", "sda", "sdb"}
    assert disks["vda"].get("snapshot") == "external"
    source = disks["vda"].find("source")
    assert source is not None and source.get("file") == str(new)
    assert disks["sda"].get("snapshot") == disks["sdb"].get("snapshot") == "no"


def test_the_snapshot_is_refused_for_a_vm_not_running_on_that_overlay() -> None:
    with pytest.raises(VmsandboxError, match="does not run on"):
        livesave.snapshot_xml(LIVE, Path("/m"), Path("/s/a/overlay.qcow2"), Path("/s/a/new.qcow2"))


def test_a_save_that_converges_is_not_paused() -> None:
    calls: list[str] = []
    paused = livesave.bounded(lambda: calls.append("save"), lambda: calls.append("pause"), lambda: None, "d", 5)
    assert paused is False and calls == ["save"]


def test_a_save_that_does_not_converge_pauses_its_guest_then_ends() -> None:
    paused_event = threading.Event()
    calls: list[str] = []

    def save() -> None:
        assert paused_event.wait(5), "never paused"
        calls.append("saved")

    def pause() -> None:
        calls.append("pause")
        paused_event.set()

    assert livesave.bounded(save, pause, lambda: calls.append("abort"), "d", converge=0.05) is True
    assert calls == ["pause", "saved"]


def test_a_save_that_ends_neither_way_is_aborted_and_said() -> None:
    release = threading.Event()
    calls: list[str] = []

    def abort() -> None:
        calls.append("abort")
        release.set()

    with pytest.raises(VmsandboxError, match="did not end"):
        livesave.bounded(lambda: release.wait(5), lambda: calls.append("pause"), abort, "d", 0.05, 0.05)
    assert calls == ["pause", "abort"]


def test_a_failed_save_raises_its_error() -> None:
    def save() -> None:
        raise OSError("no room")

    with pytest.raises(OSError, match="no room"):
        livesave.bounded(save, lambda: None, lambda: None, "d", 5)


def test_the_forks_chain_is_pinned_top_first_with_commas_escaped() -> None:
    opts = qemuimg.pinned([Path("/s/a,b/top.qcow2"), Path("/s/a,b/mid.qcow2")], Path("/i/base.qcow2"))
    assert opts.split(",file.filename=")[0] == "driver=qcow2,file.driver=file"
    assert "file.filename=/s/a,,b/top.qcow2" in opts
    assert "backing.file.filename=/s/a,,b/mid.qcow2" in opts
    assert opts.endswith(
        "backing.backing.driver=qcow2,backing.backing.file.driver=file,backing.backing.file.filename=/i/base.qcow2"
    )


def test_a_rebase_names_the_base_by_its_path_and_a_pinned_lower_chain_by_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Onto root's base, the new backing is its path (qemu-img finds it in the pinned chain and reads only the
    overlays; were it not found, root's image would be opened by its own header). Onto a session's overlay it
    stays a `json:` chain: by its path, qemu-img would fall back to reading that overlay's header, which the
    session's QEMU may have rewritten."""
    head = bytearray(qemuimg.QCOW2_HEADER)
    head[:4], head[4:8] = qemuimg.QCOW2_MAGIC, (3).to_bytes(4, "big")
    images = [tmp_path / n for n in ("top.qcow2", "mid.qcow2", "low.qcow2")]
    for image in images:
        image.write_bytes(bytes(head))
    base = Path("/images/base.qcow2")
    told: list[list[str]] = []
    monkeypatch.setattr(proc, "run", lambda argv, **kw: told.append([str(a) for a in argv]))
    qemuimg.rebase_pinned(images, base, 1 << 30)
    assert told[0][told[0].index("-b") + 1] == str(base)
    told.clear()
    qemuimg.rebase_pinned(images, base, 1 << 30, keep=1)
    new = told[0][told[0].index("-b") + 1]
    assert new.startswith("json:") and str(images[2]) in new and str(base) in new
    unsafe = ["qemu-img", "rebase", "-q", "-u", "-f", "qcow2", "-b", str(images[2]), "-F", "qcow2", str(images[0])]
    assert told[1] == unsafe  # the header then names the new backing's path


@pytest.mark.parametrize(
    ("named", "trusted"),
    [
        ("{images}/base-x/disk.qcow2", True),
        ("/var/tmp/host-secret", False),
        ("{images}/../../etc/shadow", False),  # (lexically under it, but not as it reads)
        ("{images}", False),
        ("disk.qcow2", False),  # (relative: to the overlay's own directory)
        (None, False),
    ],
)
def test_an_older_sessions_base_is_trusted_only_where_the_host_keeps_its_images(
    monkeypatch: pytest.MonkeyPatch, named: str | None, trusted: bool
) -> None:
    """A session made before the host recorded the image below its overlays (record.below): the bottom overlay's
    header names it, and its QEMU may have rewritten that to a file of the host's, which a fork's copy or a fold
    would read into its disk. Only a name in the images directory, as written, is taken."""
    record = saved_record("legacy")
    assert record.below is None
    images = str(paths.images_dir().absolute())
    header = None if named is None else named.format(images=images)
    found = qemuimg.ImageInfo(record.files.root / record.overlays[0], "qcow2", 1 << 30, 0, header)
    monkeypatch.setattr(qemuimg, "info", lambda path: found)
    if trusted:
        assert disks.trusted_below(record) == Path(str(header))
    else:
        with pytest.raises(VmsandboxError, match="made by an older vmsandbox"):
            disks.trusted_below(record)
    record.below = "/recorded/base.qcow2"
    assert disks.trusted_below(record) == Path("/recorded/base.qcow2")  # the record's, no header read


def test_an_overlay_with_an_external_data_file_is_refused(tmp_path: Path) -> None:
    head = bytearray(qemuimg.QCOW2_HEADER)
    head[:4], head[4:8] = qemuimg.QCOW2_MAGIC, (3).to_bytes(4, "big")
    plain = tmp_path / "plain.qcow2"
    plain.write_bytes(bytes(head))
    qemuimg.plain_qcow2(plain, 1 << 30)
    head[72:80] = qemuimg.QCOW2_EXTERNAL_DATA.to_bytes(8, "big")
    (tmp_path / "data.qcow2").write_bytes(bytes(head))
    with pytest.raises(VmsandboxError, match="external data file"):
        qemuimg.plain_qcow2(tmp_path / "data.qcow2", 1 << 30)
    head[72:80], head[24:32] = bytes(8), (1 << 50).to_bytes(8, "big")  # a petabyte: a rebase would walk it for hours
    (tmp_path / "huge.qcow2").write_bytes(bytes(head))
    with pytest.raises(VmsandboxError, match="larger disk"):
        qemuimg.plain_qcow2(tmp_path / "huge.qcow2", 1 << 30)
    (tmp_path / "short").write_bytes(b"QFI")
    with pytest.raises(VmsandboxError, match="not a qcow2"):
        qemuimg.plain_qcow2(tmp_path / "short", 1 << 30)


def test_passes_while_the_guest_runs_only_where_qemu_sees_every_write() -> None:
    """KVM's dirty log; TCG's from QEMU 9.0 (03bfc2188f): before it, a live save under TCG loses writes. A QEMU
    process whose binary was replaced since it started (an upgrade) may be the older one: not trusted."""
    exe = "/usr/bin/qemu-system-x86_64"
    assert livesave.passes_are_sound("kvm", "7.2.22", None)
    assert not livesave.passes_are_sound("tcg", "7.2.22", exe)
    assert not livesave.passes_are_sound("tcg", "8.2.2", exe)
    assert livesave.passes_are_sound("tcg", "9.0.0", exe) and livesave.passes_are_sound("tcg", "10.1", exe)
    assert not livesave.passes_are_sound("tcg", "unknown", exe)
    assert not livesave.passes_are_sound("tcg", "9.2.0", f"{exe} (deleted)")
    assert not livesave.passes_are_sound("tcg", "9.2.0", None)


def test_the_disk_on_a_top_image_is_named_with_the_images_it_reads_below_it() -> None:
    assert livesave.backing(LIVE, Path("/s/a/overlay-2.qcow2")) == ("vda", ["/s/a/overlay.qcow2"])
    assert livesave.backing(LIVE, Path("/s/a/workspace.raw")) == ("sda", [])
    assert livesave.backing(LIVE, Path("/s/a/overlay.qcow2")) is None  # read below a top: not a disk's top


def test_a_block_job_is_waited_for_and_one_that_runs_on_is_given_up() -> None:
    infos = iter([{"cur": 1, "end": 4}, {"cur": 3, "end": 4}, {}])
    livesave.awaited(lambda: next(infos), "folding", within=5, every=0)
    with pytest.raises(VmsandboxError, match="folding did not end within"):
        livesave.awaited(lambda: {"cur": 1, "end": 4}, "folding", within=0.05, every=0.01)


@pytest.mark.parametrize(
    ("chains", "named", "run"),
    [
        ([["o", "a", "b", "top"]], set(), ["o", "a", "b"]),  # nothing else reads them: down to the image below
        ([["o", "a", "b", "top"], ["o", "a"]], {"a"}, ["b"]),  # a checkpoint's: the run stops above it
        ([["o", "a", "b", "top"], ["o", "a", "x"]], {"x"}, ["b"]),  # read by another branch's chain
        ([["o", "top"], ["o"]], {"o"}, []),
        ([["top"]], set(), []),
    ],
)
def test_a_running_vm_stops_reading_only_the_run_below_its_top_no_checkpoint_needs(
    chains: list[list[str]], named: set[str], run: list[str]
) -> None:
    assert chain.streamable(chains, named) == run


class Streams:
    """A stand-in for the hypervisor of a running VM whose disk's top is `top`, reading `below` (nearest first):
    `pull` drops the images above its base from them, as QEMU's block stream does, unless `refuse` says why not
    or `moves` is False."""

    def __init__(self, top: Path, below: list[str], *, refuse: str | None = None, moves: bool = True) -> None:
        self.top, self.below, self.refuse, self.moves = top, below, refuse, moves
        self.pulls: list[tuple[str, str]] = []

    def xml(self, name: str) -> str:
        store = "".join(f"<backingStore type='file'><source file='{b}'/>" for b in self.below)
        store += "</backingStore>" * len(self.below)
        return (
            f"<domain><name>{name}</name><devices><disk type='file' device='disk'><source file='{self.top}'/>"
            f"{store}<target dev='vda'/></disk></devices></domain>"
        )

    def pull(self, name: str, dev: str, base: str, *, within: float) -> None:
        assert within >= livesave.FOLD_FLOOR
        self.pulls.append((dev, base))
        if self.refuse is not None:
            raise VmsandboxError(self.refuse)
        if self.moves:
            self.below = self.below[self.below.index(base) :]


def deep_session(tmp_path: Path, overlays: list[str]) -> tuple[Record, Path]:
    image = tmp_path / "template.qcow2"
    record = saved_record("deep", overlays=overlays, below=str(image))
    for o in overlays:
        (record.files.root / o).write_bytes(b"q")
    return record, image


def test_a_deep_chain_is_folded_while_the_vm_runs_down_to_what_a_checkpoint_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vmsandbox.session.place.local import disks

    monkeypatch.setattr(disks, "LIVE_CHAIN", 4)
    record, image = deep_session(
        tmp_path, ["overlay.qcow2", "overlay-1.qcow2", "overlay-2.qcow2", "overlay-3.qcow2", "overlay-top.qcow2"]
    )
    kept = Checkpoint("early", 1.0, ["overlay.qcow2", "overlay-1.qcow2"], record.files.checkpoints / "early")
    kept.path.mkdir(parents=True)
    kept.write()
    root = record.files.root
    hv = Streams(
        root / "overlay-top.qcow2",
        [str(root / o) for o in ["overlay-3.qcow2", "overlay-2.qcow2", "overlay-1.qcow2", "overlay.qcow2"]],
    )
    hv.below.append(str(image))
    assert disks.fold_live(record, hv) is True  # type: ignore[arg-type]  # (a stand-in)
    assert hv.pulls == [("vda", str(root / "overlay-1.qcow2"))]
    left = ["overlay.qcow2", "overlay-1.qcow2", "overlay-top.qcow2"]  # (the checkpoint's chain kept whole)
    assert Record.load("deep").overlays == left
    assert sorted(p.name for p in root.glob("*.qcow2")) == sorted(left)


@pytest.mark.parametrize(
    ("refuse", "moves"), [("cannot fold vmsandbox-deep's overlays while it runs: no such job", True), (None, False)]
)
def test_a_fold_that_fails_or_leaves_the_vm_on_its_chain_keeps_every_overlay(
    tmp_path: Path, refuse: str | None, moves: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    from vmsandbox.session.place.local import disks

    names = ["overlay.qcow2", "overlay-1.qcow2", "overlay-top.qcow2"]
    record, image = deep_session(tmp_path, names)
    root = record.files.root
    hv = Streams(
        root / "overlay-top.qcow2",
        [str(root / "overlay-1.qcow2"), str(root / "overlay.qcow2"), str(image)],
        refuse=refuse,
        moves=moves,
    )
    assert disks.fold_live(record, hv) is False  # type: ignore[arg-type]  # (a stand-in)
    assert hv.pulls == [("vda", str(image))]
    assert Record.load("deep").overlays == names
    assert sorted(p.name for p in root.glob("*.qcow2")) == sorted(names)
    assert ("no such job" if refuse else "deep's overlays are kept: its VM does not read") in capsys.readouterr().err


def test_no_fold_runs_past_a_checkpoint_that_cannot_be_read_or_without_room_for_its_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from vmsandbox.session.place.local import disks

    names = ["overlay.qcow2", "overlay-1.qcow2", "overlay-top.qcow2"]
    record, image = deep_session(tmp_path, names)
    root = record.files.root
    hv = Streams(root / "overlay-top.qcow2", [str(root / "overlay-1.qcow2"), str(root / "overlay.qcow2"), str(image)])
    damaged = record.files.checkpoints / "damaged"
    damaged.mkdir(parents=True)
    (damaged / checkpoints.META).write_text("{")  # its chain unknown: it may read any of them
    assert disks.fold_live(record, hv) is False  # type: ignore[arg-type]  # (a stand-in)
    assert "checkpoint damaged cannot be read" in capsys.readouterr().err
    shutil.rmtree(damaged)
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: SimpleNamespace(free=2 << 20))  # 2 MiB free
    assert disks.fold_live(record, hv) is False  # type: ignore[arg-type]
    assert "needs room" in capsys.readouterr().err
    assert hv.pulls == [] and Record.load("deep").overlays == names
    assert sorted(p.name for p in root.glob("*.qcow2")) == sorted(names)


@pytest.mark.parametrize(
    ("overlays", "labels", "folds"),
    [
        (["overlay.qcow2", "overlay-a.qcow2", "overlay-b.qcow2", "overlay-top.qcow2"], ["overlay-b.qcow2"], True),
        (["overlay.qcow2", "overlay-a.qcow2", "overlay-top.qcow2"], ["overlay.qcow2", "overlay-a.qcow2"], False),
    ],
)
def test_a_deep_vm_is_saved_to_fold_its_chain_only_where_a_save_would_fold_some(
    overlays: list[str], labels: list[str], folds: bool
) -> None:
    """Past LIVE_CHAIN a live save falls back to a save and a resume only if that folds overlays of the VM's chain:
    where checkpoints name every one, it would fold none, and the VM is saved live."""
    from vmsandbox.session.place.local import disks

    record = saved_record("deep", overlays=overlays)
    for n, label in enumerate(labels):
        cp = Checkpoint(f"c{n}", float(n), overlays[: overlays.index(label) + 1], record.files.checkpoints / f"c{n}")
        cp.path.mkdir(parents=True)
        cp.write()
    assert disks._folds_when_saved(record) is folds
