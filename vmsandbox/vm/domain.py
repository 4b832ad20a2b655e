"""The libvirt domain XML of a session, built as data (ElementTree), never from a string template."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from vmsandbox.vm.accel import Accel

QEMU_NS = "http://libvirt.org/schemas/domain/qemu/1.0"
META_NS = "https://github.com/vmsandbox/vmsandbox/xmlns/session/1"
FWCFG_PREFIX = "opt/vmsandbox/"
TCG_TB_CACHE_MIB = 256  # QEMU's default is 1 GiB of host RAM per VM
# A fixed PCI slot for the NIC: q35 needs bus/addr spelled out for a device added on the QEMU command line.
NIC_DEVICE = "virtio-net-pci,netdev=n0,bus=pcie.0,addr=0x10"

ET.register_namespace("qemu", QEMU_NS)
ET.register_namespace("vmsandbox", META_NS)


@dataclass(frozen=True)
class Forward:
    host_port: int
    guest_port: int
    host_address: str = "127.0.0.1"


@dataclass(frozen=True)
class DomainSpec:
    name: str
    session: str
    session_dir: Path
    accel: Accel
    cpus: int
    memory_mib: int
    disk: Path
    kernel: Path
    initrd: Path
    cmdline: str
    console_log: Path
    forwards: tuple[Forward, ...]
    fwcfg_files: dict[str, Path] = field(default_factory=dict)
    workspace_disk: Path | None = None  # raw ext4, mounted by the guest at the project path (vdb)

    def netdev(self) -> str:
        """User-mode networking: restrict=on cuts the guest off; only the listed forwards exist."""
        parts = ["user", "id=n0", "restrict=on"]
        parts += [f"hostfwd=tcp:{f.host_address}:{f.host_port}-:{f.guest_port}" for f in self.forwards]
        return ",".join(parts)


def _sub(parent: ET.Element, tag: str, text: str | None = None, **attrs: str) -> ET.Element:
    el = ET.SubElement(parent, tag, attrs)
    if text is not None:
        el.text = text
    return el


def build_xml(spec: DomainSpec) -> str:
    if spec.accel is Accel.AUTO:
        raise ValueError("resolve the accelerator before building the domain")
    dom = ET.Element("domain", {"type": "kvm" if spec.accel is Accel.KVM else "qemu"})
    _sub(dom, "name", spec.name)
    meta = _sub(dom, "metadata")
    ET.SubElement(meta, f"{{{META_NS}}}session", {"name": spec.session, "dir": str(spec.session_dir)})
    _sub(dom, "memory", str(spec.memory_mib), unit="MiB")
    _sub(dom, "vcpu", str(spec.cpus))
    if spec.fwcfg_files:
        sysinfo = _sub(dom, "sysinfo", type="fwcfg")
        for key, path in sorted(spec.fwcfg_files.items()):
            _sub(sysinfo, "entry", name=FWCFG_PREFIX + key, file=str(path))
    os_el = _sub(dom, "os")
    _sub(os_el, "type", "hvm", arch="x86_64", machine="q35")
    _sub(os_el, "kernel", str(spec.kernel))
    _sub(os_el, "initrd", str(spec.initrd))
    _sub(os_el, "cmdline", spec.cmdline)
    features = _sub(dom, "features")
    _sub(features, "acpi")
    if spec.accel is Accel.TCG:
        tcg = _sub(features, "tcg")
        _sub(tcg, "tb-cache", str(TCG_TB_CACHE_MIB), unit="MiB")
        _sub(dom, "cpu", mode="maximum")
    else:
        _sub(dom, "cpu", mode="host-passthrough")
    _sub(dom, "clock", offset="utc")
    _sub(dom, "on_poweroff", "destroy")
    _sub(dom, "on_reboot", "restart")
    _sub(dom, "on_crash", "destroy")
    devices = _sub(dom, "devices")
    disk = _sub(devices, "disk", type="file", device="disk")
    _sub(disk, "driver", name="qemu", type="qcow2", discard="unmap")
    _sub(disk, "source", file=str(spec.disk))
    _sub(disk, "target", dev="vda", bus="virtio")
    if spec.workspace_disk is not None:
        ws = _sub(devices, "disk", type="file", device="disk")
        _sub(ws, "driver", name="qemu", type="raw", discard="unmap")
        _sub(ws, "source", file=str(spec.workspace_disk))
        _sub(ws, "target", dev="vdb", bus="virtio")
        _sub(ws, "serial", "vmsandbox-workspace")
    serial = _sub(devices, "serial", type="file")
    _sub(serial, "source", path=str(spec.console_log))
    _sub(serial, "target", port="0")
    rng = _sub(devices, "rng", model="virtio")
    _sub(rng, "backend", "/dev/urandom", model="random")
    _sub(devices, "controller", type="usb", model="none")
    _sub(devices, "memballoon", model="none")
    cmd = ET.SubElement(dom, f"{{{QEMU_NS}}}commandline")
    for arg in ("-netdev", spec.netdev(), "-device", NIC_DEVICE):
        ET.SubElement(cmd, f"{{{QEMU_NS}}}arg", {"value": arg})
    ET.indent(dom)
    return ET.tostring(dom, encoding="unicode") + "\n"


def session_of(xml: str) -> tuple[str, Path] | None:
    """(session name, session dir) from a vmsandbox domain's metadata, or None for other domains."""
    root = ET.fromstring(xml)  # noqa: S314 - XML from our own libvirt daemon
    el = root.find(f"metadata/{{{META_NS}}}session")
    if el is None:
        return None
    return el.get("name", ""), Path(el.get("dir", ""))
