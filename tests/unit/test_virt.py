"""libvirt logic on libvirt's in-process test:/// driver (no daemon, no VM)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from vmsandbox import paths
from vmsandbox.errors import VmsandboxError
from vmsandbox.session import state
from vmsandbox.session.end import gc
from vmsandbox.vm.domain import META_NS
from vmsandbox.vm.virt import Hypervisor

from .conftest import saved_record

URI = "test:///default"


def test_domain(name: str, session_dir: Path | None = None) -> str:
    root = ET.Element("domain", {"type": "test"})
    ET.SubElement(root, "name").text = name
    if session_dir is not None:
        meta = ET.SubElement(root, "metadata")
        ET.SubElement(meta, f"{{{META_NS}}}session", {"name": name, "dir": str(session_dir)})
    ET.SubElement(root, "memory").text = "65536"
    os_el = ET.SubElement(root, "os")
    ET.SubElement(os_el, "type").text = "hvm"
    return ET.tostring(root, encoding="unicode")


test_domain.__test__ = False  # type: ignore[attr-defined]


def test_create_info_destroy() -> None:
    with Hypervisor(URI) as hv:
        hv.create(test_domain("vmsandbox-unit-a"))
        info = hv.info("vmsandbox-unit-a")
        assert info is not None and info.state == "running"
        assert "vmsandbox-unit-a" in [d.name for d in hv.domains("vmsandbox-")]
        assert hv.destroy("vmsandbox-unit-a")
        assert hv.info("vmsandbox-unit-a") is None
        assert not hv.destroy("vmsandbox-unit-a")


def test_unreachable_daemon_names_the_fix() -> None:
    with pytest.raises(VmsandboxError) as err:
        Hypervisor("qemu+unix:///system?socket=/nonexistent/libvirt-sock")
    assert err.value.hint is not None and "vmsandbox host setup" in err.value.hint
    assert "libvirt_uri" in err.value.hint  # not the default URI: it may be what is wrong


def test_gc_destroys_our_domains_without_a_session_dir_only() -> None:
    gone = paths.sessions_dir() / "gone"
    with Hypervisor(URI) as hv:
        hv.create(test_domain("vmsandbox-gone", gone))
        hv.create(test_domain("vmsandbox-foreign"))  # shares the prefix but has no vmsandbox metadata
        try:
            lines = list(gc.gc(URI, limit=1024**3))
            assert lines == ["destroyed domain vmsandbox-gone (its session directory is gone)"]
            assert hv.info("vmsandbox-gone") is None
            assert hv.info("vmsandbox-foreign") is not None
        finally:
            hv.destroy("vmsandbox-foreign")
            hv.destroy("vmsandbox-gone")


def test_gc_removes_sessions_whose_vm_is_gone() -> None:
    r = saved_record("dead", libvirt_uri=URI, keep=True, status="ready")
    assert state.all_status(URI)[0].state == "exited"
    assert list(gc.gc(URI, limit=1024**3)) == ["removed session dead (exited)"]
    assert not r.files.root.exists()


def test_gc_dry_run_says_what_it_would_do_and_does_nothing() -> None:
    r = saved_record("dead", libvirt_uri=URI, keep=True, status="ready")
    gone = paths.sessions_dir() / "gone"
    with Hypervisor(URI) as hv:
        hv.create(test_domain("vmsandbox-gone", gone))
        try:
            lines = list(gc.gc(URI, limit=1024**3, dry=True))
            assert lines == [
                "would remove session dead (exited)",  # what gc does: test_gc_removes_sessions_whose_vm_is_gone
                "would destroy domain vmsandbox-gone (its session directory is gone)",
            ]
            assert hv.info("vmsandbox-gone") is not None and r.files.root.exists()
        finally:
            hv.destroy("vmsandbox-gone")


def test_a_stopped_session_is_listed_as_such_and_never_collected() -> None:
    r = saved_record("paused", libvirt_uri=URI, keep=True, status="ready", saved=True)
    r.files.saved_memory.write_bytes(b"LibvirtQemudSave")
    listed = state.all_status(URI)[0].as_dict()
    assert listed["state"] == "stopped"
    assert listed["disk_bytes"] > 0
    assert list(gc.gc(URI, limit=1024**3)) == []
    assert r.files.saved_memory.exists()
    r.files.saved_memory.unlink()  # the memory is lost: the session is what a dead VM is
    assert state.all_status(URI)[0].state == "exited"


def test_a_workspace_copy_goes_through_qcow2_and_leaves_only_the_copy() -> None:
    """A workspace disk's copy on a host: raw -> qcow2 -> raw (libvirt hands non-raw copies to qemu-img there, which
    skips holes), named and formatted as asked, the volume in between deleted."""
    from vmsandbox.session.place.remote import checkpoint
    from vmsandbox.session.place.remote.images import POOL
    from vmsandbox.vm import storage

    with Hypervisor(URI) as hv:
        hv.pool(POOL, "/vmsandbox-unit-pool")
        hv.create_volume(POOL, storage.volume_xml("unit-ws.raw", 1 << 20, mode="0600"))
        try:
            checkpoint.copy_workspace(hv, "unit-ws.raw", "unit-copy.raw")
            assert sorted(hv.volumes(POOL)) == ["unit-copy.raw", "unit-ws.raw"]
            desc = hv._conn.storagePoolLookupByName(POOL).storageVolLookupByName("unit-copy.raw").XMLDesc(0)
            assert ET.fromstring(desc).find("target/format").get("type") == "raw"  # type: ignore[union-attr]  # noqa: S314
        finally:
            hv.delete_volume(POOL, "unit-ws.raw")
            hv.delete_volume(POOL, "unit-copy.raw")


def test_a_host_without_qemu_img_copies_the_workspace_byte_by_byte() -> None:
    """When that host refuses the qcow2 copy (libvirt needs qemu-img for it), the copy is made directly."""
    from vmsandbox.session.place.remote import checkpoint

    class Host:
        def __init__(self) -> None:
            self.copies: list[tuple[str, str, str | None]] = []
            self.deleted: list[str] = []

        def delete_volume(self, pool: str, name: str) -> None:
            self.deleted.append(name)

        def clone_volume(self, pool: str, source: str, name: str, fmt: str | None = None) -> str:
            self.copies.append((source, name, fmt))
            if fmt == "qcow2":
                raise VmsandboxError("cannot copy volume: creation of non-raw file images is not supported")
            return name

    host = Host()
    checkpoint.copy_workspace(host, "ws.raw", "copy.raw")  # type: ignore[arg-type]
    assert host.copies == [("ws.raw", "copy.raw.copying.qcow2", "qcow2"), ("ws.raw", "copy.raw", None)]


class HeldSave:
    """A domain whose save never ends until its job is aborted (a QEMU that holds its migration)."""

    def __init__(self, *, ends: bool = False, at_abort: str = "fails") -> None:
        import threading

        self.aborted = threading.Event()
        self.ends = ends
        self.at_abort = at_abort  # "fails" (the VM runs on), "ends" (it was saved all the same), "holds" (on)
        self.release = threading.Event()

    def save(self, path: str) -> None:
        import libvirt

        if self.ends:
            return
        if not self.aborted.wait(600) or self.at_abort == "ends":
            return
        if self.at_abort == "holds":
            self.release.wait(600)
            return
        raise libvirt.libvirtError("operation aborted: job 'save' canceled by client")

    def abortJob(self) -> None:  # noqa: N802 - libvirt's name
        self.aborted.set()

    def name(self) -> str:
        return "vmsandbox-held"


def test_a_save_held_past_its_deadline_is_aborted_and_said() -> None:
    """The memory guard stops a session with a deadline: a save its QEMU holds is aborted then (the VM runs on),
    and the guard goes on to the next; a save that ends is left be."""
    from vmsandbox.vm import timedsave

    held = HeldSave()
    with pytest.raises(VmsandboxError, match=r"did not end within 0\.2 s: it was aborted"):
        timedsave.bounded(lambda: held.save("/nowhere"), held.abortJob, "vmsandbox-held", 0.2)
    assert held.aborted.is_set()
    quick = HeldSave(ends=True)
    timedsave.bounded(lambda: quick.save("/nowhere"), quick.abortJob, "vmsandbox-held", 60)
    assert not quick.aborted.is_set()


def test_a_save_that_ends_as_it_is_aborted_is_a_save_and_one_not_aborted_is_kept() -> None:
    """A save that ended as its abort came (the VM stopped, its memory in the file) is not said to be aborted: a
    caller told "it runs on" would delete the only copy of its memory. One libvirt could not abort either may yet
    end so: said apart (SaveInFlightError), its file kept."""
    from vmsandbox.errors import SaveInFlightError
    from vmsandbox.vm import timedsave

    ended = HeldSave(at_abort="ends")
    timedsave.bounded(lambda: ended.save("/nowhere"), ended.abortJob, "vmsandbox-held", 0.1)
    assert ended.aborted.is_set()
    held = HeldSave(at_abort="holds")
    with pytest.raises(SaveInFlightError, match=r"neither in 0\.1 s nor 0\.2 s after abortJob") as err:
        timedsave.bounded(lambda: held.save("/nowhere"), held.abortJob, "vmsandbox-held", 0.1, abort_wait=0.2)
    assert err.value.hint is not None and "virsh domjobabort vmsandbox-held" in err.value.hint
    held.release.set()
    assert err.value.outcome() is True  # it ended, and saved: the caller counts the session stopped then
