"""Reaching an upstream for the proxy: names resolved on the host and every answer checked, connections made to
the checked addresses themselves (never a second lookup), TLS verified before a secret goes out. Both the
resolver and the TLS context are handed to the proxy, so a test can give its own without a switch here."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Awaitable, Callable

from vmsandbox.egress.relay import ownaddr
from vmsandbox.egress.relay.streams import Stream
from vmsandbox.egress.rules.addresses import OwnCheck, check_addresses
from vmsandbox.egress.rules.netpolicy import IPNetwork, Refused

CONNECT_TIMEOUT = 15.0
RESOLVE_TIMEOUT = 10.0

Resolver = Callable[[str, int, tuple[IPNetwork, ...]], Awaitable[list[tuple[str, int]]]]
Lookup = Callable[[str, int], Awaitable[list[str]]]  # a name's addresses, as the host's resolver answers


async def host_lookup(host: str, port: int) -> list[str]:
    """The host's own resolver (getaddrinfo, in the loop's executor)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    return [str(i[4][0]) for i in infos]


def checked_resolver(lookup: Lookup = host_lookup, own: OwnCheck = ownaddr.own_reason) -> Resolver:
    """A resolver that checks every answer (addresses.check_addresses, the host's own addresses asked of `own`
    at each check): it gives the addresses to connect to. A test gives its own `lookup` and `own`."""

    async def resolve(host: str, port: int, networks: tuple[IPNetwork, ...]) -> list[tuple[str, int]]:
        try:
            answers = await asyncio.wait_for(lookup(host, port), RESOLVE_TIMEOUT)
        except (OSError, TimeoutError):
            raise Refused(f"{host} does not resolve") from None
        found = check_addresses(host, answers, networks, own=own)
        return [(str(ip), port) for ip in found]

    return resolve


resolve_checked = checked_resolver()  # the product's: the host's resolver, the kernel's routes


def verified_tls() -> ssl.SSLContext:
    """TLS to a real upstream before a secret goes to it: the system's trust store, HTTP/1.1."""
    ctx = ssl.create_default_context()
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


class Upstream(Exception):  # noqa: N818 - a decision to answer 502
    """The upstream could not be reached or verified (502)."""


async def connect(
    addresses: list[tuple[str, int]],
    target: str,
    *,
    tls: ssl.SSLContext | None = None,
    server_hostname: str | None = None,
) -> Stream:
    """Connect to the first address that answers: the checked addresses themselves, never a new lookup."""
    errors: list[str] = []
    for address, port in addresses:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(address, port, ssl=tls, server_hostname=server_hostname), CONNECT_TIMEOUT
            )
        except ssl.SSLCertVerificationError as exc:
            host = target.rsplit(":", 1)[0]
            raise Upstream(f"the certificate of {host} failed verification: {exc.verify_message}") from None
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            errors.append(f"{address}: {exc or type(exc).__name__}")
            continue
        return Stream(reader, writer)
    raise Upstream(f"cannot connect to {target} ({'; '.join(errors)})")
