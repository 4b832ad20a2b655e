"""Refusal rules as pure functions: no name is resolved and no socket is opened here."""

from __future__ import annotations

import ipaddress
import re
from typing import Any

import pytest

from vmsandbox.egress.rules import addresses, httphead, netpolicy, tlshello
from vmsandbox.egress.rules.netpolicy import IPAddress, Mode, Policy, Refused, normalize_host, parse_rule
from vmsandbox.errors import VmsandboxError


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("169.254.169.254", "metadata"),
        ("fd00:ec2::254", "metadata"),
        ("100.100.100.200", "metadata"),
        ("127.0.0.1", "loopback"),
        ("127.8.9.10", "loopback"),
        ("::1", "loopback"),
        ("0.0.0.0", "unspecified"),
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("100.64.0.1", "carrier-grade"),
        ("100.127.255.254", "carrier-grade"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("172.31.255.255", "private"),
        ("192.168.122.1", "private"),
        ("fc00::1", "private"),
        ("224.0.0.1", "multicast"),
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:169.254.169.254", "metadata"),
        ("2002:7f00:1::", "6to4"),
        ("203.0.113.7", "private"),  # documentation range: not public
    ],
)
def test_forbidden_addresses(address: str, why: str) -> None:
    reason = addresses.address_reason(ipaddress.ip_address(address))
    assert reason is not None and why in reason


@pytest.mark.parametrize("address", ["93.184.215.14", "151.101.0.223", "2a04:4e42::223", "1.1.1.1"])
def test_public_addresses_pass(address: str) -> None:
    assert addresses.address_reason(ipaddress.ip_address(address)) is None


def nothing_is_own(_ip: IPAddress) -> str | None:
    """The host's own addresses, as a test without a host has them: none."""
    return None


def check_addresses(host: str, answers: list[str], allowed: Any = ()) -> list[IPAddress]:
    return addresses.check_addresses(host, answers, allowed, own=nothing_is_own)


def test_a_name_with_one_bad_answer_is_refused_whole() -> None:
    assert [str(a) for a in check_addresses("ok.example", ["1.1.1.1", "1.1.1.1"])] == ["1.1.1.1"]
    with pytest.raises(Refused, match=r"resolves to 10\.0\.0\.1, a private address"):
        check_addresses("rebind.example", ["1.1.1.1", "10.0.0.1"])
    with pytest.raises(Refused, match="does not resolve"):
        check_addresses("empty.example", [])


def test_allowed_networks_lift_private_but_never_loopback_or_metadata() -> None:
    net = addresses.parse_network("203.0.113.0/24", source="t")
    assert check_addresses("gw.example", ["203.0.113.80"], [net])
    wide = ipaddress.ip_network("0.0.0.0/0")
    with pytest.raises(Refused, match="metadata"):
        check_addresses("meta.example", ["169.254.169.254"], [wide])
    with pytest.raises(Refused, match="loopback"):
        check_addresses("lo.example", ["127.0.0.1"], [wide])
    for bad in ("127.0.0.0/8", "169.254.0.0/16", "0.0.0.0/0", "::/0", "nonsense"):
        with pytest.raises(VmsandboxError):
            addresses.parse_network(bad, source="t")


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "[::1]", "::1", "2130706433", "0x7f000001", "127.1", "0177.0.0.1", "1.2.3.4."]
)
def test_ip_literals_in_every_spelling_are_refused(host: str) -> None:
    with pytest.raises(Refused, match="IP literal"):
        normalize_host(host)


@pytest.mark.parametrize("host", ["", "a..b", "-x.com", "x" * 64 + ".com", "exa mple.com", "a/b.com"])
def test_malformed_names_are_refused(host: str) -> None:
    with pytest.raises(Refused):
        normalize_host(host)


def test_names_are_normalised() -> None:
    assert normalize_host("PyPI.org.") == "pypi.org"
    assert normalize_host("bücher.example") == "xn--bcher-kva.example"


def test_allowlist_rules_and_wildcards() -> None:
    policy = Policy(
        Mode.ALLOWLIST, tuple(parse_rule(r, source="t") for r in ("pypi.org", "*.npmjs.org", "git.example.com:22"))
    )
    policy.decide("pypi.org", 443)
    policy.decide("pypi.org", 80)
    policy.decide("registry.npmjs.org", 443)
    policy.decide("git.example.com", 22)
    for host, port in (("npmjs.org", 443), ("evilnpmjs.org", 443), ("pypi.org", 22), ("git.example.com", 443)):
        with pytest.raises(Refused, match="not in the allowlist"):
            policy.decide(host, port)


