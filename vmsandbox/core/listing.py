"""What is known of sessions, for every front end: every session as a row (`ls`), one in full (`inspect`), the
ssh config an editor reaches one with, its logs (the console, the egress decisions) and the names a command
line may take (sessions, fan-outs, checkpoints). Reading only: nothing here changes a session."""

from __future__ import annotations

import collections
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import vmsandbox.session.record
from vmsandbox import paths
from vmsandbox.document import FileError
from vmsandbox.egress import proxylog
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest import ssh
from vmsandbox.session import settings, state
from vmsandbox.session.place import checkpoints
from vmsandbox.session.record import Record, State, readable
from vmsandbox.session.state import Status
from vmsandbox.sync.provenance import steps, store
from vmsandbox.sync.provenance.model import BOUNDS

__all__ = ["State", "Status"]  # (a session's state, and a session with its state, as statuses() gives them)
DAMAGED = "damaged"  # the state of a session whose record cannot be read
STATES = (*(s.value for s in State), DAMAGED)  # every state `ls` shows
REACHABLE = ("running", "paused", "booting")  # the states in which the session's SSH port answers
EDITOR_OPTIONS = (  # of the session's own ssh options, what an editor's client needs (not our control socket)
    "HostName", "Port", "User", "IdentityFile", "IdentitiesOnly", "UserKnownHostsFile", "GlobalKnownHostsFile",
    "StrictHostKeyChecking", "HostKeyAlgorithms", "CheckHostIP", "PasswordAuthentication",
    "KbdInteractiveAuthentication", "ForwardAgent", "ForwardX11", "ServerAliveInterval", "ServerAliveCountMax",
)  # fmt: skip


def names() -> list[str]:
    """Every session of this account, by name (read from its directory: no libvirt, no guest)."""
    return vmsandbox.session.record.names()


def groups() -> list[str]:
    """The fan-outs whose sessions are still here."""
    return sorted({r.group for r in readable() if r.group})


def in_state(*states: str) -> list[str]:
    """The sessions in one of `states` (asked of libvirt)."""
    return [s.record.name for s in statuses() if s.state.value in states]


def statuses() -> list[Status]:
    """Every session whose record reads, with its state (asked of libvirt): for a front end that shows sessions
    in types of its own (the API)."""
    return state.all_status(settings.load().libvirt_uri)


def rows(broken: list[str] | None = None) -> list[dict[str, Any]]:
    """Every session as `ls --json` gives it; a damaged one with its state `damaged` and its problem. Given
    `broken`, a config with problems is read as far as it passes and its problems said there, a line each (the
    listing goes on with what passes)."""
    if broken is None:
        uri = settings.load().libvirt_uri
    else:
        loaded, problems = settings.load_lenient()
        uri = loaded.libvirt_uri
        broken += [f"{e.brief()}; `vmsandbox config validate` lists them" if isinstance(e, FileError) else e.message
                   for e in problems]  # fmt: skip
    found, damaged = state.listing(uri)
    listed = [s.as_dict() for s in found]
    for r in listed:
        if r["state"] not in REACHABLE:
            r["ports"] = {**r["ports"], "ssh": None}  # an exited VM's port is another program's now
    return [*listed, *(d.as_dict() for d in damaged)]


def inspect(name: str) -> dict[str, Any]:
    """Everything known of one session: its row, its checkpoints, its files and how to reach it."""
    record = Record.load(name)  # a missing or damaged session: its error, with its hint
    row = next((r for r in rows() if r["name"] == name), None)
    if row is None:
        raise VmsandboxError(f"no session named {name!r}", hint="list sessions with `vmsandbox ls`")
    files = record.files
    reachable = row["state"] in REACHABLE
    return {
        **row,
        "checkpoints": [c.label for c in checkpoints.listed(files)],
        "files": {
            "directory": str(files.root),
            "console_log": str(files.console_log),
            "ssh_config": str(files.ssh_config) if reachable else None,
        },
        "user": record.user,
        "stopped_by": record.stop_note or None,  # why it was stopped when no person stopped it (the memory guard)
        # who made each change: the steps the host kept, and what the guest's journal holds for it (its figures
        # when a review last asked, the guest's word) against the bounds it keeps to
        "provenance": {"steps": len(steps.read(files)), "journal": _journal_use(files.root)},
        # the file its RAM maps copy-on-write, shared with every session that maps it, else why it is its own;
        # and while it runs, what its QEMU takes: resident, proportional, shared with other sessions, private
        "memory": {
            "shared_from": record.memory,
            "note": record.memory_note or None,
            # what the kernel lets its QEMU hold at most (its cgroup's limit), else why it is unbounded
            "limit_mib": record.memory_limit_mib,
            "limit_note": record.memory_limit_note or None,
            **((state.memory_use(record) or {}) if reachable else {}),
        },
        # the account its QEMU runs as: its own (none other reaches its files or processes), or libvirt's
        "qemu_account": record.account if record.account is not None else "libvirt's QEMU account (shared)",
    }


