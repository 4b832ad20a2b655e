"""A session's console tail and egress decisions for the page (polled; the page shows them as text only), and
the runtime egress actions the CLI has (`allow`, `deny`)."""

from __future__ import annotations

import time
from typing import Any

from vmsandbox import ui
from vmsandbox.core import listing, watch
from vmsandbox.errors import VmsandboxError

TAIL = 200  # lines of each log sent to the page
# of each log (and of its rotated part) read at each poll, at most: the guest writes its console, and may write one
# line of megabytes; an egress decision is a line of at most a few KiB (its fields cut where the proxy writes them)
CONSOLE_BYTES, PROXY_BYTES = 64 * 1024, 512 * 1024


def tail(name: str, which: str) -> dict[str, Any]:
    """The last lines of a session's console, or its last egress decisions as fields (read as the terminal's `logs`
    and `policy log` read them: the rotated part first, a line still being written not yet)."""
    if which == "console":
        said = listing.console(name, follow=False, tail=TAIL, most_bytes=CONSOLE_BYTES)
        return {"lines": [ui.visible(line.rstrip("\r")) for line in said]}
    if which != "proxy":
        raise VmsandboxError(f"unknown log {which!r}", hint="available: console, proxy")
    events = listing.proxy(name, follow=False, tail=TAIL, since=None, most_bytes=PROXY_BYTES)
    return {"events": [_fields(e) for _, e in events]}


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
    entries = value.split()
    if not entries:
        raise VmsandboxError("name a host or a port", hint="e.g. pypi.org, *.example.com, 3000 or 8080:3000")
    if action == "allow":
        return watch.allow(name, entries)
    if action == "deny":
        return watch.deny(name, entries)
    if action == "publish":
        return watch.publish(name, entries[0]).places()
    if action == "unpublish":
        return [p for gone in watch.unpublish(name, entries[0]) for p in gone.places()]
    raise VmsandboxError(f"unknown action {action!r}", hint="allow, deny, publish or unpublish")
