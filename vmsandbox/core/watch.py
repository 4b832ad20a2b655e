"""A running session as a person steers it while it works, for every front end: what it may reach (its allowlist
read, widened, narrowed: the proxy takes a change from the next connection on), the ports it publishes (listed,
opened, closed while it runs), and the credentials it holds (wiped, its placeholders revoked). The page and the
terminal's `policy`, `port` and `secret wipe` call these; its console and egress decisions are read in
listing.py, for both."""

from __future__ import annotations

from vmsandbox.core import sessions
from vmsandbox.egress.ports import Publish
from vmsandbox.egress.rules.netpolicy import Mode
from vmsandbox.errors import UsageError, VmsandboxError
from vmsandbox.session.options import parse_publish
from vmsandbox.session.record import Record
from vmsandbox.session.running import clean, reach
from vmsandbox.session.running.reach import Allowlist

__all__ = ["Allowlist", "Publish"]
MODES = tuple(m.value for m in Mode)  # the network modes a session may have


def allow(name: str, hosts: list[str]) -> list[str]:
    """HOST, *.DOMAIN or HOST:PORT entries added to a running session's allowlist; the ones that were new."""
    return reach.allow(name, hosts)


def deny(name: str, hosts: list[str]) -> list[str]:
    """Entries taken off a running session's allowlist (HOST takes its HOST:PORT entries too); the ones removed."""
    return reach.deny(name, hosts)


def allowlist(name: str) -> Allowlist:
    return reach.allowlist(name)


def ports(name: str) -> tuple[Publish, ...]:
    """The ports a session publishes (its record only: `port ls`, and the guest ports `port rm` completes)."""
    return Record.load(name).publish


def _spec(name: str, command: str, spec: str, address: str | None) -> Publish:
    try:
        return parse_publish(spec, address, said="port", example=f"`vmsandbox port {command} {name} {{}}`")
    except VmsandboxError as exc:
        raise UsageError(exc.message, hint=exc.hint) from None


def publish(name: str, spec: str, address: str | None = None) -> Publish:
    """`[HOST_PORT:]GUEST_PORT` of a running session published (on a free host port when none is given), on
    loopback or `address`."""
    return reach.publish(name, _spec(name, "publish", spec, address))


def unpublish(name: str, spec: str) -> list[Publish]:
    """A guest port no longer published (every host port it has, or the one `HOST_PORT:` names)."""
    wanted = _spec(name, "rm", spec, None)
    return reach.unpublish(name, wanted.guest, wanted.host)


def wipe(name: str) -> list[str]:
    """The credentials a running session holds wiped (agent logins, git credentials) and the placeholders of
    your secrets revoked (its proxy stops replacing them); the guest's paths removed (guest text)."""
    return clean.clean(sessions.ready(name))
