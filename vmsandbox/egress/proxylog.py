"""A session's proxy log: one JSON object per connection, written by the proxy (fields capped, the file
rotated, private) and read for people by `vmsandbox policy log NAME`."""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vmsandbox import ui

MAX_FIELD = 256  # characters of any text field in a log line (the guest chooses most of them)
MAX_LOG_BYTES = 8 * 1024**2  # the proxy log is rotated to <log>.1 beyond this (one old generation kept)


@dataclass
class Event:
    """One connection, as logged."""

    start: float = field(default_factory=time.monotonic)
    ts: float = field(default_factory=time.time)
    decision: str = "error"
    method: str | None = None
    target: str | None = None  # as the guest wrote it (truncated)
    host: str | None = None
    port: int | None = None
    reason: str | None = None
    tls: str | None = None  # passthrough | terminated
    secret: str | None = None
    up: int = 0  # bytes from the guest
    down: int = 0  # bytes to the guest
    answered: bool = False  # the guest reads a tunnel or an answer now: no refusal in plain HTTP can follow

    def record(self) -> dict[str, Any]:
        """The log line's fields; text the guest chose (targets, names, reasons quoting them) is capped."""
        data = {
            k: (v[:MAX_FIELD] + "…" if isinstance(v, str) and len(v) > MAX_FIELD else v)
            for k, v in self.__dict__.items()
            if k not in ("start", "answered") and v is not None
        }
        data["ms"] = round((time.monotonic() - self.start) * 1000)
        return data


def rotated(log_file: Path) -> Path:
    """Where the previous generation of a rotated log lives."""
    return log_file.with_name(log_file.name + ".1")


class Writer:
    """The log open for appending, with its previous generation: the daemon opens one before it drops root and
    writes through it for good, so the log is rotated in place (copied to <log>.1, then emptied) under an
    exclusive flock, never renamed (a new file would be one the daemon cannot open)."""

    def __init__(self, log_file: Path) -> None:
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        self.fd = os.open(log_file, flags | os.O_APPEND, 0o600)
        try:
            self.older = os.open(rotated(log_file), flags, 0o600)
        except OSError:
            os.close(self.fd)
            raise
        self._lock = threading.Lock()  # flock excludes other processes only: the daemon writes from two threads

    def append(self, ev: Event) -> None:
        """One line for one connection; the log is rotated first when it would grow past MAX_LOG_BYTES."""
        line = (json.dumps(ev.record(), sort_keys=True) + "\n").encode()
        with self._lock:
            self._append(line)

    def _append(self, line: bytes) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            if os.fstat(self.fd).st_size + len(line) > MAX_LOG_BYTES:
                os.ftruncate(self.older, 0)
                offset = 0
                while chunk := os.pread(self.fd, 1 << 16, offset):
                    offset += os.pwrite(self.older, chunk, offset)
                os.ftruncate(self.fd, 0)
            os.write(self.fd, line)
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def close(self) -> None:
        os.close(self.fd)
        os.close(self.older)


def append(log_file: Path | Writer, ev: Event) -> None:
    """One line for one connection, through the daemon's Writer or (a command's line) the file opened for it."""
    if isinstance(log_file, Writer):
        log_file.append(ev)
        return
    writer = Writer(log_file)
    try:
        writer.append(ev)
    finally:
        writer.close()


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
    if decision == "policy":  # `vmsandbox policy allow` / `deny` changed the allowlist
        return f"{when}  [cyan]POLICY[/] {ui.printable(str(event.get('reason', '')))}"
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


def read(path: Path, *, follow: bool, stopped: Callable[[], bool] = lambda: False, offset: int = 0) -> Iterator[str]:
    """The log's lines (from byte `offset`); with follow, keep waiting for new ones until `stopped()` (Ctrl-C
    ends it too)."""
    try:
        f = path.open(errors="replace")
        f.seek(offset)
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
            if os.fstat(f.fileno()).st_size < f.tell():  # rotated in place: it starts again
                f.seek(0)
                pending = ""
            time.sleep(0.3)
