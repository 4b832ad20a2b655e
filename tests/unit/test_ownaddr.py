"""The host's own addresses, asked of the kernel's routing at check time: the request and the parsing of its
answers, with the kernel played by the test (no netlink socket is opened here)."""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct

import pytest

from vmsandbox.egress.relay import ownaddr
from vmsandbox.egress.rules.netpolicy import IPAddress


def _answer(seq: int, route_type: int, *, family: int = socket.AF_INET) -> bytes:
    """The kernel's RTM_NEWROUTE answer to request `seq` (after some other message, as a dump may hold)."""
    rtmsg = struct.pack("=BBBBBBBBI", family, 32, 0, 0, 255, 2, 254, route_type, 0)
    other = struct.pack("=IHHII", 16, 3, 0, seq + 1000, 0)  # NLMSG_DONE of something else
    return other + struct.pack("=IHHII", 16 + len(rtmsg), ownaddr.RTM_NEWROUTE, 0, seq, 0) + rtmsg


def _error(seq: int, code: int) -> bytes:
    body = struct.pack("=i", -code) + struct.pack("=IHHII", 16, ownaddr.RTM_GETROUTE, 1, seq, 0)
    return struct.pack("=IHHII", 16 + len(body), ownaddr.NLMSG_ERROR, 0, seq, 0) + body


def _kernel(route_types: dict[str, int | OSError]) -> ownaddr.Exchange:
    """A kernel whose routes are `route_types` (by destination); every request is checked as it goes."""

    def exchange(message: bytes) -> bytes:
        length, kind, flags, seq, _ = struct.unpack_from("=IHHII", message)
        assert (length, kind, flags) == (len(message), ownaddr.RTM_GETROUTE, ownaddr.NLM_F_REQUEST)
        family, dst_len = struct.unpack_from("=BB", message, 16)
        attr_len, attr_type = struct.unpack_from("=HH", message, 28)
        raw = message[32 : 28 + attr_len]
        assert attr_type == ownaddr.RTA_DST and len(raw) * 8 == dst_len
        address = str(ipaddress.ip_address(raw))
        assert family == (socket.AF_INET if len(raw) == 4 else socket.AF_INET6)
        found = route_types.get(address, 1)  # RTN_UNICAST: it leaves the host
        if isinstance(found, OSError):
            raise found
        return _answer(seq, found, family=family)

    return exchange


@pytest.mark.parametrize(
    ("address", "kind", "own"),
    [
        ("198.51.100.7", 2, "local"),  # an address of one of its interfaces
        ("2001:db8:1::5", 2, "local"),  # its SLAAC address
        ("::ffff:198.51.100.7", 2, "local"),  # the same, IPv4-mapped: asked as IPv4
        ("203.0.113.255", 3, "broadcast"),
        ("93.184.215.14", 1, None),
    ],
)
def test_the_kernel_says_which_addresses_are_the_hosts_own(address: str, kind: int, own: str | None) -> None:
    asked = address.removeprefix("::ffff:")
    reason = ownaddr.own_reason(ipaddress.ip_address(address), _kernel({asked: kind}))
    assert (reason is None) if own is None else (reason is not None and own in reason and "own" in reason)


def test_no_route_is_not_own_and_a_kernel_that_cannot_answer_fails_closed() -> None:
    def unreachable(message: bytes) -> bytes:
        return _error(struct.unpack_from("=I", message, 8)[0], errno.ENETUNREACH)

    assert ownaddr.own_reason(ipaddress.ip_address("192.0.2.9"), unreachable) is None
    for failure in (OSError(errno.EACCES, "Permission denied"), OSError(errno.EPROTO, "garbled")):
        reason = ownaddr.own_reason(ipaddress.ip_address("1.1.1.1"), _kernel({"1.1.1.1": failure}))
        assert reason is not None and "could not tell" in reason

    def other_error(message: bytes) -> bytes:
        return _error(struct.unpack_from("=I", message, 8)[0], errno.EINVAL)

    assert "could not tell" in (ownaddr.own_reason(ipaddress.ip_address("1.1.1.1"), other_error) or "")

    def garbage(_message: bytes) -> bytes:
        return b"\x05\x00\x00\x00garbage"

    assert "could not tell" in (ownaddr.own_reason(ipaddress.ip_address("1.1.1.1"), garbage) or "")


def test_an_answer_to_another_request_is_not_taken() -> None:
    ip: IPAddress = ipaddress.ip_address("1.1.1.1")
    assert ownaddr.route_type(_answer(7, 2), 7) == 2
    with pytest.raises(OSError, match="no answer"):
        ownaddr.route_type(_answer(8, 2), 7)
    assert ownaddr.request(ip, 5)[8:12] == struct.pack("=I", 5)
