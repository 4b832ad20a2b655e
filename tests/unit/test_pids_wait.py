"""pids.readable: poll(2), so a descriptor past 1,023 (a front end raises its limit for a crowd) is waited on
as any other; select(2) raises there."""

from __future__ import annotations

import os
import resource
import select

import pytest

from vmsandbox import pids

HIGH = 1500


def test_a_descriptor_past_select_s_reach_is_waited_on() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= HIGH:
        pytest.skip(f"the hard limit of descriptors is {hard}")
    read, write = os.pipe()
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, HIGH + 1), hard))
    try:
        os.dup2(read, HIGH)
        with pytest.raises(ValueError):
            select.select([HIGH], [], [], 0)  # (why: select takes no descriptor past 1,023)
        assert not pids.readable(HIGH, 0.05)  # (nothing came)
        os.write(write, b"x")
        assert pids.readable(HIGH, 5)
        assert pids.readable(HIGH, None)
    finally:
        for fd in (read, write, HIGH):
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