def test_special_names_are_refused_before_any_lookup_even_in_open_mode() -> None:
    policy = Policy(Mode.OPEN)
    policy.decide("anything.example.com", 443)
    for host in ("localhost", "x.localhost", "metadata.google.internal", "a.invalid", "printer.local"):
        with pytest.raises(Refused):
            policy.decide(host, 443)
    with pytest.raises(Refused, match="port 25"):
        policy.decide("mail.example.com", 25)
    with pytest.raises(Refused, match="no network"):
        Policy(Mode.NONE).decide("pypi.org", 443)


def test_special_names_are_refused_even_when_allowlisted() -> None:
    """Nothing (no allowlist entry, no test switch) lifts the special-name rule."""
    policy = Policy(Mode.ALLOWLIST, (parse_rule("up.test", source="t"), parse_rule("x.internal", source="t")))
    for host in ("up.test", "x.internal"):
        with pytest.raises(Refused, match=r"special-use|private-use"):
            policy.decide(host, 443)


def test_each_network_mode_knows_its_door_label_and_decision() -> None:
    rules = (parse_rule("pypi.org", source="t"),)
    assert [m.has_door for m in Mode] == [True, True, False]
    assert Mode.ALLOWLIST.label(3) == "allowlist: 3 allowed hosts" and "any public host" in Mode.OPEN.label(0)
    Mode.ALLOWLIST.admit("pypi.org", 443, rules)
    Mode.OPEN.admit("example.com", 80, ())
    with pytest.raises(Refused, match="not in the allowlist"):
        Mode.ALLOWLIST.admit("example.com", 443, rules)
    with pytest.raises(Refused, match="no network"):
        Mode.NONE.admit("pypi.org", 443, rules)


@pytest.mark.parametrize("entry", ["*", "*.com", "http://x.com", "x.com:99999", "10.0.0.1", "a b"])
def test_bad_allowlist_entries_name_the_source(entry: str) -> None:
    with pytest.raises(VmsandboxError, match=r"proj\.yaml"):
        parse_rule(entry, source="proj.yaml")


def test_parse_target() -> None:
    assert netpolicy.parse_target("Example.com:8443") == ("example.com", 8443)
    assert netpolicy.parse_target("example.com", default_port=80) == ("example.com", 80)
    for bad in ("example.com", "example.com:0", "example.com:x", "[::1]:443"):
        with pytest.raises(Refused):
            netpolicy.parse_target(bad)


def test_request_heads() -> None:
    head = httphead.parse_request(
        b"GET http://a.example/x HTTP/1.1\r\nHost: a.example\r\nConnection: keep-alive, X-Y\r\n"
        b"X-Y: 1\r\nProxy-Authorization: p\r\nAccept: */*\r\n\r\n"
    )
    assert head.method == "GET" and head.target == "http://a.example/x"
    assert httphead.forward_headers(head, "a.example") == [
        ("Host", "a.example"),
        ("Accept", "*/*"),
        ("Connection", "close"),
    ]
    for bad in (
        b"GET / HTTP/1.1\r\n",
        b"GET  / HTTP/1.1\r\n\r\n",
        b"GET / HTTP/2\r\n\r\n",
        b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n",
        b"GET / HTTP/1.1\r\nX: a\rb\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * 101 + b"\r\n",
    ):
        with pytest.raises(httphead.ProtocolError):
            httphead.parse_request(bad)


def test_client_hello_parser_rejects_garbage() -> None:
    for bad in (b"\x17\x03\x01\x00\x05hello", b"\x16\x03\x01\x00\x00", b"\x16\x03\x01\x00\x04\x02\x00\x00\x00"):
        with pytest.raises(tlshello.HelloError):
            tlshello.needed(bad)
    assert tlshello.needed(b"\x16\x03\x01") == 0  # not enough yet


