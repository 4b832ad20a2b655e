from __future__ import annotations

from pathlib import Path

import pytest

from vmsandbox.errors import VmsandboxError
from vmsandbox.vm.accel import Accel, choose, kvm_problem


def cpuinfo(tmp_path: Path, flags: str) -> Path:
    p = tmp_path / "cpuinfo"
    p.write_text(f"processor\t: 0\nflags\t\t: fpu {flags} sse2\n")
    return p


def test_no_vmx_means_tcg(tmp_path: Path) -> None:
    problem = kvm_problem(cpuinfo(tmp_path, "pae"), tmp_path / "kvm")
    assert problem is not None and "vmx/svm" in problem
    choice = choose(Accel.AUTO, problem=problem)
    assert choice.accel is Accel.TCG and "TCG" in choice.reason


def test_missing_device(tmp_path: Path) -> None:
    problem = kvm_problem(cpuinfo(tmp_path, "vmx"), tmp_path / "kvm")
    assert problem is not None and "does not exist" in problem


def test_usable_device_means_kvm(tmp_path: Path) -> None:
    dev = tmp_path / "kvm"
    dev.write_text("")
    assert kvm_problem(cpuinfo(tmp_path, "svm"), dev) is None
    assert choose(Accel.AUTO, problem=None, probe=False).accel is Accel.KVM


def test_forcing() -> None:
    assert choose(Accel.TCG, problem=None, probe=False).accel is Accel.TCG
    with pytest.raises(VmsandboxError, match="KVM was requested"):
        choose(Accel.KVM, problem="no vmx")
