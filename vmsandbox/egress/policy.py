"""A session's egress policy: the file the proxy re-reads per connection (mode, allowlist, networks, secret
rules, revocation), the per-session CA for hosts that get a secret, and the placeholders the guest holds.

The guest's only door out is its own 127.0.0.1:3128, a reverse forward over an SSH connection that the
session's proxy daemon (daemon.py, started by control.py) holds open. Nothing in a policy file can switch a
check off: names, addresses and certificates are checked the same way in every session.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from secrets import token_hex
from typing import Any

from vmsandbox import paths, ui
from vmsandbox.egress import held, secrets
from vmsandbox.egress.rules import addresses, netpolicy
from vmsandbox.egress.rules.mapping import SecretMapping
from vmsandbox.egress.rules.netpolicy import Mode, Policy, Rule
from vmsandbox.errors import VmsandboxError

FWCFG_CA = "ca"  # the session CA certificate, trusted by the guest's system store
ANY_NETWORK = (ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0"))


@dataclass(frozen=True)
class SecretRule:
    """Inject secret `secret` into header `header` of requests to `host`, replacing `placeholder`."""

    secret: str
    host: str
    header: str
    placeholder: str
    value: str = "{secret}"  # the header's value when the guest did not send the header at all
    env: str | None = None  # the guest variable that holds the placeholder

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class ProxyConfig:
    policy: Policy
    secrets: tuple[SecretRule, ...] = ()
    revoked: bool = False  # `vmsandbox secret wipe` ran: placeholders pass through unreplaced

    def secret_for(self, host: str) -> SecretRule | None:
        return next((s for s in self.secrets if s.host == host), None)

    def secret_in(self, host: str, headers: list[tuple[str, str]], is_set: Callable[[str], bool]) -> SecretRule | None:
        """The rule for one request to `host`: of its rules (an API key, a login token…), the one whose
        placeholder the request carries, else the first whose secret is set, else the first."""
        rules = [s for s in self.secrets if s.host == host]
        carried = [r for r in rules if any(r.placeholder in value for _, value in headers)]
        return next(iter([*carried, *(r for r in rules if is_set(r.secret))]), rules[0] if rules else None)


@dataclass(frozen=True)
class Request:
    """What a session asks of its egress (from its settings)."""

    mode: Mode
    rules: tuple[Rule, ...] = ()
    allow_networks: tuple[str, ...] = ()
    mappings: tuple[SecretMapping, ...] = ()
    # image builds run the blueprint's own recipe: like the host's debootstrap, they may reach registries that
    # resolve to private addresses (loopback, link-local and metadata stay refused)
    any_network: bool = False


def check_secrets(mode: Mode, mappings: Sequence[SecretMapping], *, quiet: bool = False) -> None:
    """Before anything is made: every required secret must be set on the host (an optional one that is not
    only gets a note, unless quiet)."""
    if not mode.has_door:
        return
    for m in mappings:
        if secrets.get(m.secret) is not None:
            continue
        if m.required:
            raise VmsandboxError(
                f"secret {m.secret} (for {m.header} on {m.host}) is not set",
                hint=f"set it with `vmsandbox secret set {m.secret}` (it stays on the host)",
            )
        if not quiet:
            ui.info(
                f"Secret {m.secret} is not set, so {m.host} gets no {m.header} from the host (log in inside "
                f"the guest instead, or `vmsandbox secret set {m.secret}`)"
            )


def prepare(name: str, files: paths.SessionPaths, request: Request) -> dict[str, str]:
    """Write the session's egress policy (and its CA, as a fw_cfg file for the guest); return the guest
    environment that holds the placeholders."""
    rules = [
        SecretRule(m.secret, m.host, m.header, f"vmsandbox-placeholder-{token_hex(16)}", m.value, m.env)
        for m in request.mappings
        if request.mode.has_door
    ]
    data: dict[str, Any] = {
        "session": name,
        "mode": request.mode.value,
        # a host that gets a secret is allowed (over TLS only: that is where the proxy injects)
        "allow": list(dict.fromkeys([*(str(r) for r in request.rules), *(f"{r.host}:443" for r in rules)])),
        "allow_networks": list(request.allow_networks),
        "any_network": request.any_network,
        "secrets": [r.as_dict() for r in rules],
        "revoked": False,
    }
    write_config(files, data)
    if rules:
        from vmsandbox.egress.relay import certs  # (cryptography: a session with secrets needs it, `ls` does not)

        certs.create_ca(files.ca_cert, files.ca_key, session=name, hosts=list(dict.fromkeys(r.host for r in rules)))
        (files.fwcfg_dir / FWCFG_CA).write_bytes(files.ca_cert.read_bytes())
    # a secret that is not set gets no placeholder: the agent then offers its own login instead
    return {r.env: r.placeholder for r in rules if r.env and secrets.get(r.secret) is not None}


def rekey(source: paths.SessionPaths, name: str, files: paths.SessionPaths) -> dict[str, str]:
    """A fork's egress policy: the same rules as `source`'s, with placeholders and a CA of its own (written as
    prepare does). Returns {old placeholder: new placeholder} for the guest's environment."""
    data = read_config(source)
    swapped: dict[str, str] = {}
    for rule in data["secrets"]:
        new = f"vmsandbox-placeholder-{token_hex(16)}"
        swapped[rule["placeholder"]] = new
        rule["placeholder"] = new
    data["session"] = name
    write_config(files, data)
    if data["secrets"]:
        from vmsandbox.egress.relay import certs

        certs.create_ca(
            files.ca_cert, files.ca_key, session=name, hosts=list(dict.fromkeys(r["host"] for r in data["secrets"]))
        )
        (files.fwcfg_dir / FWCFG_CA).write_bytes(files.ca_cert.read_bytes())
    return swapped


