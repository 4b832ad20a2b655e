"""A domain's RAM as a file QEMU maps copy-on-write (a template's memory, held sealed: vm.memory) instead of the
anonymous memory libvirt gives it: the two arguments of QEMU's command line that say so, written and read back.
docs/internals.md, "Memory shared between sessions", says why they are passed outside libvirt."""

from __future__ import annotations

import itertools
import json
import xml.etree.ElementTree as ET

from vmsandbox.vm.domain import QEMU_NS, memory_bytes
from vmsandbox.vm.memory.split import SHARED_BLOCK


def with_memory(xml: str, mem_path: str | None) -> str:
    """The domain's RAM as the memory backend SHARED_BLOCK (what a split save image names it, vm.memory.split): a
    copy-on-write mapping of the sealed file at `mem_path` (share=off: the guest's writes stay in its own QEMU),
    or with None plain anonymous memory (a shared session's own save, restored whole). libvirt 9.0 cannot name a
    domain's memory file, so the backend is two arguments of QEMU's command line (docs/internals.md, "Memory shared
    between sessions"): `-object` with the backend, `-machine memory-backend=` choosing it over the one
    libvirt makes (which stays, unused and untouched)."""
    root = ET.fromstring(xml)  # noqa: S314 - written by our own libvirt daemon
    cmd = root.find(f"{{{QEMU_NS}}}commandline")
    if cmd is None:
        cmd = ET.SubElement(root, f"{{{QEMU_NS}}}commandline")
    for flag, given in itertools.pairwise(list(cmd)):  # a backend named before (a save image's XML) goes
        if _ours(flag.get("value", ""), given.get("value", "")):
            cmd.remove(flag)
            cmd.remove(given)
    size = memory_bytes(root)
    backend: dict[str, object] = {"qom-type": "memory-backend-ram", "id": SHARED_BLOCK, "size": size}
    if mem_path is not None:
        backend = {
            "qom-type": "memory-backend-file",
            "id": SHARED_BLOCK,
            "mem-path": mem_path,
            "size": size,
            "share": False,  # copy-on-write: a write never reaches the file
            "readonly": False,  # (QEMU 7.2's readonly maps it read-only: the guest could not write its RAM)
            "discard-data": False,  # QEMU exiting leaves the file as it is
        }
    for arg in ("-object", json.dumps(backend, separators=(",", ":")), "-machine", _backend_selected()):
        ET.SubElement(cmd, f"{{{QEMU_NS}}}arg", {"value": arg})
    return ET.tostring(root, encoding="unicode") + "\n"


def memory_of(xml: str) -> str | None:
    """The file a domain's RAM maps (with_memory), or None: its own memory."""
    root = ET.fromstring(xml)  # noqa: S314 - written by our own libvirt daemon
    args = [a.get("value", "") for a in root.iterfind(f"{{{QEMU_NS}}}commandline/{{{QEMU_NS}}}arg")]
    for flag, value in itertools.pairwise(args):
        if flag == "-object" and _ours(flag, value):
            path = json.loads(value).get("mem-path")
            return str(path) if path is not None else None
    return None


def _backend_selected() -> str:
    return f"memory-backend={SHARED_BLOCK}"


def _ours(flag: str, value: str) -> bool:
    """Whether QEMU arguments `flag value` are with_memory's."""
    if flag == "-machine":
        return value == _backend_selected()
    if flag != "-object" or not value.startswith("{"):
        return False
    try:
        return bool(json.loads(value).get("id") == SHARED_BLOCK)
    except ValueError:
        return False
