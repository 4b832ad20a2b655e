"""A live save's pure parts: libvirt's snapshot document (only the system disk switched, every other disk left as
it is), the bound on a save that does not converge, and qemu-img's pinned chain of a fork's copy."""

from __future__ import annotations

import threading
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from vmsandbox.errors import VmsandboxError
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
