"""The rules of a request inside a terminated tunnel (one whose host gets a secret): for the tunnel's own host, in
origin form, with a method that cannot hand the secret back; and the secret put in its header."""

from __future__ import annotations

from collections.abc import Callable

from vmsandbox.egress.policy import ProxyConfig, SecretRule
from vmsandbox.egress.proxylog import Event
from vmsandbox.egress.relay.upstream import Upstream
from vmsandbox.egress.rules.netpolicy import Refused, parse_target

# The methods of the HTTP APIs agents call (REST): only these get a secret. TRACE and TRACK echo the request,
# headers and all; OPTIONS, CONNECT and extension methods have no business carrying an API key.
SECRET_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"})


def may_carry_a_secret(method: str) -> None:
    if method not in SECRET_METHODS:
        raise Refused(f"{method} never carries a secret: it could hand it back (an echo, a TRACE)")


def same_origin(authority: str, target: str, host: str, port: int | None) -> None:
    """A request inside a tunnel must be for the tunnel's own host, in origin form."""
    if parse_target(authority, default_port=port)[0] != host or not target.startswith("/"):
        raise Refused(f"request for {authority}{target[:80]} inside the tunnel to {host}")


def inject(
    cfg: ProxyConfig,
    rule: SecretRule,
    headers: list[tuple[str, str]],
    read_secret: Callable[[str], str | None],
    ev: Event,
) -> list[tuple[str, str]]:
    """The request's headers with the secret its placeholder (or the host's first set secret) stands for."""
    rule = cfg.secret_in(rule.host, headers, lambda s: read_secret(s) is not None) or rule
    if cfg.revoked:
        ev.reason = f"secret {rule.secret} was revoked by `vmsandbox secret wipe`; the placeholder passed unchanged"
        return headers
    value = read_secret(rule.secret)
    if value is None and not any(rule.placeholder in v for _, v in headers):  # the guest's own login
        ev.reason = f"secret {rule.secret} is not set: the request went with the guest's own credentials"
        return headers
    if value is None:
        raise Upstream(f"secret {rule.secret} is not set on the host; set it with `vmsandbox secret set {rule.secret}`")
    ev.secret = rule.secret
    name = rule.header.lower()
    if any(k.lower() == name for k, _ in headers):
        return [(k, v.replace(rule.placeholder, value) if k.lower() == name else v) for k, v in headers]
    return [*headers, (rule.header, rule.value.replace("{secret}", value))]
