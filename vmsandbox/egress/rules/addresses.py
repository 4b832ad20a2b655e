"""Which addresses a guest's request may be carried to, as pure functions: public unicast only, or a network the
user allowed (`allow_networks`) — and never, whatever the mode or the allowlist says, an address that is the
host itself or the cloud under it.

"Never" is a property of the reason, not of its wording: every reason says whether an allowed network may lift
it (`Why.hard`), and an address that wraps another (IPv4-mapped, -translated or -compatible, 6to4, NAT64,
Teredo) is as hard to reach as the address it wraps. Whether an address is the host's own is asked by the
caller (`own`, the kernel's routing at check time: ownaddr.py), so nothing here opens a socket.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from vmsandbox.egress.rules.netpolicy import IPAddress, IPNetwork, Refused
from vmsandbox.errors import VmsandboxError

OwnCheck = Callable[[IPAddress], "str | None"]  # why an address is this host's own, or None

METADATA_ADDRESSES = frozenset(
    {
        ipaddress.ip_address("169.254.169.254"),  # AWS, GCP, Azure, OpenStack
        ipaddress.ip_address("169.254.170.2"),  # AWS ECS task metadata
        ipaddress.ip_address("fd00:ec2::254"),  # AWS over IPv6
        ipaddress.ip_address("100.100.100.200"),  # Alibaba Cloud
    }
)
CGNAT = ipaddress.ip_network("100.64.0.0/10")
# NAT64 prefixes: the well-known one (RFC 6052: the IPv4 address in the last 32 bits) and the local-use one
# (RFC 8215: any of RFC 6052's prefix lengths, so every place an IPv4 address can sit in it is read).
NAT64 = ipaddress.ip_network("64:ff9b::/96")
NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
SIXTOFOUR = ipaddress.ip_network("2002::/16")
TEREDO = ipaddress.ip_network("2001::/32")
TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")  # SIIT (RFC 2765): ::ffff:0:a.b.c.d
COMPATIBLE = ipaddress.ip_network("::/96")  # deprecated IPv4-compatible (RFC 4291): ::a.b.c.d
SITE_LOCAL = ipaddress.ip_network("fec0::/10")  # deprecated (RFC 3879) but still routed privately


@dataclass(frozen=True)
class Why:
    """Why an address may not be reached; `hard`: no allowed network lifts it (the host, or the cloud under it)."""

    text: str
    hard: bool = False


def _embedded_v4(ip: ipaddress.IPv6Address) -> list[tuple[str, ipaddress.IPv4Address]]:
    """Every IPv4 address this IPv6 address carries to a gateway or tunnel, with the name of the wrapping."""
    n = int(ip)
    found: list[tuple[str, ipaddress.IPv4Address]] = []
    if ip.ipv4_mapped is not None:
        found.append(("an IPv4-mapped address", ip.ipv4_mapped))
    if ip in TRANSLATED or (ip in COMPATIBLE and n > 1):  # (:: and ::1 are themselves)
        found.append(("an IPv4-translated address", ipaddress.IPv4Address(n & 0xFFFFFFFF)))
    if ip in SIXTOFOUR and ip.sixtofour is not None:
        found.append(("a 6to4 address", ip.sixtofour))
    if ip in NAT64:
        found.append(("a NAT64 address", ipaddress.IPv4Address(n & 0xFFFFFFFF)))
    if ip in NAT64_LOCAL:  # RFC 6052's layouts: 32 bits after the prefix, bits 64-71 (the "u" octet) skipped
        bits = f"{n:0128b}"
        squeezed = bits[:64] + bits[72:]
        for prefix in (48, 56, 64):
            inner = ipaddress.IPv4Address(int(squeezed[prefix : prefix + 32], 2))
            found.append((f"a NAT64 address (/{prefix})", inner))
        found.append(("a NAT64 address (/96)", ipaddress.IPv4Address(n & 0xFFFFFFFF)))
    return found


def address_why(ip: IPAddress) -> Why | None:
    """Why the guest may not reach this address, or None for a public unicast address."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip in TEREDO:  # its client address is obfuscated and its relay is anyone's: never
            return Why("a Teredo tunnel address (it can carry any IPv4 address)", hard=True)
        bad = [(why, how, inner) for how, inner in _embedded_v4(ip) if (why := address_why(inner)) is not None]
        if bad:  # the hardest of what it wraps
            why, how, inner = sorted(bad, key=lambda b: not b[0].hard)[0]
            return Why(f"{how} wrapping {inner}, {why.text}", hard=why.hard)
        if ip.ipv4_mapped is not None:
            return None  # a public IPv4 address, written as IPv6
    checks: tuple[tuple[bool, str, bool], ...] = (
        (ip in METADATA_ADDRESSES, "a cloud metadata address", True),
        (ip.is_loopback, "a loopback address", True),
        (ip.is_unspecified, "the unspecified address", True),
        (ip.is_link_local, "a link-local address", True),
        (ip.is_multicast, "a multicast address", True),
        (isinstance(ip, ipaddress.IPv4Address) and ip in CGNAT, "a carrier-grade NAT (shared) address", False),
        (isinstance(ip, ipaddress.IPv6Address) and ip in SITE_LOCAL, "a site-local address", False),
        (ip.is_private, "a private address", False),
        (ip.is_reserved, "a reserved address", False),
        (not ip.is_global, "not a public address", False),
    )
    return next((Why(text, hard) for hit, text, hard in checks if hit), None)


def address_reason(ip: IPAddress) -> str | None:
    """Why the guest may not reach this address (its text), or None for a public unicast address."""
    why = address_why(ip)
    return None if why is None else why.text


def check_addresses(
    host: str, addresses: Iterable[str], allowed: Iterable[IPNetwork] = (), *, own: OwnCheck
) -> list[IPAddress]:
    """The resolved addresses of host, all public (or in an `allowed` network) and none the host's own (`own`
    says), in order; Refused if any is not (a name that mixes public and private answers is refused whole: a
    rebinding trick or a mistake)."""
    nets = tuple(allowed)
    found: list[IPAddress] = []
    for text in addresses:
        ip = ipaddress.ip_address(text.split("%", 1)[0])
        why = address_why(ip)
        if why is not None and (why.hard or not any(ip in n for n in nets)):
            raise Refused(f"{host} resolves to {ip}, {why.text}")
        mine = own(ip)
        if mine is not None:
            raise Refused(f"{host} resolves to {ip}, {mine}")
        if ip not in found:
            found.append(ip)
    if not found:
        raise Refused(f"{host} does not resolve")
    return found


def parse_network(entry: str, *, source: str) -> IPNetwork:
    """An `allow_networks` entry: a non-public network the proxy may connect to (a corporate gateway, a
    fake-IP resolver). Never one that reaches loopback, link-local or metadata addresses."""
    try:
        net = ipaddress.ip_network(entry.strip(), strict=False)
    except ValueError:
        raise VmsandboxError(f"{source}: {entry!r} is not a network", hint="write it like 203.0.113.0/24") from None
    for ip in (net.network_address, net.broadcast_address):
        why = address_why(ip)
        if why is not None and why.hard:
            raise VmsandboxError(f"{source}: {entry} includes {why.text}; that can never be allowed")
    for hard in (*METADATA_ADDRESSES, ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")):
        if hard.version == net.version and hard in net:
            raise VmsandboxError(f"{source}: {entry} includes {hard}; that can never be allowed")
    return net
