"""A running session as a person watches and steers it while it works: its console's last lines, its egress
decisions, and what may change without a restart (hosts allowed or denied, ports published). The page polls
these; the terminal's `logs`, `allow`, `deny` and `port` do the same things."""

from __future__ import annotations

from collections import deque
from typing import Any

from vmsandbox.egress import log as proxylog
from vmsandbox.session import state
from vmsandbox.session.options import parse_publish
from vmsandbox.session.record import Record
from vmsandbox.session.running import reach


def console(name: str, lines: int) -> list[str]:
    """The last `lines` of the session's serial console (the guest's bytes, as text: show them with care)."""
    record = Record.load(name)
    state.refresh_console(record, follow=False)
    return state.console_tail(name, lines).splitlines()


def egress(name: str, events: int) -> list[dict[str, Any]]:
    """The session's last `events` egress decisions, each as the proxy logged it (its fields are the guest's
    words in part: show them with care)."""
    record = Record.load(name)
    found: deque[dict[str, Any]] = deque(maxlen=events)
    for line in proxylog.read(record.files.proxy_log, follow=False):
        event = proxylog.parse(line)
        if event is not None:
            found.append(event)
    return list(found)


def allow(name: str, hosts: list[str]) -> list[str]:
    """Let the running session reach these hosts too; the allowlist after."""
    return reach.allow(name, hosts)


def deny(name: str, hosts: list[str]) -> list[str]:
    """Take these hosts off the running session's allowlist; the allowlist after."""
    return reach.deny(name, hosts)


def publish(name: str, spec: str) -> list[str]:
    """Publish a guest port (`[HOST_PORT:]GUEST_PORT`) on loopback while the session runs; where it is now."""
    return reach.publish(name, parse_publish(spec, None)).places()


def unpublish(name: str, spec: str) -> list[str]:
    """Stop publishing a guest port; where it was."""
    wanted = parse_publish(spec, None)
    return [p for gone in reach.unpublish(name, wanted.guest, wanted.host) for p in gone.places()]
