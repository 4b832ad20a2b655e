"""A live save: a running VM's memory written to a file while its guest runs on (QEMU's migration, pass after
pass, until what is left fits a short pause), its system disk switched to a new top overlay in that pause —
libvirt's external snapshot, with no metadata kept. The VM goes on in the same QEMU: its guest is paused for the
last pass only, not for a whole save and a restore.

A guest that dirties its memory faster than it is copied would keep the migration going: after CONVERGE seconds
it is paused for the rest (as a plain save would have paused it from the start), and resumed after.

Passes while the guest runs rely on QEMU seeing every page the guest writes meanwhile. KVM's dirty log does;
under TCG, QEMU before 9.0 loses some (its TLB keeps pages it has seen written once marked as written after the
migration's bitmap is cleared: QEMU commit 03bfc2188f, "physmem: Fix migration dirty bitmap coherency with TCG
memory access"): measured here with QEMU 7.2, forks restored from such a save crashed in the kernel (lists of
the scheduler and RCU corrupted) in 2 of 2 tries with a guest writing meanwhile. There (`passes_are_sound`
false) the guest is paused for the whole save instead: the same libvirt snapshot without LIVE, one pass, the VM
resumed in the same QEMU after it (no restore).

Each live save leaves the VM one overlay deeper (its old top frozen below the new one). The run of overlays
right below its top that no checkpoint needs (a former fork's) is folded while it runs (`backing`, `awaited`:
QEMU's block stream copies what they hold into the top, which then reads the image below them), so that a VM
forked again and again is not saved and resumed to fold them.
"""

from __future__ import annotations

import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

from vmsandbox.errors import VmsandboxError

CONVERGE = 20.0  # seconds of live passes before the guest is paused for the rest
FINISH = 120.0  # seconds a save may take once its guest is paused before it is given up (aborted)
SOUND_TCG = (9, 0)  # the first QEMU whose TCG keeps the migration's dirty bitmap whole (03bfc2188f)
FOLD_FLOOR, FOLD_RATE = 60.0, 50 * 1024**2  # a fold while the VM runs: seconds, and bytes a second, it may take
ABORT = 30.0  # seconds a block job aborted may take to end


def passes_are_sound(accel: str, qemu_version: str, binary: str | None) -> bool:
    """Whether a save's passes while the guest runs see every page it writes: under KVM, or TCG from QEMU 9.0.
    `qemu_version` is the installed QEMU's (libvirt's); `binary` where the domain's QEMU process was started from
    (/proc/PID/exe; None: not known): one upgraded since it started ("(deleted)") may be older."""
    if accel == "kvm":
        return True
    if binary is None or binary.endswith(" (deleted)"):
        return False
    try:
        version = tuple(int(part) for part in qemu_version.split(".")[:2])
    except ValueError:
        return False
    return version >= SOUND_TCG


def snapshot_xml(live_xml: str, memory: Path, top: Path, new_top: Path) -> str:
    """libvirt's snapshot document for the domain described by `live_xml`: its memory into `memory`; the disk
    whose image is `top` goes on in `new_top` (a qcow2 overlay on `top` made by the caller); every other disk
    stays as it is."""
    root = ET.fromstring(live_xml)  # noqa: S314 - written by our own libvirt daemon
    snap = ET.Element("domainsnapshot")
    ET.SubElement(snap, "memory", snapshot="external", file=str(memory))
    disks = ET.SubElement(snap, "disks")
    switched = 0
    for disk in root.findall("./devices/disk"):
        target, source = disk.find("target"), disk.find("source")
        dev = target.get("dev") if target is not None else None
        if dev is None:
            continue
        if source is not None and source.get("file") == str(top):
            el = ET.SubElement(disks, "disk", name=dev, snapshot="external", type="file")
            ET.SubElement(el, "driver", type="qcow2")
            ET.SubElement(el, "source", file=str(new_top))
            switched += 1
        else:
            ET.SubElement(disks, "disk", name=dev, snapshot="no")
    if switched != 1:
        raise VmsandboxError(f"the VM does not run on {top} (as one disk): it cannot be saved live")
    return ET.tostring(snap, encoding="unicode")


