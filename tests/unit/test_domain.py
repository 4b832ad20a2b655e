from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from vmsandbox.vm.accel import Accel
from vmsandbox.vm.domain import QEMU_NS, DomainSpec, Forward, build_xml, session_of


def spec(accel: Accel = Accel.TCG) -> DomainSpec:
    d = Path("/state/sessions/s1")
    return DomainSpec(
        name="vmsandbox-s1",
        session="s1",
        session_dir=d,
        accel=accel,
        cpus=2,
        memory_mib=2048,
        disk=d / "overlay.qcow2",
        kernel=Path("/img/vmlinuz"),
        initrd=Path("/img/initrd.img"),
        cmdline="root=/dev/vda rw",
        console_log=d / "console.log",
        forwards=(Forward(40022, 22),),
        fwcfg_files={"host_key": d / "fwcfg/host_key"},
    )


def qemu_args(xml: str) -> list[str]:
    root = ET.fromstring(xml)  # noqa: S314
    return [a.get("value", "") for a in root.iter(f"{{{QEMU_NS}}}arg")]


def test_network_is_user_mode_restricted_and_loopback_only() -> None:
    xml = build_xml(spec())
    root = ET.fromstring(xml)  # noqa: S314
    assert root.find("devices/interface") is None  # never libvirt's NAT bridge
    args = qemu_args(xml)
    netdev = args[args.index("-netdev") + 1]
    assert netdev == "user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:40022-:22"
    assert "virtio-net-pci,netdev=n0,bus=pcie.0,addr=0x10" in args


def test_tcg_domain() -> None:
    root = ET.fromstring(build_xml(spec(Accel.TCG)))  # noqa: S314
    assert root.get("type") == "qemu"
    assert root.find("cpu").get("mode") == "maximum"  # type: ignore[union-attr]
    assert root.findtext("features/tcg/tb-cache") == "128"  # QEMU's default would be 1 GiB of host RAM
    hidden = {(f.get("policy"), f.get("name")) for f in root.iterfind("cpu/feature")}
    assert hidden == {("disable", "erms"), ("disable", "fsrm")}  # TCG runs `rep movsb` a byte a loop
    balloon = root.find("devices/memballoon")
    assert balloon is not None
    assert (balloon.get("model"), balloon.get("freePageReporting")) == ("virtio", "on")


def test_a_tcg_guest_maps_every_process_at_the_same_addresses() -> None:
    """Under TCG translated code is keyed by its virtual address: without randomisation a library is translated
    once for every process; a command line that has it already (a template's, read back) keeps it once."""
    assert ET.fromstring(build_xml(spec(Accel.TCG))).findtext("os/cmdline") == "root=/dev/vda rw norandmaps"  # noqa: S314
    again = dataclasses.replace(spec(Accel.TCG), cmdline="root=/dev/vda rw norandmaps")
    assert ET.fromstring(build_xml(again)).findtext("os/cmdline") == "root=/dev/vda rw norandmaps"  # noqa: S314
    assert ET.fromstring(build_xml(spec(Accel.KVM))).findtext("os/cmdline") == "root=/dev/vda rw"  # noqa: S314


def test_kvm_domain() -> None:
    root = ET.fromstring(build_xml(spec(Accel.KVM)))  # noqa: S314
    assert root.get("type") == "kvm"
    assert root.find("features/tcg") is None
    assert root.find("cpu").get("mode") == "host-passthrough"  # type: ignore[union-attr]
    assert root.find("cpu/feature") is None  # the host's flags, all of them


def test_direct_kernel_boot_console_and_secrets_by_file() -> None:
    root = ET.fromstring(build_xml(spec(Accel.KVM)))  # noqa: S314
    assert root.findtext("os/kernel") == "/img/vmlinuz"
    assert root.findtext("os/cmdline") == "root=/dev/vda rw"
    assert root.find("devices/serial/source").get("path") == "/state/sessions/s1/console.log"  # type: ignore[union-attr]
    entry = root.find("sysinfo[@type='fwcfg']/entry")
    assert entry is not None
    # the host key travels as a file, never inline (inline values land on QEMU's command line)
    assert entry.get("name") == "opt/vmsandbox/host_key" and entry.get("file") and not (entry.text or "").strip()


def test_session_metadata_roundtrip() -> None:
    assert session_of(build_xml(spec())) == ("s1", Path("/state/sessions/s1"))
    assert session_of("<domain><name>other</name></domain>") is None


def test_auto_must_be_resolved() -> None:
    with pytest.raises(ValueError, match="resolve"):
        build_xml(spec(Accel.AUTO))
