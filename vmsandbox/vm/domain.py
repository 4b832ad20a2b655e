"""The libvirt domain XML of a session, built as data (ElementTree), never from a string template."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from vmsandbox.vm.accel import Accel

QEMU_NS = "http://libvirt.org/schemas/domain/qemu/1.0"
META_NS = "https://github.com/vmsandbox/vmsandbox/xmlns/session/1"
FWCFG_PREFIX = "opt/vmsandbox/"
IDENTITY_PORT = "org.vmsandbox.identity"  # the guest's /dev/virtio-ports/<name> (images/base/.../warm)
WORKSPACE_SERIAL = "vmsandbox-workspace"
LIBVIRTS_SOCKET = Path("libvirt")  # a channel whose socket libvirt places itself (on another host: we reach it
# through libvirt, Hypervisor.exchange, and it goes where that host's QEMU may make it)
NO_ASLR = "norandmaps"  # on a TCG guest's kernel command line: kernel_cmdline
TCG_TB_CACHE_MIB = 128  # QEMU's default is 1 GiB of host RAM per VM; docs/development.md has the figures
# CPUID flags a TCG guest is not shown: with them its kernel and libc copy and clear memory a byte an instruction
# (`rep movsb`, `rep stosb`), which TCG runs one element a loop: 7-9x slower than `rep movsq`/`stosq` measured here
TCG_HIDDEN_FLAGS = ("erms", "fsrm")
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
    workspace_disk: Path | None = None  # ext4, mounted by the guest at the project path (vdb)
    workspace_format: str = "raw"  # "qcow2": a reader VM's overlay on a dead session's raw disk
    workspace_backing: Path | None = None  # that raw disk: read by QEMU through an ACL, never relabelled
    channel: Path | None = None  # the identity port's socket (a warm start sends the identity through it)
    # (LIBVIRTS_SOCKET: where libvirt puts it)
    template: bool = False  # a warm-start template being built, not a session (gc tells them apart)
    client: str | None = None  # on another host: which machine's session it is (that machine's gc sweeps it)
    account: int | None = None  # the session's own QEMU account (uid = gid: confine.pool); None: libvirt's
    # the images below `disk`, top first (path, format, whether libvirt labels it): named so that libvirt never
    # gives a shared image to one session's account (it would probe and label the whole chain); () lets it probe
    chain: tuple[tuple[Path, str, bool], ...] = ()

    def netdev(self) -> str:
        return netdev(self.forwards)


def netdev(forwards: tuple[Forward, ...]) -> str:
    """User-mode networking: restrict=on cuts the guest off; only the listed forwards exist."""
    parts = ["user", "id=n0", "restrict=on"]
    parts += [f"hostfwd=tcp:{f.host_address}:{f.host_port}-:{f.guest_port}" for f in forwards]
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
    # a VM generation ID: libvirt gives a restored guest a new one (kernels with vmgenid reseed on it)
    _sub(dom, "genid")
    meta = _sub(dom, "metadata")
    ET.SubElement(meta, f"{{{META_NS}}}{'template' if spec.template else 'session'}", _owner(spec))
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
    _sub(os_el, "cmdline", kernel_cmdline(spec))
    features = _sub(dom, "features")
    _sub(features, "acpi")
    if spec.accel is Accel.TCG:
        tcg = _sub(features, "tcg")
        _sub(tcg, "tb-cache", str(TCG_TB_CACHE_MIB), unit="MiB")
        cpu = _sub(dom, "cpu", mode="maximum")
        for flag in TCG_HIDDEN_FLAGS:
            _sub(cpu, "feature", policy="disable", name=flag)
    else:
        _sub(dom, "cpu", mode="host-passthrough")
    _sub(dom, "clock", offset="utc")
    _sub(dom, "on_poweroff", "destroy")
    _sub(dom, "on_reboot", "restart")
    _sub(dom, "on_crash", "destroy")
    _devices(_sub(dom, "devices"), spec)
    _seclabel(dom, spec.account)
    cmd = ET.SubElement(dom, f"{{{QEMU_NS}}}commandline")
    for arg in ("-netdev", spec.netdev(), "-device", NIC_DEVICE):
        ET.SubElement(cmd, f"{{{QEMU_NS}}}arg", {"value": arg})
    ET.indent(dom)
    return ET.tostring(dom, encoding="unicode") + "\n"


def _devices(devices: ET.Element, spec: DomainSpec) -> None:
    disk = _sub(devices, "disk", type="file", device="disk")
    _sub(disk, "driver", name="qemu", type="qcow2", discard="unmap")
    _sub(disk, "source", file=str(spec.disk))
    _chain(disk, spec.chain)
    _sub(disk, "target", dev="vda", bus="virtio")
    if spec.workspace_disk is not None:
        ws = _sub(devices, "disk", type="file", device="disk")
        _sub(ws, "driver", name="qemu", type=spec.workspace_format, discard="unmap")
        _sub(ws, "source", file=str(spec.workspace_disk))
        _backing(ws, spec.workspace_backing)
        _sub(ws, "target", dev="vdb", bus="virtio")
        _sub(ws, "serial", WORKSPACE_SERIAL)
    # a warm start hot-plugs its workspace disk as a SCSI disk here: no PCI hot-plug, no wait
    _sub(devices, "controller", type="scsi", index="0", model="virtio-scsi")
    if spec.channel is not None:
        channel = _sub(devices, "channel", type="unix")
        _sub(channel, "source", mode="bind", **_socket(spec.channel))
        _sub(channel, "target", type="virtio", name=IDENTITY_PORT)
    serial = _sub(devices, "serial", type="file")
    # append: virtlogd opens the file we made (filewrite.own_file) instead of deleting it and making a root-owned
    # one, which an unprivileged owner of the session could not read
    _sub(serial, "source", path=str(spec.console_log), append="on")
    _sub(serial, "target", port="0")
    rng = _sub(devices, "rng", model="virtio")
    _sub(rng, "backend", "/dev/urandom", model="random")
    _sub(devices, "controller", type="usb", model="none")
    # no ballooning, but free page reporting: memory the guest frees goes back to the host
    _sub(devices, "memballoon", model="virtio", freePageReporting="on")


def workspace_xml(disk: Path, fmt: str = "raw", backing: Path | None = None) -> str:
    """The workspace disk a warm start hot-plugs (the guest finds it by its serial)."""
    el = ET.Element("disk", type="file", device="disk")
    _sub(el, "driver", name="qemu", type=fmt, discard="unmap")
    _sub(el, "source", file=str(disk))
    _backing(el, backing)
    _sub(el, "target", dev="sda", bus="scsi")
    _sub(el, "serial", WORKSPACE_SERIAL)
    return ET.tostring(el, encoding="unicode")


def _backing(disk: ET.Element, raw: Path | None) -> None:
    """Name a qcow2 overlay's raw backing file, which libvirt must not relabel: it gives a backing file to QEMU's
    account for good (the caller lets QEMU read it by an ACL instead)."""
    if raw is None:
        return
    chain = _sub(disk, "backingStore", type="file")
    _sub(chain, "format", type="raw")
    _sub(_sub(chain, "source", file=str(raw)), "seclabel", model="dac", relabel="no")
    _sub(chain, "backingStore")


def _chain(disk: ET.Element, chain: tuple[tuple[Path, str, bool], ...]) -> None:
    """The backing chain below a disk, as libvirt would probe it, each image it must not label marked so."""
    el = disk
    for path, fmt, labelled in chain:
        el = _sub(el, "backingStore", type="file")
        _sub(el, "format", type=fmt)
        source = _sub(el, "source", file=str(path))
        if not labelled:
            _sub(source, "seclabel", model="dac", relabel="no")
    if chain:
        _sub(el, "backingStore")


def _seclabel(dom: ET.Element, account: int | None) -> None:
    """The session's QEMU runs as its own account (libvirt labels its disks and sockets for it), or as
    libvirt's (no label: libvirt's default)."""
    for old in dom.findall("seclabel"):
        dom.remove(old)
    if account is None:
        return
    label = _sub(dom, "seclabel", type="static", model="dac", relabel="yes")
    _sub(label, "label", f"+{account}:+{account}")


def kernel_cmdline(spec: DomainSpec) -> str:
    """The guest kernel's command line: the image's, and under TCG `norandmaps` (no address space
    randomisation). QEMU 7.2's TCG keys translated code by its virtual address, so a library that every process
    maps at an address of its own is translated again in each: a login cost a TCG guest ~7,000 translations
    more each time. The guest is disposable and hostile by design (its root is the agent's): ASLR there
    protects nothing of the host's, and a guest that wants it back sets kernel.randomize_va_space."""
    if spec.accel is not Accel.TCG or NO_ASLR in spec.cmdline.split():
        return spec.cmdline
    return f"{spec.cmdline} {NO_ASLR}"


def for_restore(saved_xml: str, spec: DomainSpec) -> str:
    """A template's saved domain XML, made this session's: the guest-visible parts (devices, their addresses,
    memory, CPUs) stay exactly as saved; the name, the metadata and every host-side path and port are the
    session's. libvirt restores only XML whose guest ABI matches the save image."""
    root = ET.fromstring(saved_xml)  # noqa: S314 - written by our own libvirt daemon
    find(root, "name").text = spec.name
    meta = find(root, "metadata")
    for child in list(meta):
        meta.remove(child)
    ET.SubElement(meta, f"{{{META_NS}}}session", _owner(spec))
    _set_disks(root, spec.disk, spec.workspace_disk, spec.chain)
    find(root, "os/kernel").text = str(spec.kernel)  # (the same bytes: the image's, or the session's copy of them)
    find(root, "os/initrd").text = str(spec.initrd)
    _seclabel(root, spec.account)
    source = find(root, "devices/serial/source")
    source.set("path", str(spec.console_log))
    source.set("append", "on")
    for entry in root.iterfind("sysinfo[@type='fwcfg']/entry"):
        key = entry.get("name", "").removeprefix(FWCFG_PREFIX)
        if key not in spec.fwcfg_files:
            raise ValueError(f"the saved domain reads fw_cfg entry {key!r}, which this session does not provide")
        entry.set("file", str(spec.fwcfg_files[key]))
    if spec.channel is not None:
        channel = find(root, "devices/channel")
        sock = channel.find("source")
        if sock is None:  # libvirt leaves out a socket it placed itself
            sock = ET.Element("source", mode="bind")
            channel.insert(0, sock)
        sock.attrib.pop("path", None)
        sock.attrib.update(_socket(spec.channel))
    _set_netdev(root, spec.netdev())
    ET.indent(root)
    return ET.tostring(root, encoding="unicode") + "\n"


def _socket(path: Path) -> dict[str, str]:
    return {} if path == LIBVIRTS_SOCKET else {"path": str(path)}


def _owner(spec: DomainSpec) -> dict[str, str]:
    """The metadata that names the domain's session (and on another host, the machine whose session it is)."""
    owner = {"name": spec.session, "dir": str(spec.session_dir)}
    return owner if spec.client is None else {**owner, "client": spec.client}


def boot_of(xml: str) -> tuple[Path, Path, str]:
    """The kernel, initrd and command line a domain XML boots."""
    root = ET.fromstring(xml)  # noqa: S314 - written by our own libvirt daemon
    return (
        Path(find(root, "os/kernel").text or ""),
        Path(find(root, "os/initrd").text or ""),
        root.findtext("os/cmdline", ""),
    )


def with_disks(xml: str, system: Path, ssh_port: int, chain: tuple[tuple[Path, str, bool], ...] = ()) -> str:
    """A saved session's domain XML restored over another top overlay (a checkpoint put one above the disk it
    was saved with, which it keeps unchanged below; `chain`: the images below it), on the session's SSH port."""
    root = ET.fromstring(xml)  # noqa: S314 - written by our own libvirt daemon
    _set_disks(root, system, None, chain)
    _set_netdev(root, netdev((Forward(ssh_port, 22),)))
    return ET.tostring(root, encoding="unicode") + "\n"


def _set_disks(
    root: ET.Element, system: Path, workspace: Path | None, chain: tuple[tuple[Path, str, bool], ...] = ()
) -> None:
    """Point the system disk (vda) and, if given, the workspace disk (found by its serial: vdb at a cold boot,
    a hot-plugged sda after a warm start) at other files. Their backing chains are libvirt's to probe again,
    but the system disk's `chain` when given."""
    for disk in root.iterfind("devices/disk"):
        if disk.find("target[@dev='vda']") is not None:
            path: Path | None = system
        elif workspace is not None and disk.findtext("serial") == WORKSPACE_SERIAL:
            path = workspace
        else:
            continue
        source = find(disk, "source")
        source.set("file", str(path))
        for below in disk.findall("backingStore"):
            disk.remove(below)
        if path == system and chain:
            at = list(disk).index(source) + 1
            holder = ET.Element("disk")
            _chain(holder, chain)
            disk.insert(at, holder[0])


def with_netdev(xml: str, ssh_port: int) -> str:
    """A session's domain XML with its SSH forward (its only one) moved to another loopback port."""
    root = ET.fromstring(xml)  # noqa: S314 - written by our own libvirt daemon
    _set_netdev(root, netdev((Forward(ssh_port, 22),)))
    return ET.tostring(root, encoding="unicode") + "\n"


def _set_netdev(root: ET.Element, value: str) -> None:
    """Replace the user-mode netdev (the QEMU command-line argument build_xml wrote) with `value`."""
    for arg in find(root, f"{{{QEMU_NS}}}commandline"):
        if arg.get("value", "").startswith("user,"):
            arg.set("value", value)


def find(root: ET.Element, path: str) -> ET.Element:
    """The element at `path` of a domain XML libvirt wrote (ValueError when it has none)."""
    el = root.find(path)
    if el is None:
        raise ValueError(f"the saved domain XML has no {path}")
    return el


def session_of(xml: str) -> tuple[str, Path] | None:
    """(session name, session dir) from a vmsandbox domain's metadata, or None for other domains."""
    root = ET.fromstring(xml)  # noqa: S314 - XML from our own libvirt daemon
    el = root.find(f"metadata/{{{META_NS}}}session")
    if el is None:
        return None
    return el.get("name", ""), Path(el.get("dir", ""))


def client_of(xml: str) -> str | None:
    """The machine a session (or a template build) on another host belongs to (None: the host's own machine's)."""
    meta = ET.fromstring(xml).find("metadata")  # noqa: S314 - from a host the user names
    for kind in ("session", "template"):
        if meta is not None and (el := meta.find(f"{{{META_NS}}}{kind}")) is not None:
            return el.get("client")
    return None


def memory_bytes(root: ET.Element) -> int:
    """The guest's RAM, in bytes, of domain XML `root` (its `<memory>`, in any unit libvirt writes)."""
    el = find(root, "memory")
    units = {"KiB": 1024, "k": 1024, "MiB": 1024**2, "M": 1024**2, "GiB": 1024**3, "G": 1024**3, "b": 1, "bytes": 1}
    unit = el.get("unit", "KiB")
    if unit not in units:
        raise ValueError(f"the domain's memory is in a unit this code does not read: {unit}")
    return int(el.text or "0") * units[unit]