def _hello(extensions: list[tuple[int, bytes]]) -> bytes:
    def vec(n: int, data: bytes) -> bytes:
        return len(data).to_bytes(n, "big") + data

    body = b"\x03\x03" + bytes(32) + vec(1, b"") + vec(2, b"\x13\x01") + vec(1, b"\x00")
    body += vec(2, b"".join(kind.to_bytes(2, "big") + vec(2, data) for kind, data in extensions))
    handshake = b"\x01" + vec(3, body)
    return b"\x16\x03\x01" + vec(2, handshake)


def test_an_encrypted_client_hello_is_refused_whatever_its_outer_name() -> None:
    """With ECH the SNI in the clear is a decoy public name: an allowed one would carry TLS to any host."""
    name = b"api.anthropic.com"
    entry = b"\x00" + len(name).to_bytes(2, "big") + name  # host_name
    sni_ext = (0x0000, len(entry).to_bytes(2, "big") + entry)
    assert tlshello.server_name(_hello([sni_ext])) == "api.anthropic.com"
    for kind in (0xFE0D, 0xFFCE):
        with pytest.raises(tlshello.HelloError, match="hides the real server name"):
            tlshello.server_name(_hello([sni_ext, (kind, b"\x00" * 40)]))


def test_allowlist_changes_at_runtime() -> None:
    from vmsandbox.egress import policy
    from vmsandbox.errors import VmsandboxError

    data: dict[str, Any] = {"allow": ["github.com", "api.example.com:443", "*.npmjs.org"]}
    assert policy.allowed_more(data, ["crates.io", "GitHub.com", "crates.io"]) == ["crates.io"]
    assert data["allow"][-1] == "crates.io"
    with pytest.raises(VmsandboxError, match="IP literal"):
        policy.allowed_more(data, ["10.0.0.1"])
    assert policy.allowed_less(data, ["api.example.com"], session="s") == ["api.example.com:443"]  # and its ports
    with pytest.raises(VmsandboxError, match=r"registry\.npmjs\.org is not in the allowlist of session s; \*\.npmjs"):
        policy.allowed_less(data, ["registry.npmjs.org"], session="s")
    assert data["allow"] == ["github.com", "*.npmjs.org", "crates.io"]


def test_a_refusal_names_the_command_that_allows_it() -> None:
    p = Policy(Mode.ALLOWLIST, (), session="exp1")
    with pytest.raises(Refused, match=r"`vmsandbox policy allow exp1 example\.com`"):
        p.decide("example.com", 443)


@pytest.mark.parametrize(
    "port", ["\u00b2", "\u00b9", "\u0663", "\uff14\uff14\uff13", "0", "65536", "+443", " 443", "44 3", "0x1bb"]
)
def test_a_port_is_ascii_digits_only(port: str) -> None:
    """str.isdigit() takes "²" (and other scripts' digits), which int() then refuses: a ValueError that escaped
    the proxy left the connection open, unanswered and unlogged. Such a port is a refusal like any other."""
    with pytest.raises(Refused, match="bad port"):
        netpolicy.parse_target(f"allowed.example:{port}")
    with pytest.raises(VmsandboxError, match="bad port"):
        parse_rule(f"allowed.example:{port}", source="t")
    assert netpolicy.parse_target("allowed.example:443") == ("allowed.example", 443)


@pytest.mark.parametrize("host", ["_outbound", "_gateway", "_localdnsstub", "myhost", "jenkins", "ai"])
def test_a_single_label_name_is_refused_in_every_mode_and_allowlist(host: str) -> None:
    """nss-myhostname answers `_outbound` with the host's own address and `_gateway` with its router; a single
    label otherwise means the host's own name, /etc/hosts or a search domain's internal host."""
    for policy in (
        Policy(Mode.OPEN),
        Policy(Mode.ALLOWLIST, (parse_rule(host, source="t"), parse_rule(f"{host}:8080", source="t"))),
    ):
        for port in (80, 443, 8080):
            with pytest.raises(Refused, match="single-label name"):
                policy.decide(host, port)


