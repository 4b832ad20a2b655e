"""What each MCP tool does, over the core: the API's side of it (core.sandbox.backend, the one implementation of
sessions, processes, files, checkpoints and reviews that E2B's SDK drives too), so a session an agent makes here
is one a person sees in `vmsandbox ls` and a program in the API, under the same rules (core.sessions.not_driven
and all). Every value in is checked by the core's own types (core.sandbox.names); every value out is plain
data, guest text escaped and bounded (shown.py). Calls block: the server runs each in a worker thread.

Nothing here widens a session's egress, publishes a port, adds a secret, trusts a project or applies a change:
those are a person's (person.py asks, for an apply)."""

from __future__ import annotations

import io
import math
import posixpath
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from vmsandbox.core import flow, listing, moments, sessions, watch
from vmsandbox.core.person import FanOutcome, Finding, Nobody
from vmsandbox.core.sandbox import model
from vmsandbox.core.sandbox.backend import SessionBackend
from vmsandbox.core.sandbox.interface import TooLargeError
from vmsandbox.core.sandbox.names import (
    BlueprintName,
    CheckpointLabel,
    GuestPath,
    InvalidError,
    ProjectPath,
    SessionName,
    Token,
    fresh_name,
)
from vmsandbox.core.views import Decisions, Outcome, Plan
from vmsandbox.mcp import shown

DEFAULT_BLUEPRINT = "base"
MOST_FILE = 1 << 20  # bytes of a file read_file returns (a model reads text; more is cut and said so)
MOST_WRITE = 8 << 20  # bytes write_file takes
MOST_WAIT = 600.0  # seconds run_command waits for a command in the foreground, at most
MOST_ENTRIES = 500
MOST_FANOUT = 8  # sessions of one fan-out an agent starts
MOST_ROWS = 500  # paths of a comparison
TAIL = 200


def _name(session: str) -> SessionName:
    return SessionName(session)


def bounded(value: float, low: float, high: float, what: str) -> float:
    """`value` within [low, high]; one that is no number (NaN, infinity) is refused."""
    if not math.isfinite(value):
        raise InvalidError(f"{what} {value!r} is not a number of seconds", hint=f"give {low:g} to {high:g}")
    return min(max(value, low), high)


def sandbox(found: model.Sandbox) -> dict[str, Any]:
    return {
        "name": found.name.value, "state": found.state.value, "blueprint": found.blueprint,
        "project": found.project, "started_at": found.started_at.isoformat(), "cpus": found.cpus,
        "memory_mib": found.memory_mib,
    }  # fmt: skip


