"""Choosing the accelerator: KVM where the CPU and /dev/kvm allow it, else TCG with a warning."""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from pathlib import Path

from vmsandbox.errors import VmsandboxError

KVM_DEVICE = Path("/dev/kvm")
CPUINFO = Path("/proc/cpuinfo")


class Accel(enum.StrEnum):
    AUTO = "auto"
    KVM = "kvm"
    TCG = "tcg"


@dataclass(frozen=True)
class Choice:
    accel: Accel  # KVM or TCG, never AUTO
    reason: str


def kvm_problem(cpuinfo: Path = CPUINFO, device: Path = KVM_DEVICE) -> str | None:
    """Why KVM cannot be used here, or None when it can."""
    try:
        flags = cpuinfo.read_text()
    except OSError:
        return f"cannot read {cpuinfo}"
    if " vmx" not in flags and " svm" not in flags:
        return "the CPU shows no hardware virtualisation (no vmx/svm flag)"
    if not device.exists():
        return f"{device} does not exist (load the kvm_intel or kvm_amd module)"
    if not os.access(device, os.R_OK | os.W_OK):
        return f"{device} is not readable and writable for this user (add yourself to group kvm)"
    return None


def choose(requested: Accel, *, problem: str | None = None, probe: bool = True) -> Choice:
    """Resolve the requested accelerator. `problem` is kvm_problem()'s answer (probed when None)."""
    if problem is None and probe:
        problem = kvm_problem()
    if requested is Accel.TCG:
        return Choice(Accel.TCG, "TCG requested")
    if requested is Accel.KVM:
        if problem is not None:
            raise VmsandboxError(
                f"KVM was requested but cannot be used: {problem}",
                hint="use --accel tcg (slow, software emulation) or fix the cause",
            )
        return Choice(Accel.KVM, "KVM requested")
    if problem is None:
        return Choice(Accel.KVM, "KVM is available")
    return Choice(Accel.TCG, f"KVM unavailable: {problem}; using TCG (software emulation, much slower)")
