"""Egress policy as pure functions: which host names (and ports) a guest may ask for.

Nothing here opens a socket or resolves a name, so every refusal rule is tested on the host without traffic.
The proxy (vmsandbox.egress.relay.proxy) resolves names itself and hands the answers to `addresses.check_addresses`.
"""

from __future__ import annotations

import enum
import ipaddress
import re
from dataclasses import dataclass

from vmsandbox.errors import VmsandboxError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


GUEST_PROXY_PORT = 3128  # the guest's one door out: its own 127.0.0.1:3128, forwarded to the host's proxy
DEFAULT_PORTS = frozenset({80, 443})  # an allowlist entry without :PORT allows these


class Mode(enum.StrEnum):
    """A session's network mode, and what each one means. A new mode is a new member here (its door, its
    label, what it admits) plus its spelling in `parse_mode`'s hint."""

    ALLOWLIST = "allowlist"  # only listed host names
    OPEN = "open"  # any public host name (never loopback, private, link-local, CGNAT or metadata addresses)
    NONE = "none"  # no egress at all: no proxy, no door

    @property
    def has_door(self) -> bool:
        """Whether the guest gets a proxy at its 127.0.0.1:3128 (the egress daemon must run)."""
        return self is not Mode.NONE

    def label(self, allowed: int) -> str:
        """How `run` and `ls` say it."""
        return {
            Mode.ALLOWLIST: f"allowlist: {allowed} allowed hosts",
            Mode.OPEN: "open: any public host",
            Mode.NONE: "none: no network",
        }[self]

    def admit(self, host: str, port: int, rules: tuple[Rule, ...], session: str = "NAME") -> None:
        """Refused unless a guest in this mode may ask for host:port (names already checked as not special).
        A refusal names the command that allows it on the running session."""
        if self is Mode.NONE:
            raise Refused("this session has no network (--network none)")
        if any(r.matches(host, port) for r in rules):
            return
        if self is Mode.OPEN:
            if port not in DEFAULT_PORTS:
                raise Refused(
                    f"port {port} is not open (only 80 and 443); allow it with `vmsandbox policy allow {session} "
                    f"{host}:{port}`"
                )
            return
        raise Refused(f"{host}:{port} is not in the allowlist; allow it with `vmsandbox policy allow {session} {host}`")


def parse_mode(value: str, *, source: str) -> Mode:
    try:
        return Mode(value.lower())
    except ValueError:
        from vmsandbox.document import did_you_mean  # here alone: the rest of this module is pure policy

        near = did_you_mean(value.lower(), [m.value for m in Mode])
        raise VmsandboxError(
            f"{source}: unknown network mode {value!r}{near}", hint="use allowlist, open or none"
        ) from None


# Special-use names (RFC 6761 and friends) that must never be looked up for a guest.
_SPECIAL_SUFFIXES = {
    "localhost": "loopback name",
    "invalid": "special-use name that never resolves",
    "test": "special-use name that never resolves",
    "local": "multicast DNS name",
    "internal": "private-use name (cloud metadata lives here)",
    "home.arpa": "home network name",
    "arpa": "reverse-lookup name",
    "onion": "Tor name",
}
_LABEL = re.compile(r"^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?\Z")
_NUMERIC_LABEL = re.compile(r"^(0x[0-9a-f]*|[0-9]+)\Z")
_PORT = re.compile(r"[0-9]{1,5}")  # ASCII digits only: str.isdigit() takes "²", which int() refuses


def port_number(text: str) -> int | None:
    """A TCP port written in ASCII digits (1-65535), or None."""
    return int(text) if _PORT.fullmatch(text) and 0 < int(text) < 65536 else None


