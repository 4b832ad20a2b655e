"""Reaching an upstream for the proxy: names resolved on the host and every answer checked, connections made to
the checked addresses themselves (never a second lookup), TLS verified before a secret goes out. Both the
resolver and the TLS context are handed to the proxy, so a test can give its own without a switch here."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Awaitable, Callable

from vmsandbox.egress.netpolicy import IPNetwork, Refused, check_addresses
from vmsandbox.egress.streams import Stream

CONNECT_TIMEOUT = 15.0
RESOLVE_TIMEOUT = 10.0

Resolver = Callable[[str, int, tuple[IPNetwork, ...]], Awaitable[list[tuple[str, int]]]]


async def resolve_checked(host: str, port: int, networks: tuple[IPNetwork, ...]) -> list[tuple[str, int]]:
    """Resolve on the host and check every answer (netpolicy.check_addresses): the addresses to connect to."""
    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(
            loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP), RESOLVE_TIMEOUT
        )
    except (OSError, TimeoutError):
        raise Refused(f"{host} does not resolve") from None
    found = check_addresses(host, [str(i[4][0]) for i in infos], networks)
    return [(str(ip), port) for ip in found]


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
