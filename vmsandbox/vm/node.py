"""What libvirt says of a domain (virt.Hypervisor.info) and of its host (virt.Hypervisor.node), as plain data;
the errors virt raises; and the parts of virt that need no libvirt of their own (a connection that gives up on
a host that never answers, the hint for one that refuses)."""

from __future__ import annotations

import os
import threading
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit

from vmsandbox.errors import VmsandboxError
from vmsandbox.vm import sshcheck

T = TypeVar("T")
OPEN_TIMEOUT = 20.0  # another host's libvirt answers in a second or two; one behind a dead route, in TCP's minutes


REMOTE_HINT = (
    "check that `virsh -c URI version` works from here (ssh by key, without a password, to an account that may "
    "use libvirt there; libvirtd running there)"
)


class UnreachableError(VmsandboxError):
    """libvirtd does not answer (VMs it started keep running without it)."""


class PortTakenError(VmsandboxError):
    """QEMU could not listen on a forwarded host port: another process took it since we chose it."""


# libvirt's virDomainState by number (a stable part of its API), as `ls` says each: blocked is running
STATES = ("nostate", "running", "running", "paused", "shutting-down", "shutoff", "crashed", "suspended")


def not_started(text: str, what: str, hint: str | None = None) -> VmsandboxError:
    """libvirt's refusal to start or restore a domain (its message `text`), as the error to raise: a forwarded
    port another process took is said apart (the caller picks another port)."""
    if "host forwarding" in text or "Address already in use" in text:  # QEMU's words, seen only here
        return PortTakenError(f"a forwarded port was taken: {text}")
    return VmsandboxError(f"{what}: {text}", hint=hint)


def state_name(state: int) -> str:
    return STATES[state] if 0 <= state < len(STATES) else "unknown"


@dataclass(frozen=True)
class DomainInfo:
    name: str
    state: str
    pid: int | None

    @property
    def stopped(self) -> bool:
        """It powered off or crashed: it is not coming back."""
        return self.state in ("shutoff", "crashed")


def mem_available_kib(meminfo: str) -> int | None:
    """MemAvailable (KiB) of /proc/meminfo's text, or None where it has none."""
    for line in meminfo.splitlines():
        key, _, value = line.partition(":")
        if key == "MemAvailable" and value.split() and value.split()[0].isdigit():
            return int(value.split()[0])
    return None


def gone(info: DomainInfo | None) -> bool:
    """No domain, or one that powered off or crashed."""
    return info is None or info.stopped


@dataclass(frozen=True)
class Node:
    hostname: str
    libvirt: str
    qemu: str
    cpus: int
    memory_mib: int
    available_mib: int  # what the kernel could give without swapping (see `of`)
    cpu_features: frozenset[str]  # the host CPU's, as libvirt lists them (vmx/svm: virtualisation)
    kvm_error: str | None  # why libvirt would not run a KVM guest there (None: it would)
    reserved_mib: int = 0  # of the kernel's figure, what the holes of shared memory files take back (see `of`)

    @classmethod
    def of(
        cls,
        hostname: str,
        libvirt: str,
        qemu: str,
        cpus: int,
        stats: dict[str, int],
        caps: str,
        kvm: str | None,
        *,
        meminfo: str | None = None,
        reserved_mib: int = 0,
    ) -> Node:
        """From what libvirt answers: its memory stats (KiB) and its capabilities XML (the host CPU's features).
        Its memory available is the kernel's own MemAvailable where `meminfo` (/proc/meminfo's text, this
        machine's) is given, less `reserved_mib` (the holes of the shared memory files its sessions map, which
        their next save reads in: vm.memory.usage.reserved_mib); else free, buffers and cached, which is all
        libvirt says of another host — and counts shared memory as cached: the held memory of templates, which
        no pressure gives back."""
        cpu = ET.fromstring(caps).find("host/cpu")  # noqa: S314 - a host the user's config names
        features = frozenset(f.get("name", "") for f in ([] if cpu is None else cpu.iter("feature")))
        available = stats["free"] + stats.get("buffers", 0) + stats.get("cached", 0)
        kernel = mem_available_kib(meminfo) if meminfo is not None else None
        available = available if kernel is None else kernel - reserved_mib * 1024
        return cls(
            hostname, libvirt, qemu, cpus, stats["total"] // 1024, max(available, 0) // 1024, features, kvm,
            reserved_mib if kernel is not None else 0,
        )  # fmt: skip

    def kvm_problem(self) -> str | None:
        """Why KVM cannot be used there (the same two questions accel.kvm_problem asks of this machine)."""
        if not self.cpu_features & {"vmx", "svm"}:
            return "its CPU shows no hardware virtualisation (no vmx/svm flag)"
        if self.kvm_error is not None:
            return self.kvm_error
        return None

    @property
    def accel(self) -> str:
        return "kvm" if self.kvm_problem() is None else "tcg"