class Refused(Exception):  # noqa: N818 - a decision, not a failure of ours
    """A request the policy refuses; `reason` is shown to the guest and logged."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def normalize_host(host: str) -> str:
    """A lowercase host name without a trailing dot; Refused for IP literals and malformed names."""
    h = host.strip().lower()
    if h.startswith("[") or ":" in h:
        raise Refused("IP literals are not allowed; use a host name")
    h = h.removesuffix(".")
    try:
        ipaddress.ip_address(h)
    except ValueError:
        pass
    else:
        raise Refused("IP literals are not allowed; use a host name")
    if not h or len(h) > 253:
        raise Refused("malformed host name")
    if not h.isascii():
        try:
            h = h.encode("idna").decode("ascii")
        except UnicodeError:
            raise Refused("malformed host name") from None
    labels = h.split(".")
    # As browsers do (WHATWG URL): a numeric last label makes the whole name an IPv4 address in one of
    # inet_aton's spellings (2130706433, 0x7f.1, 127.1, 0177.0.0.1).
    if _NUMERIC_LABEL.fullmatch(labels[-1]):
        raise Refused("IP literals are not allowed; use a host name")
    if not all(_LABEL.fullmatch(label) for label in labels):
        raise Refused("malformed host name")
    return h


def special_name_reason(host: str) -> str | None:
    """Why a (normalized) host name is never resolved for a guest, or None. A name of one label is never a
    public one: the host's own rules answer it (nss-myhostname's `_outbound` and `_gateway` and the host's own
    name, systemd-resolved's `_localdnsstub`, /etc/hosts, a search domain's internal hosts)."""
    for suffix, why in _SPECIAL_SUFFIXES.items():
        if host == suffix or host.endswith("." + suffix):
            return f"{host} is a {why}"
    if "." not in host:
        return f"{host} is a single-label name, which only this host's own rules answer"
    return None


@dataclass(frozen=True)
class Rule:
    """One allowlist entry: `host`, `*.domain` (any subdomain, not the domain itself), optionally `:PORT`."""

    pattern: str
    port: int | None = None

    def matches(self, host: str, port: int) -> bool:
        if port not in ({self.port} if self.port is not None else DEFAULT_PORTS):
            return False
        if self.pattern.startswith("*."):
            return host.endswith(self.pattern[1:])
        return host == self.pattern

    def __str__(self) -> str:
        return self.pattern + (f":{self.port}" if self.port is not None else "")


def parse_rule(entry: str, *, source: str) -> Rule:
    text = entry.strip().lower()
    port: int | None = None
    if text.count(":") == 1:
        text, port_text = text.split(":")
        port = port_number(port_text)
        if port is None:
            raise VmsandboxError(f"{source}: bad port in allowlist entry {entry!r}", hint="write host:PORT")
    wildcard = text.startswith("*.")
    try:
        name = normalize_host(text[2:] if wildcard else text)
    except Refused as exc:
        raise VmsandboxError(
            f"{source}: bad allowlist entry {entry!r}: {exc.reason}",
            hint="write a host name like pypi.org, a wildcard like *.npmjs.org, or host:PORT",
        ) from None
    if wildcard and "." not in name:
        raise VmsandboxError(f"{source}: allowlist entry {entry!r} is too broad", hint="write *.example.com")
    return Rule(("*." if wildcard else "") + name, port)


def parse_target(authority: str, *, default_port: int | None = None) -> tuple[str, int]:
    """'host:port' (a CONNECT target or a URL's authority) -> (normalized host, port); Refused if bad."""
    if authority.startswith("["):
        raise Refused("IP literals are not allowed; use a host name")
    host, sep, port_text = authority.rpartition(":")
    if not sep:
        host, port_text = authority, ""
    if not port_text:
        if default_port is None:
            raise Refused("the target needs a port (host:port)")
        port = default_port
    else:
        found = port_number(port_text)
        if found is None:
            raise Refused("bad port")
        port = found
    return normalize_host(host), port


@dataclass(frozen=True)
class Policy:
    mode: Mode
    rules: tuple[Rule, ...] = ()
    networks: tuple[IPNetwork, ...] = ()  # non-public networks the user allowed (allow_networks)
    session: str = "NAME"  # named in refusals (`vmsandbox policy allow SESSION HOST`)

    def decide(self, host: str, port: int) -> None:
        """Refused unless the guest may ask for host:port (before any lookup)."""
        if self.mode is Mode.NONE:
            self.mode.admit(host, port, self.rules, self.session)
        special = special_name_reason(host)
        if special is not None:
            raise Refused(special)
        self.mode.admit(host, port, self.rules, self.session)
