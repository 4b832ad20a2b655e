"""A session's console tail and egress decisions for the page (polled; the page shows them as text only), and
the runtime egress actions the CLI has (`allow`, `deny`)."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from vmsandbox import ui
from vmsandbox.errors import VmsandboxError

TAIL = 200  # lines of each log sent to the page


def tail(name: str, which: str) -> dict[str, Any]:
    """The last lines of a session's console, or its last egress decisions as fields."""
    from vmsandbox.egress import log as proxylog
    from vmsandbox.session import state
    from vmsandbox.session.record import Record

    record = Record.load(name)
    if which == "console":
        state.refresh_console(record, follow=False)
        return {"lines": [ui.visible(line) for line in state.console_tail(name, TAIL).splitlines()]}
    if which != "proxy":
        raise VmsandboxError(f"unknown log {which!r}", hint="available: console, proxy")
    events: deque[dict[str, Any]] = deque(maxlen=TAIL)
    for line in proxylog.read(record.files.proxy_log, follow=False):
        event = proxylog.parse(line)
        if event is not None:
            events.append(event)
    return {"events": [_fields(e) for e in events]}


def _fields(event: dict[str, Any]) -> dict[str, str]:
    target = f"{event['host']}:{event.get('port', '?')}" if "host" in event else str(event.get("target", "?"))
    fields = {
        "time": time.strftime("%H:%M:%S", time.localtime(float(event.get("ts", 0)))),
        "decision": str(event.get("decision", "?")),
        "method": str(event.get("method", "-")),
        "target": target,
        "reason": str(event.get("reason") or ""),
    }
    return {k: ui.visible(v) for k, v in fields.items()}  # the guest's words, as their characters are


def act(name: str, action: str, value: str) -> list[str]:
    """What the CLI's `allow`, `deny` and `port publish|unpublish` do, for a running session: hosts
    (space-separated) or a port (`[HOST_PORT:]GUEST_PORT`, on loopback)."""
    from vmsandbox.session.options import parse_publish
    from vmsandbox.session.running import reach as runtime

    entries = value.split()
    if not entries:
        raise VmsandboxError("name a host or a port", hint="e.g. pypi.org, *.example.com, 3000 or 8080:3000")
    if action == "allow":
        return runtime.allow(name, entries)
    if action == "deny":
        return runtime.deny(name, entries)
    if action in ("publish", "unpublish"):
        wanted = parse_publish(entries[0], None)
        if action == "publish":
            return runtime.publish(name, wanted).places()
        return [p for gone in runtime.unpublish(name, wanted.guest, wanted.host) for p in gone.places()]
    raise VmsandboxError(f"unknown action {action!r}", hint="allow, deny, publish or unpublish")