def write_config(files: paths.SessionPaths, data: dict[str, Any]) -> None:
    held.rewrite(files.egress_config, json.dumps(data, indent=2, sort_keys=True))  # read by a daemon that holds it


def read_config(files: paths.SessionPaths) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(held.read(files.egress_config))
    return data


def proxy_config(data: dict[str, Any]) -> ProxyConfig:
    policy = Policy(
        Mode(data["mode"]),
        tuple(netpolicy.parse_rule(a, source="egress.json") for a in data["allow"]),
        ANY_NETWORK
        if data.get("any_network")
        else tuple(addresses.parse_network(n, source="egress.json") for n in data.get("allow_networks", [])),
        session=str(data.get("session", "NAME")),
    )
    return ProxyConfig(
        policy=policy,
        secrets=tuple(SecretRule(**s) for s in data["secrets"]),
        revoked=bool(data.get("revoked")),
    )


def revoke(files: paths.SessionPaths) -> None:
    """Placeholders stop being replaced: whatever copied one cannot use it through the proxy any more."""
    data = read_config(files)
    data["revoked"] = True
    write_config(files, data)


def allowed_more(data: dict[str, Any], entries: Sequence[str]) -> list[str]:
    """Add allowlist entries (HOST, *.DOMAIN, HOST:PORT, checked) to a policy; the ones that were new."""
    rules = [str(netpolicy.parse_rule(e, source="vmsandbox policy allow")) for e in entries]
    added = [r for r in dict.fromkeys(rules) if r not in data["allow"]]
    data["allow"] = [*data["allow"], *added]
    return added


def allowed_less(data: dict[str, Any], entries: Sequence[str], *, session: str) -> list[str]:
    """Take entries off a policy's allowlist (HOST also takes its HOST:PORT entries); the ones removed. An
    entry that is not there is an error, which names the wildcard that still lets it through, if one does."""
    rules = [netpolicy.parse_rule(e, source="vmsandbox policy deny") for e in entries]
    kept = [netpolicy.parse_rule(a, source="egress policy") for a in data["allow"]]

    def taken(k: Rule, r: Rule) -> bool:
        return k.pattern == r.pattern and (r.port is None or k.port == r.port)

    for r in rules:
        if not any(taken(k, r) for k in kept):
            host = r.pattern[2:] if r.pattern.startswith("*.") else r.pattern
            still = [str(k) for k in kept if k.matches(host, r.port or 443)]
            raise VmsandboxError(
                f"{r} is not in the allowlist of session {session}"
                + (f"; {still[0]} lets it through" if still else ""),
                hint=f"`vmsandbox policy deny {session} {still[0]}` removes that"
                if still
                else f"`vmsandbox policy log {session}`",
            )
    removed = [str(k) for k in kept if any(taken(k, r) for r in rules)]
    data["allow"] = [str(k) for k in kept if str(k) not in removed]
    return removed