def _journal_use(root: Path) -> str:
    """What the guest's journal holds for provenance, against its bounds, as it said when a review last asked."""
    found = store.usage(root)
    if not found:
        return "not asked yet (a review asks)"
    said = [f"{found[k]:,} of {bound:,} {k.replace('_', ' ')}" for k, bound in BOUNDS.items() if k in found]
    return ", ".join(said) + " (as the guest said at the last review)"


def ssh_config(name: str) -> str:
    """A `Host vmsandbox-NAME` block for ~/.ssh/config: the session's port, key and pinned host key."""
    options = Record.load(name).endpoint().ssh_options()
    lines = [f"Host {ssh.host_alias(name)}", *(f"    {k} {options[k]}" for k in EDITOR_OPTIONS)]
    return "\n".join(lines) + "\n"


def labels(name: str) -> list[str]:
    """A session's checkpoints, oldest first, by label (its files only)."""
    return [c.label for c in checkpoints.listed(paths.session_paths(name))]


def console(name: str, *, follow: bool, tail: int | None, most_bytes: int | None = None) -> Iterator[str]:
    """A session's serial console, its lines as the guest wrote them (brought up to date first): the terminal's
    `logs` and the page's live view read it here (`most_bytes`: see `lines`)."""
    record = Record.load(name)
    state.refresh_console(record, follow=follow)
    if not follow and not record.files.console_log.exists():
        raise VmsandboxError(f"session {name} has no console log yet")
    return lines(record.files.console_log, None, follow=follow, stopped=_gone(record), tail=tail, most_bytes=most_bytes)


def proxy(
    name: str, *, follow: bool, tail: int | None, since: float | None, most_bytes: int | None = None
) -> Iterator[tuple[str, dict[str, Any]]]:
    """A session's egress decisions, oldest first, each as its JSON line and as data: every allowed or denied
    request and every change of its allowlist (with `since`, only those at that time or later). The terminal's
    `policy log` and the page's live view read them here."""
    record = Record.load(name)
    path = record.files.proxy_log
    if not follow and not path.exists():
        return iter(())
    found = lines(path, proxylog.rotated(path), follow=follow, stopped=_gone(record), tail=tail, most_bytes=most_bytes)
    return ((line, event) for line in found if (event := proxylog.parse(line)) is not None and after(event, since))


def after(event: dict[str, Any], since: float | None) -> bool:
    return since is None or float(event.get("ts", 0)) >= since


def describe(event: dict[str, Any]) -> str:
    """An egress decision in one line, as a person reads it."""
    return proxylog.describe(event)


def _gone(record: Record) -> Callable[[], bool]:
    return lambda: not record.files.record.exists()


def lines(
    path: Path,
    older: Path | None,
    *,
    follow: bool,
    stopped: Callable[[], bool],
    tail: int | None,
    most_bytes: int | None = None,
) -> Iterator[str]:
    """A log's lines (its rotated part first, when not following), the last `tail` of them only, then with
    `follow` the new ones as they come. `most_bytes`: with `tail`, read no more than the end of each part (the
    guest writes the console: a page that polls reads a bounded end, as the console's own tail does)."""
    if tail is None:
        if older is not None and older.exists() and not follow:
            yield from proxylog.read(older, follow=False)
        yield from proxylog.read(path, follow=follow, stopped=stopped)
        return
    start, text = _end_of(path, most_bytes)
    whole = text[: text.rfind(b"\n") + 1]  # a line being written is read when it ends
    last: collections.deque[str] = collections.deque(maxlen=tail)
    if older is not None and older.exists():
        if most_bytes is None:
            last.extend(proxylog.read(older, follow=False))
        else:
            before = _end_of(older, most_bytes)[1]
            last.extend(before[: before.rfind(b"\n") + 1].decode(errors="replace").splitlines())
    last.extend(whole.decode(errors="replace").splitlines())
    yield from last
    if follow:
        yield from proxylog.read(path, follow=True, stopped=stopped, offset=start + len(whole))


def _end_of(path: Path, most: int | None) -> tuple[int, bytes]:
    """The last `most` bytes of a file (all of it: None) from the first whole line in them, and where they start."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            start = 0 if most is None else max(0, size - most)
            f.seek(start)
            text = f.read(size - start)
    except FileNotFoundError:
        return 0, b""
    if start > 0:  # (a line cut by the window is not shown)
        cut = text.find(b"\n") + 1
        start, text = start + cut, text[cut:] if cut else b""
    return start, text
