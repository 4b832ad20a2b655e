"""What a package's install scripts, a service manager and udev would do on a normal host: the unprivileged
account for guest data, /dev/kvm permissions and libvirt's daemons."""

from __future__ import annotations

import grp
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from vmsandbox import confine, packages, proc
from vmsandbox.errors import VmsandboxError
from vmsandbox.vm.accel import KVM_DEVICE
from vmsandbox.vm.virt import Hypervisor

DAEMONS = {"virtlogd": Path("/run/libvirt/virtlogd-sock"), "libvirtd": Path("/run/libvirt/libvirt-sock")}


def kvm_permissions_ok(device: Path = KVM_DEVICE) -> bool:
    """As udev sets it: group kvm, mode 0660. Otherwise libvirt re-probes QEMU on every create (~60 s)."""
    try:
        st = device.stat()
        kvm_gid = grp.getgrnam("kvm").gr_gid
    except (OSError, KeyError):
        return True  # no device or no group: nothing to fix
    return st.st_gid == kvm_gid and stat.S_IMODE(st.st_mode) & 0o660 == 0o660


def _daemon_running(name: str) -> bool:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == name:
                    return True
            except OSError:
                continue
    return False


def setup(uri: str) -> Iterator[str]:
    """Bring the host to the state a session needs; yields a line per action taken."""
    if os.geteuid() != 0:
        raise VmsandboxError("host set-up needs root", hint="run `sudo vmsandbox host setup`")
    if confine.account() is None:
        proc.run(
            [
                "useradd",
                "--system",
                "--user-group",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                "/usr/sbin/nologin",
                "--comment",
                "vmsandbox, reads what comes out of guests",
                confine.ACCOUNT,
            ]
        )
        yield f"created the unprivileged account {confine.ACCOUNT} (it owns and reads guest data on the host)"
    if KVM_DEVICE.exists() and not kvm_permissions_ok():
        os.chown(KVM_DEVICE, -1, grp.getgrnam("kvm").gr_gid)
        KVM_DEVICE.chmod(0o660)
        yield f"set {KVM_DEVICE} to group kvm, mode 0660 (as udev would)"
    for daemon in DAEMONS:
        if not _daemon_running(daemon):
            proc.run([daemon, "-d"], hint=f"is libvirt installed? `apt-get install {packages.TOOL_PACKAGES[daemon]}`")
            yield f"started {daemon}"
    deadline = time.monotonic() + 60  # libvirtd's first start probes QEMU for ~15 s
    while True:
        try:
            with Hypervisor(uri) as hv:
                yield f"libvirt {hv.version()} answers at {uri}"
                return
        except VmsandboxError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
