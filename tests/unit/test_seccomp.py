"""The jail's seccomp filter as data (seccomp.py); what it refuses in a real jail: tests/integration/test_jail.py."""

from __future__ import annotations

import os
import struct

import pytest

from vmsandbox.confine import seccomp


def _insns(program: bytes) -> list[tuple[int, int, int, int]]:
    return [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]


@pytest.mark.parametrize("arch", sorted(seccomp.NUMBERS))
def test_the_program_refuses_every_listed_call_and_ends_allowing(arch: str) -> None:
    insns = _insns(seccomp.program(arch))
    assert len(insns) < 256  # jump offsets are one byte: a program this long never needs a longer one
    compared = {k for code, _, _, k in insns if code == 0x15}
    table = seccomp.NUMBERS[arch]
    assert {table[n] for n in seccomp.REFUSED if n in table} <= compared
    assert insns[0] == (0x20, 0, 0, 4) and insns[1][3] == seccomp.AUDIT_ARCH[arch]  # the architecture first
    assert insns[2] == (0x06, 0, 0, seccomp.RET_KILL)
    assert insns[-1] == (0x06, 0, 0, seccomp.RET_ALLOW)
    for code, jt, jf, _ in insns:  # every jump lands inside the program
        assert code & 0x07 != 0x05 or (jt < len(insns) and jf < len(insns))


def test_an_architecture_without_a_table_has_no_program() -> None:
    with pytest.raises(seccomp.UnknownArchitectureError):
        seccomp.program("sparc64")
    assert seccomp.memfd("sparc64") is None


def test_the_filter_is_handed_over_in_an_inheritable_descriptor() -> None:
    fd = seccomp.memfd("x86_64")
    assert fd is not None
    try:
        assert os.get_inheritable(fd)
        assert os.read(fd, 1 << 16) == seccomp.program("x86_64")
    finally:
        os.close(fd)
