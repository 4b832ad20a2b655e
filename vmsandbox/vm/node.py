"""What libvirt says of a domain (virt.Hypervisor.info) and of its host (virt.Hypervisor.node), as plain data."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DomainInfo:
    name: str
    state: str
    pid: int | None

    @property
    def stopped(self) -> bool:
        """It powered off or crashed: it is not coming back."""
        return self.state in ("shutoff", "crashed")


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
    available_mib: int  # free, plus what the kernel would give back (buffers, page cache)
    cpu_features: frozenset[str]  # the host CPU's, as libvirt lists them (vmx/svm: virtualisation)
    kvm_error: str | None  # why libvirt would not run a KVM guest there (None: it would)

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