def runs_on(live_xml: str, image: Path) -> bool:
    """Whether the domain described by `live_xml` has a disk whose top image is `image` (a save that failed may
    have switched it all the same: libvirt fails the call when its resume after the switch fails)."""
    root = ET.fromstring(live_xml)  # noqa: S314 - written by our own libvirt daemon
    return any(
        (source := disk.find("source")) is not None and source.get("file") == str(image)
        for disk in root.findall("./devices/disk")
    )


def backing(live_xml: str, top: Path) -> tuple[str, list[str]] | None:
    """The disk whose top image is `top` in the domain described by `live_xml`: its target name and the images
    it reads below the top, nearest first (None: no such disk)."""
    root = ET.fromstring(live_xml)  # noqa: S314 - written by our own libvirt daemon
    for disk in root.findall("./devices/disk"):
        source, target = disk.find("source"), disk.find("target")
        if source is None or source.get("file") != str(top) or target is None or target.get("dev") is None:
            continue
        below, store = [], disk.find("backingStore")
        while store is not None and (image := store.find("source")) is not None and image.get("file"):
            below.append(image.get("file", ""))
            store = store.find("backingStore")
        return target.get("dev", ""), below
    return None


def fold_within(copied: int) -> float:
    """Seconds a fold while the VM runs may take to copy `copied` bytes before it is given up."""
    return FOLD_FLOOR + copied / FOLD_RATE


def awaited(job: Callable[[], object], what: str, within: float, every: float = 0.1) -> None:
    """Wait while `job()` says a block job runs (libvirt's job info: empty once it has ended, however it ended);
    raise if it still runs after `within` seconds (the caller aborts it)."""
    deadline = time.monotonic() + within
    while job():
        if time.monotonic() > deadline:
            raise VmsandboxError(f"{what} did not end within {within:.0f} s: given up")
        time.sleep(every)


def bounded(
    save: Callable[[], object],
    pause: Callable[[], object],
    abort: Callable[[], object],
    domain: str,
    converge: float = CONVERGE,
    finish: float = FINISH,
) -> bool:
    """save() (a live save), its guest paused (pause()) once it has run `converge` seconds, aborted (abort()) if it
    has not ended `finish` seconds after that. Whether it paused the guest (the caller resumes it if it is still
    paused: libvirt resumes what was running when the save began, unless the pause came after)."""
    failed: list[BaseException] = []

    def saving() -> None:
        try:
            save()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            failed.append(exc)

    thread = threading.Thread(target=saving, name="live-save", daemon=True)
    thread.start()
    try:
        thread.join(converge)
        paused = thread.is_alive()
        if paused:
            try:
                pause()
            except Exception:  # noqa: BLE001 - the save ended meanwhile, or libvirt refused: it goes on either way
                paused = False
            thread.join(finish)
    finally:
        stuck = thread.is_alive()
        if stuck:  # (its bound passed, or Ctrl-C): aborted and its end waited for, never left running
            abort()
            thread.join(finish)
    if stuck:
        raise VmsandboxError(f"the live save of {domain} did not end within {converge + finish:g} s: aborted")
    if failed:
        raise failed[0]
    return paused


class PauseWatch:
    """How long a domain's guest is not running, from now to stop(): `running()` asked every 10 ms (None: it
    could not be told, counted as running)."""

    def __init__(self, running: Callable[[], bool | None]) -> None:
        self.seconds = 0.0
        self._running = running
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="pause-watch", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        last = time.monotonic()
        while not self._done.wait(0.01):
            now = time.monotonic()
            if self._running() is False:
                self.seconds += now - last
            last = now

    def stop(self) -> None:
        self._done.set()
        self._thread.join()
