"""The session's egress daemon, as the product runs it, with the two things a test may inject: a resolver that
sends the stand-in names to their 127.0.0.1 ports (every other name goes through the product's own checked
resolver), and upstream TLS that also trusts the stand-ins' test CA. Nothing in the product reads a test
switch: this module builds the daemon itself.

    python -m tests.integration.standin_daemon SESSION NAME=PORT[,NAME=PORT...] CA_FILE [LIMITS_JSON]

LIMITS_JSON (optional): fields of egress.rules.limits.Limits to set (a test's small timeouts), as the daemon's
constructor takes them.
"""

from __future__ import annotations

import json
import ssl
import sys
from pathlib import Path

from vmsandbox.egress import daemon
from vmsandbox.egress.relay.upstream import resolve_checked, verified_tls
from vmsandbox.egress.rules.limits import Limits
from vmsandbox.egress.rules.netpolicy import IPNetwork

LOOPBACK = "127.0.0.1"


def build(session: str, table: str, ca_file: str, limits: str = "{}") -> daemon.Daemon:
    standins = {name: (LOOPBACK, int(port)) for name, _, port in (i.partition("=") for i in table.split(","))}

    async def resolver(host: str, port: int, networks: tuple[IPNetwork, ...]) -> list[tuple[str, int]]:
        if host in standins:
            return [standins[host]]
        return await resolve_checked(host, port, networks)

    test_ca = Path(ca_file).read_text()  # read now: the daemon is not root by the time it connects upstream

    def upstream_tls() -> ssl.SSLContext:
        ctx = verified_tls()
        ctx.load_verify_locations(cadata=test_ca)
        return ctx

    return daemon.Daemon(session, resolver=resolver, upstream_tls=upstream_tls, limits=Limits(**json.loads(limits)))


if __name__ == "__main__":
    session, table, ca_file, *limits = sys.argv[1:]
    sys.exit(daemon.main([session], lambda name: build(name, table, ca_file, *limits)))