class Tools:
    """The tools' work, one method each, over one backend (the core's, or a stand-in in the unit tests)."""

    def __init__(self, backend: SessionBackend | None = None) -> None:
        self.backend = backend or SessionBackend()

    # -- sessions ------------------------------------------------------------------------------------------------
    def list_sessions(self) -> list[dict[str, Any]]:
        return [sandbox(s) for s in self.backend.sandboxes()]

    def create_session(self, project: str | None, blueprint: str | None, name: str | None) -> dict[str, Any]:
        spec = model.SandboxSpec(
            name=_name(name) if name else fresh_name("mcp"),
            blueprint=BlueprintName(blueprint or DEFAULT_BLUEPRINT),
            project=None if project is None else ProjectPath(Path(project)),
            end_at=model.NO_END,
        )
        return sandbox(self.backend.create(spec))

    def fork_session(self, session: str, checkpoint: str | None, name: str | None) -> dict[str, Any]:
        label = CheckpointLabel(checkpoint) if checkpoint else None
        new = _name(name) if name else fresh_name(session)
        return sandbox(self.backend.fork(_name(session), label, new, model.NO_END))

    def stop_session(self, session: str) -> dict[str, Any]:
        self.backend.pause(_name(session))
        return sandbox(self.backend.sandbox(_name(session)))

    def start_session(self, session: str) -> dict[str, Any]:
        return sandbox(self.backend.resume(_name(session)))

    def remove_session(self, session: str) -> dict[str, Any]:
        """Ended as `vmsandbox rm --force` ends one: its unreviewed changes wait in its outbox for the person."""
        self.backend.kill(_name(session))
        note = f"changes not applied yet wait in its outbox: the person reviews them with `vmsandbox pull {session}`"
        return {"removed": session, "note": note}

    # -- commands ------------------------------------------------------------------------------------------------
    def run_command(
        self,
        session: str,
        command: str,
        background: bool,
        timeout_seconds: float,
        workdir: str | None,
        started: Callable[[int], None] = lambda pid: None,
    ) -> dict[str, Any]:
        """`command` started in the session (its pid handed to `started` at once: whoever must end it on a cancel
        knows it), and in the foreground waited for."""
        name = _name(session)
        if not command.strip():
            raise InvalidError("an empty command", hint="give a shell command line, e.g. `make test`")
        timeout = bounded(float(timeout_seconds), 1.0, MOST_WAIT, "timeout_seconds")
        spec = model.ProcessSpec(
            cmd="/bin/bash", args=("-l", "-c", command), cwd=self._workdir(session, workdir),
            timeout=None if background else timeout,
        )  # fmt: skip
        processes = self.backend.processes(name)
        pid = processes.start(spec)
        started(pid)
        if background:
            return {"process_id": pid, "running": True, "cursor": 0,
                    "note": "runs on; read its output with read_output(process_id, cursor)"}  # fmt: skip
        return self._collect(name, pid, 0, timeout + 10.0)

    def read_output(self, session: str, process_id: int, cursor: int, wait_seconds: float) -> dict[str, Any]:
        wait = bounded(float(wait_seconds), 0.0, 60.0, "wait_seconds")
        return self._collect(_name(session), int(process_id), max(int(cursor), 0), wait)

    def kill_process(self, session: str, process_id: int) -> dict[str, Any]:
        self.backend.processes(_name(session)).signal(int(process_id), model.Signal.KILL)
        return {"killed": int(process_id)}

    def _collect(self, name: SessionName, pid: int, cursor: int, wait: float) -> dict[str, Any]:
        """What process `pid` wrote from `cursor`, waiting up to `wait` seconds for it to end."""
        processes = self.backend.processes(name)
        out, err = bytearray(), bytearray()
        deadline = time.monotonic() + wait
        ended: model.Exit | None = None
        while True:
            got = processes.output(pid, cursor, max(min(deadline - time.monotonic(), 5.0), 0.0))
            for chunk in got.chunks:
                into = out if chunk.stream is model.Stream.STDOUT else err
                into += chunk.data
                del into[: max(len(into) - 4 * shown.MOST_TEXT, 0)]  # (the end is what is shown)
            cursor, ended = got.cursor, got.exit
            if ended is not None or time.monotonic() >= deadline:
                break
        found: dict[str, Any] = {
            "process_id": pid, "cursor": cursor, "running": ended is None,
            "stdout": shown.text(bytes(out)), "stderr": shown.text(bytes(err)), **shown.untrusted("stdout", "stderr"),
        }  # fmt: skip
        if ended is not None:
            found |= {"exit_code": ended.code, "status": ended.status}
        else:
            found["note"] = "still running: read the rest with read_output(process_id, cursor)"
        return found

    def _workdir(self, session: str, workdir: str | None) -> GuestPath | None:
        """Where a command starts: where its files' relative paths start (the session's project directory), or
        `workdir` (relative: to that; in a session on no project, as the guest resolves it)."""
        if not workdir:
            return None
        given = GuestPath(workdir)
        base = self.backend.files(_name(session)).workdir
        return GuestPath(posixpath.join(base, given.normal())) if base and not given.absolute else given

    def fan_out(
        self, project: str, count: int, command: str, check: str | None, blueprint: str | None
    ) -> dict[str, Any]:
        """`run --fanout COUNT --check CHECK PROJECT -- bash -lc COMMAND`, through the core's own run: COUNT sessions
        from one capture of the project, each running the command (VMSANDBOX_INDEX=1..COUNT tells them apart), all
        kept to compare."""
        if not 1 <= count <= MOST_FANOUT:
            raise InvalidError(
                f"count {count}: an agent's fan-out starts 1 to {MOST_FANOUT} sessions",
                hint=f"at most {MOST_FANOUT}; a person starts more with `vmsandbox run --fanout`",
            )
        if not command.strip():
            raise InvalidError("an empty command", hint="give a shell command line, e.g. `./attempt.sh`")
        where = ProjectPath(Path(project)).value
        told = Told()
        flags = sessions.RunFlags(fanout=count, check=check or None)
        ran = flow.run(flow.Ask(where, blueprint or DEFAULT_BLUEPRINT, ["bash", "-lc", command], flags), told)
        return {
            "group": told.group, "passed": ran.code == 0,
            "sessions": [
                {"name": o.name, "index": o.index, "exit_code": o.code, "check_passed": o.check, "files": o.files,
                 "added": o.added, "removed": o.removed, **({"error": shown.text(o.error, 2000)} if o.error else {})}
                for o in told.outcomes
            ],
            "note": "compare them with compare_sessions; propose_apply the one you want; remove_session the rest",
        }  # fmt: skip

    def compare_sessions(self, names: Sequence[str], diff: bool) -> dict[str, Any]:
        """Sessions' changes side by side (a fan-out's, or a session and its forks), and with `diff` the unified
        diff from the second to the first."""
        checked = [_name(n).value for n in names]
        if not 2 <= len(checked) <= MOST_FANOUT:
            raise InvalidError(f"{len(checked)} sessions: compare 2 to {MOST_FANOUT}", hint="name a fan-out's sessions")
        side = moments.side_by_side(checked)
        rows = [{"path": shown.line(r.path, 1000), "changes": dict(zip(checked, r.cells, strict=True)),
                 "same_in_all": r.agree} for r in side.rows[:MOST_ROWS]]  # fmt: skip
        found: dict[str, Any] = {"rows": rows, "truncated": len(side.rows) > MOST_ROWS, "shared_baseline": side.shared}
        if diff:
            found["diff"] = shown.text(moments.between(checked[0], checked[1]), keep="start")
        return found

    # -- files (a relative path starts where commands start: the backend's files resolve it there) --------------
    def read_file(self, session: str, path: str) -> dict[str, Any]:
        name, at = _name(session), GuestPath(path)
        files = self.backend.files(name)
        entry = files.stat(at, None)
        data = bytearray()
        reading = files.read(at, None)
        try:
            for chunk in reading:
                data += chunk[: MOST_FILE + 1 - len(data)]
                if len(data) > MOST_FILE:
                    break
        finally:
            close = getattr(reading, "close", None)  # (the rest is not read: its download ends now)
            if close is not None:
                close()
        return {"path": shown.line(entry.path, 4096), "size": entry.size, "truncated": len(data) > MOST_FILE,
                "content": shown.text(bytes(data[:MOST_FILE]), MOST_FILE, keep="start"),
                **shown.untrusted("content", "path")}  # fmt: skip

    def write_file(self, session: str, path: str, content: str) -> dict[str, Any]:
        data = content.encode()
        if len(data) > MOST_WRITE:
            raise TooLargeError(
                f"{len(data)} bytes to write: at most {MOST_WRITE}",
                hint="write it in the guest with run_command, or copy it in: `vmsandbox cp`",
            )
        name, at = _name(session), GuestPath(path)
        entry = self.backend.files(name).write(at, None, io.BytesIO(data))
        return {"path": shown.line(entry.path, 4096), "size": entry.size}

    def list_files(self, session: str, path: str, depth: int) -> dict[str, Any]:
        name, at = _name(session), GuestPath(path)
        found = self.backend.files(name).list_dir(at, min(max(depth, 1), 5), None)
        entries = [
            {"path": shown.line(e.path, 4096), "type": e.type.value, "size": e.size} for e in list(found)[:MOST_ENTRIES]
        ]
        return {"entries": entries, "truncated": len(found) > MOST_ENTRIES, **shown.untrusted("entries")}

    def remove_file(self, session: str, path: str) -> dict[str, Any]:
        name, at = _name(session), GuestPath(path)
        self.backend.files(name).remove(at, None)
        return {"removed": shown.line(at.value, 4096)}

    # -- checkpoints ---------------------------------------------------------------------------------------------
    def checkpoint(self, session: str, label: str | None) -> dict[str, Any]:
        taken = self.backend.checkpoint(_name(session), CheckpointLabel(label) if label else None)
        return {"checkpoint": taken.snapshot.label.value, "taken_at": taken.taken_at.isoformat()}

    def list_checkpoints(self, session: str) -> list[dict[str, Any]]:
        return [{"checkpoint": c.snapshot.label.value, "taken_at": c.taken_at.isoformat()}
                for c in self.backend.checkpoints(_name(session))]  # fmt: skip

    def rollback(self, session: str, checkpoint: str) -> dict[str, Any]:
        return sandbox(self.backend.rollback(_name(session), CheckpointLabel(checkpoint)))

    # -- reviews -------------------------------------------------------------------------------------------------
    def review(self, session: str, review_id: str | None = None, *, freeze: bool = True) -> model.Review:
        """The review `review_id` of the session as it was frozen (never a new one in its place), or a new one
        (`freeze`: kept for an apply; without, read only)."""
        name = _name(session)
        if review_id is not None:
            return self.backend.reviewed(name, Token(review_id))
        return self.backend.review(name, freeze=freeze)

    def apply(self, session: str, review: model.Review, choices: Sequence[model.Choice],
              include: Sequence[model.Badge]) -> model.Applied:  # fmt: skip
        return self.backend.apply(_name(session), review.id, choices, include)

    # -- what it reached, and its console (read only) --------------------------------------------------------------
    def egress_log(self, session: str, tail: int) -> dict[str, Any]:
        events = listing.proxy(session, follow=False, tail=min(max(tail, 1), TAIL), since=None, most_bytes=512 * 1024)
        return {"events": shown.lines(listing.describe(e) for _, e in events), **shown.untrusted("events")}

    def allowlist(self, session: str) -> dict[str, Any]:
        found = watch.allowlist(_name(session).value)
        return {"mode": found.mode.value, "allowed": list(found.entries), "networks": list(found.networks),
                "note": "read only: a person widens it (`vmsandbox policy allow`)"}  # fmt: skip

    def console(self, session: str, tail: int) -> dict[str, Any]:
        said = listing.console(_name(session).value, follow=False, tail=min(max(tail, 1), TAIL), most_bytes=64 * 1024)
        return {"lines": shown.lines(said), **shown.untrusted("lines")}


class Told:
    """The person of an agent's fan-out (core.person.Person): files that look like credentials stay out of the VMs
    and no login is kept (as `Nobody`), and what each session did is kept for the agent. Nothing of a fan-out is
    applied: its sessions are kept, to compare and propose from."""

    def __init__(self) -> None:
        self.group = ""
        self.outcomes: list[FanOutcome] = []

    def leave_out(self, found: Sequence[Finding]) -> bool:
        return True

    def decide(self, review: Plan) -> Decisions:
        return Nobody().decide(review)

    def told(self, review: Plan, outcome: Outcome) -> None:
        return None

    def keep_login(self, agent: str, files: Sequence[str]) -> bool:
        return False

    def fanned_out(self, group: str, outcomes: Sequence[FanOutcome]) -> None:
        self.group, self.outcomes = group, list(outcomes)
