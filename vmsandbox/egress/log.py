"""Reading a session's proxy log (one JSON object per line) for people: `vmsandbox logs NAME proxy`."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from vmsandbox import ui


def parse(line: str) -> dict[str, Any] | None:
    try:
        data = json.loads(line)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _size(n: int) -> str:
    for unit, size in (("MB", 1_000_000), ("kB", 1000)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def describe(event: dict[str, Any]) -> str:
    """One readable line (rich markup; guest-chosen text escaped)."""
    when = time.strftime("%H:%M:%S", time.localtime(float(event.get("ts", 0))))
    decision = str(event.get("decision", "?"))
    colour = {"allow": "green", "deny": "red"}.get(decision, "yellow")
    target = f"{event['host']}:{event.get('port', '?')}" if "host" in event else str(event.get("target", "?"))
    parts = [
        when,
        f"[{colour}]{decision.upper():5}[/]",
        ui.printable(f"{event.get('method', '-'):14} {target}"),
    ]
    if decision == "allow":
        parts.append(f"↑{_size(int(event.get('up', 0)))} ↓{_size(int(event.get('down', 0)))}")
    parts.append(f"{int(event.get('ms', 0)) / 1000:.1f}s")
    if event.get("tls") == "terminated":
        parts.append(f"[cyan]secret {ui.printable(str(event.get('secret') or '-'))}[/]")
    if event.get("reason"):
        parts.append(f"[dim]{ui.printable(str(event['reason']))}[/]")
    return "  ".join(parts)


def read(path: Path, *, follow: bool, stopped: Callable[[], bool] = lambda: False) -> Iterator[str]:
    """The log's lines; with follow, keep waiting for new ones until `stopped()` (Ctrl-C ends it too)."""
    try:
        f = path.open(errors="replace")
    except FileNotFoundError:
        if not follow:
            return
        while not path.exists():
            if stopped():
                return
            time.sleep(0.5)
        f = path.open(errors="replace")
    with f:
        pending = ""
        while True:
            chunk = f.readline()
            if chunk:
                pending += chunk
                if pending.endswith("\n"):
                    yield pending.rstrip("\n")
                    pending = ""
                continue
            if not follow or stopped():
                return
            time.sleep(0.3)
