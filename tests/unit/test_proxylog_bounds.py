"""The proxy log is bounded: capped fields, a rotated file, private modes (no sockets, no subprocesses)."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest

from vmsandbox.egress import proxylog
from vmsandbox.egress.policy import ProxyConfig
from vmsandbox.egress.proxylog import Event
from vmsandbox.egress.relay.proxy import Proxy
from vmsandbox.egress.rules.addresses import address_reason


def test_fields_are_capped() -> None:
    ev = Event(method="CONNECT", target="t" * 10_000, reason="r" * 10_000, host="h" * 300)
    rec = ev.record()
    assert all(len(v) <= proxylog.MAX_FIELD + 1 for v in rec.values() if isinstance(v, str))


def test_the_log_rotates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(proxylog, "MAX_LOG_BYTES", 10_000)
    log = tmp_path / "proxy.jsonl"
    p = Proxy(lambda: ProxyConfig(policy=None), log, lambda _n: None, lambda: None)  # type: ignore[arg-type]
    for i in range(300):
        p._log(Event(method="CONNECT", target=f"host{i}.example:443", reason="x" * 200))
    assert log.stat().st_size <= 10_000
    assert proxylog.rotated(log).stat().st_size <= 10_000
    assert log.stat().st_mode & 0o077 == 0
    last = json.loads(log.read_text().splitlines()[-1])
    assert last["target"] == "host299.example:443"


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("fec0::1", "site-local"),
        ("64:ff9b::7f00:1", "NAT64"),  # 127.0.0.1 through a NAT64 gateway
        ("64:ff9b::a00:1", "NAT64"),  # 10.0.0.1
        ("::ffff:169.254.169.254", "metadata"),
    ],
)
def test_addresses_that_are_not_public(address: str, why: str) -> None:
    assert why in (address_reason(ipaddress.ip_address(address)) or "")


def test_what_the_guest_chose_is_never_raw_in_the_logs_people_read(tmp_path: Path) -> None:
    """`vmsandbox logs NAME proxy` shows every line through describe() (escaped) or, with --json, as written
    (JSON escapes control characters): an OSC 52 clipboard write in a target or reason never reaches a terminal."""
    hostile = "x\x1b]52;c;Y3VybCBldmlsIHwgc2g=\x07\x1b[2J\x9b31m"
    log = tmp_path / "proxy.jsonl"
    proxylog.append(log, Event(decision="deny", method=hostile, target=hostile, reason=hostile))
    (line,) = log.read_text().splitlines()
    shown = proxylog.describe(proxylog.parse(line) or {})
    for text in (line, shown):
        assert not any(c in text for c in "\x1b\x07\x9b"), text
