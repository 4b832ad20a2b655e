"""Whether an address is this host's own, asked of the kernel when the address is checked.

Not a list made at start: the kernel's routing decides where a connection goes, so the proxy asks it, as
`ip route get ADDR` does (one rtnetlink RTM_GETROUTE request; nothing is sent on any network). An address the
kernel would deliver to this host itself (a route of type local: every address of every interface, v4 and v6,
an address added after the daemon started, a whole `local` route such as AnyIP's) or that it would broadcast
or multicast is the host's own: a connection there reaches whatever listens on 0.0.0.0 or `::` (a web server,
Docker's published ports) through the host's own stack. When the kernel cannot be asked, the answer is "own"
(fail closed).
"""

from __future__ import annotations

import errno
import ipaddress
import itertools
import os
import socket
import struct
from collections.abc import Callable

from vmsandbox.egress.rules.netpolicy import IPAddress

NETLINK_ROUTE = 0
RTM_NEWROUTE, RTM_GETROUTE = 24, 26
NLMSG_ERROR = 2
NLM_F_REQUEST = 0x1
RTA_DST = 1
# rtm_type values (linux/rtnetlink.h) a connection to the address would not leave the host by
OWN_TYPES = {2: "local", 3: "broadcast", 4: "anycast", 5: "multicast"}
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port id
_RTMSG = struct.Struct("=BBBBBBBBI")  # rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags
_ATTR = struct.Struct("=HH")  # rtattr: length, type
_seq = itertools.count(1)

Exchange = Callable[[bytes], bytes]  # one request to the kernel's routing, its answer


def request(ip: IPAddress, seq: int) -> bytes:
    """An RTM_GETROUTE request for `ip` (what `ip route get ADDR` sends)."""
    family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
    attr = _ATTR.pack(_ATTR.size + len(ip.packed), RTA_DST) + ip.packed
    body = _RTMSG.pack(family, ip.max_prefixlen, 0, 0, 0, 0, 0, 0, 0) + attr
    return _HEADER.pack(_HEADER.size + len(body), RTM_GETROUTE, NLM_F_REQUEST, seq, 0) + body


def route_type(answer: bytes, seq: int) -> int | None:
    """The route type in the kernel's answer to request `seq`; None when it has no route there (unreachable)."""
    offset = 0
    while offset + _HEADER.size <= len(answer):
        length, kind, _flags, got, _port = _HEADER.unpack_from(answer, offset)
        if length < _HEADER.size or offset + length > len(answer):
            break
        if got == seq and kind == NLMSG_ERROR:
            (code,) = struct.unpack_from("=i", answer, offset + _HEADER.size)
            if -code in (errno.ENETUNREACH, errno.EHOSTUNREACH):
                return None
            raise OSError(-code, os.strerror(-code))
        if got == seq and kind == RTM_NEWROUTE and length >= _HEADER.size + _RTMSG.size:
            return int(_RTMSG.unpack_from(answer, offset + _HEADER.size)[7])
        offset += (length + 3) & ~3
    raise OSError(errno.EPROTO, "no answer to the route request")


def kernel_exchange(message: bytes) -> bytes:
    """Send one rtnetlink request and read its answer."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_ROUTE) as s:
        s.settimeout(5)
        s.sendto(message, (0, 0))
        return s.recv(65536)


def own_reason(ip: IPAddress, exchange: Exchange = kernel_exchange) -> str | None:
    """Why `ip` is this host's own (the kernel would keep a connection there on the host), or None."""
    target: IPAddress = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped else ip
    seq = next(_seq) & 0x7FFFFFFF
    try:
        kind = route_type(exchange(request(target, seq)), seq)
    except OSError as exc:
        return f"which this host could not tell apart from its own addresses ({exc.strerror or exc})"
    if kind in OWN_TYPES:
        return f"one of this host's own addresses (the kernel routes it as {OWN_TYPES[kind]})"
    return None