WIDE = (ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0"))  # `any_network`: every address allowed


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("64:ff9b::7f00:1", "NAT64 address wrapping 127.0.0.1"),
        ("64:ff9b::a9fe:a9fe", "NAT64 address wrapping 169.254.169.254"),
        ("64:ff9b:1:7f00:0:100::", "NAT64 address (/48) wrapping 127.0.0.1"),
        ("2002:7f00:1::", "6to4 address wrapping 127.0.0.1"),
        ("2002:a9fe:a9fe::1", "6to4 address wrapping 169.254.169.254"),
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", "Teredo"),
        ("2001::1", "Teredo"),
        ("::ffff:127.0.0.1", "IPv4-mapped address wrapping 127.0.0.1"),
        ("::ffff:0:a9fe:a9fe", "IPv4-translated address wrapping 169.254.169.254"),
        ("::7f00:1", "IPv4-translated address wrapping 127.0.0.1"),
    ],
)
def test_a_wrapping_of_a_never_allowed_address_is_never_allowed(address: str, why: str) -> None:
    """NAT64, 6to4, Teredo and mapped spellings of loopback and metadata addresses: no allowed network lifts
    them (the networks here allow everything, as `any_network` does), whatever their wrapper is."""
    ip = ipaddress.ip_address(address)
    reason = addresses.address_why(ip)
    assert reason is not None and reason.hard and why in reason.text
    wrapper = ipaddress.ip_network(f"{address}/{16 if address.startswith('200') else 96}", strict=False)
    with pytest.raises(Refused, match=re.escape(why)):
        check_addresses("wrapped.example", [address], [*WIDE, wrapper])


def test_a_wrapping_of_a_private_address_is_as_private_as_it() -> None:
    """What a wrapper carries decides: a NAT64 spelling of 10.0.0.1 is private (an allowed network may lift it),
    of a public address it is not hard either."""
    why = addresses.address_why(ipaddress.ip_address("64:ff9b::a00:1"))
    assert why is not None and not why.hard and "10.0.0.1" in why.text
    assert check_addresses("nat64.example", ["64:ff9b::a00:1"], [ipaddress.ip_network("64:ff9b::/96")])


def test_the_hosts_own_addresses_are_refused_whatever_is_allowed() -> None:
    """The host's own public address (or SLAAC IPv6 address) goes through its own stack to whatever listens on
    0.0.0.0 or `::`: refused in every mode and under every allowed network. The test says which addresses are
    the host's (an injected check, as the kernel's routing says it in the product)."""
    own = {"198.51.100.7", "2001:db8:1::5", "93.184.215.14"}

    def mine(ip: IPAddress) -> str | None:
        return "one of this host's own addresses" if str(ip) in own else None

    for answer in sorted(own):
        with pytest.raises(Refused, match="this host's own"):
            addresses.check_addresses("me.example", [answer], WIDE, own=mine)
    with pytest.raises(Refused, match="this host's own"):  # one own answer among public ones: refused whole
        addresses.check_addresses("me.example", ["1.1.1.1", "93.184.215.14"], (), own=mine)
    assert addresses.check_addresses("them.example", ["1.1.1.1"], (), own=mine) == [ipaddress.ip_address("1.1.1.1")]


def test_framing_is_decided_before_any_header_is_dropped() -> None:
    """`Connection: content-length` once dropped the body's length before it went upstream: the body then
    read as a second request, with its own Host. The head sent up carries the framing the guest's head had."""
    head = httphead.parse_request(
        b"POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\nConnection: content-length, host, x-y\r\n"
        b"Content-Length: 5\r\nX-Y: 1\r\n\r\n"
    )
    assert head.body == httphead.Body(5, stated=True)
    assert httphead.forward_headers(head, "a.example") == [
        ("Host", "a.example"),
        ("Content-Length", "5"),
        ("Connection", "close"),
    ]
    chunked = httphead.parse_request(
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: transfer-encoding\r\n\r\n"
    )
    assert ("Transfer-Encoding", "chunked") in httphead.forward_headers(chunked, "a.example")


@pytest.mark.parametrize(
    "head",
    [
        b"POST / HTTP/1.1\r\nContent-Length: \xc2\xb2\r\n\r\n",  # "²", UTF-8
        b"POST / HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n",  # "²", Latin-1
        b"POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n",
        b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"CONNECT a.example:443 HTTP/1.1\r\nContent-Length: 5\r\n\r\n",
        b"GET / HTTP/1.1\n\r\n\r\n",
    ],
)
def test_a_framing_two_parsers_could_read_differently_is_refused(head: bytes) -> None:
    with pytest.raises(httphead.ProtocolError):
        httphead.parse_request(head)