@dataclass(frozen=True)
class Confinement:
    """How libvirt confines the QEMU processes it starts there, from its capabilities: the account they run as
    under its DAC driver (by domain type), and every security model it applies."""

    models: tuple[str, ...]  # "dac", "selinux", "apparmor" ("none" left out)
    accounts: dict[str, tuple[int, int]]  # domain type ("qemu", "kvm") -> (uid, gid) of its QEMU processes

    @classmethod
    def of(cls, caps: str) -> Confinement:
        host = ET.fromstring(caps).find("host")  # noqa: S314 - from our own (or a configured host's) libvirt
        models: list[str] = []
        accounts: dict[str, tuple[int, int]] = {}
        for sec in [] if host is None else host.iterfind("secmodel"):
            model = sec.findtext("model", "")
            if model and model != "none":
                models.append(model)
            for label in sec.iterfind("baselabel") if model == "dac" else ():
                uid, _, gid = (label.text or "").partition(":")
                if uid.startswith("+") and gid.startswith("+") and uid[1:].isdigit() and gid[1:].isdigit():
                    accounts[label.get("type", "")] = (int(uid[1:]), int(gid[1:]))
        return cls(tuple(models), accounts)


def here(uri: str) -> bool:
    """Whether libvirt at `uri` runs on this machine (a URI with no host in it)."""
    return not urlsplit(uri).hostname


def unreachable_hint(message: str, uri: str, default_uri: str) -> str:
    """The fix for a libvirt connection refused with `message`."""
    if not here(uri):  # libvirt's ssh transport loses ssh's words; `hosts` asks ssh itself
        return f"`vmsandbox host ls` says why, in ssh's words; {REMOTE_HINT}" if sshcheck.target(uri) else REMOTE_HINT
    hint = (
        "start it with `vmsandbox host setup` (or `virtlogd -d && libvirtd -d` as root), "
        "then check with `vmsandbox doctor`"
    )
    if "ermission denied" in message and os.geteuid() != 0:
        return (
            "join the libvirt group: `sudo vmsandbox host setup --user $USER`, then log in again "
            "(`vmsandbox doctor` says which group is missing)"
        )
    if uri != default_uri:
        return (
            f"check `libvirt_uri` in ~/.config/vmsandbox/config.yaml or VMSANDBOX_LIBVIRT_URI (the default "
            f"is {default_uri}); if it is right, {hint}"
        )
    return hint


def dotted(v: int) -> str:
    """A libvirt version number (1000000 * major + 1000 * minor + release) as text."""
    return f"{v // 1000000}.{v // 1000 % 1000}.{v % 1000}"


def opened(uri: str, call: Callable[[], T]) -> T:
    """call() — libvirt.open(uri). For another host's URI it runs in a daemon thread, and TimeoutError is raised
    when it has not returned within OPEN_TIMEOUT: a host that takes the connection and never answers (or one
    behind a dead route) would otherwise hold `ls`, `gc` or `destroy` for minutes. The thread is left to end by
    itself."""
    if here(uri):
        return call()
    result: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(call())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread as it is
            error.append(exc)

    waiter = threading.Thread(target=run, daemon=True, name=f"libvirt-open {uri}")
    waiter.start()
    waiter.join(OPEN_TIMEOUT)
    if error:
        raise error[0]
    if not result:
        raise TimeoutError(uri)
    return result[0]
