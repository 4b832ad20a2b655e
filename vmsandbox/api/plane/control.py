"""E2B's control plane over the backend: create, list, inspect, kill, pause, connect (resume), set a timeout,
snapshot (a checkpoint), fork. A template is a blueprint; a snapshot id is `SESSION:LABEL`, and creating a
sandbox from one forks that checkpoint. Sandboxes are sessions, named by the edge (`BLUEPRINT-xxxxxxxx`).

A session's end time is the backend's to keep; ending it when it comes is the reaper's (`sweep`), which this
server runs while it serves. A paused session has no end (E2B's rule): connecting gives it one again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qsl, unquote

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from vmsandbox.api import errors
from vmsandbox.api.errors import UnimplementedError
from vmsandbox.api.keyguard import Keys
from vmsandbox.api.plane import controlwire
from vmsandbox.api.respond import Endpoint, answers, body, done, ok, session
from vmsandbox.api.threads import blocking
from vmsandbox.core.sandbox.interface import Backend
from vmsandbox.core.sandbox.model import Sandbox, SandboxSpec, State
from vmsandbox.core.sandbox.names import BlueprintName, CheckpointLabel, SessionName, SnapshotRef, fresh_name

log = logging.getLogger(__name__)
Clock = Callable[[], datetime]


def now() -> datetime:
    return datetime.now(UTC)


def end_after(clock: Clock, timeout: int | None) -> datetime:
    return clock() + timedelta(seconds=timeout or controlwire.DEFAULT_TIMEOUT)


def refuse_unserved(new: controlwire.NewSandbox) -> None:
    if new.auto_pause or new.auto_resume:
        raise UnimplementedError(
            "auto-pause is not served", hint="pause with Sandbox.pause; a session ends at its timeout"
        )
    if new.network is not None or new.allow_internet_access is not None:
        raise UnimplementedError(
            "network settings per sandbox are not served: the blueprint's egress allowlist applies",
            hint="leave network and allow_internet_access out; widen it with `vmsandbox policy allow NAME HOST`",
        )
    if new.mcp is not None or new.iam is not None or new.volume_mounts:
        raise UnimplementedError(
            "MCP, IAM and volume mounts are not served", hint="leave mcp, iam and volume_mounts out"
        )


def sweep(backend: Backend, moment: datetime) -> list[SessionName]:
    """End every running session whose end has come (its changes kept in the outbox); the names ended."""
    ended = []
    for s in backend.sandboxes():
        if s.state is State.RUNNING and s.end_at <= moment:
            try:
                now = backend.sandbox(s.name)  # (as it is now: a timeout may have moved it since the listing)
                if not (now.timed and now.state is State.RUNNING and now.end_at <= moment):
                    continue
                backend.kill(s.name)
            except Exception:
                log.exception("ending %s at its timeout failed", s.name)
                continue
            ended.append(s.name)
    return ended


class Control:
    def __init__(self, backend: Backend, keys: Keys, clock: Clock = now) -> None:
        self.backend = backend
        self.keys = keys
        self.clock = clock

    def routes(self) -> list[BaseRoute]:
        table: Sequence[tuple[str, Endpoint, str]] = (
            ("/sandboxes", self.create, "POST"),
            ("/v2/sandboxes", self.create, "POST"),
            ("/sandboxes", self.list_running, "GET"),
            ("/v2/sandboxes", self.list, "GET"),
            ("/sandboxes/{name}", self.detail, "GET"),
            ("/sandboxes/{name}", self.kill, "DELETE"),
            ("/sandboxes/{name}/pause", self.pause, "POST"),
            ("/sandboxes/{name}/resume", self.connect, "POST"),
            ("/sandboxes/{name}/connect", self.connect, "POST"),
            ("/v2/sandboxes/{name}/connect", self.connect, "POST"),
            ("/sandboxes/{name}/timeout", self.set_timeout, "POST"),
            ("/sandboxes/{name}/snapshots", self.snapshot, "POST"),
            ("/snapshots", self.snapshots, "GET"),
            ("/sandboxes/{name}/fork", self.fork, "POST"),
        )
        return [Route(path, answers(handler), methods=[method]) for path, handler, method in table]

    def _end(self, timeout: int | None) -> datetime:
        return end_after(self.clock, timeout)

    def _out(self, s: Sandbox, status: int = 201) -> Response:
        return ok(controlwire.dump(controlwire.sandbox(s, self.keys.envd_token(s.name, s.started_at))), status)

    async def create(self, request: Request) -> Response:
        new = controlwire.read(controlwire.NewSandbox, await body(request))
        refuse_unserved(new)
        end_at = self._end(new.timeout)
        if ":" in new.template_id:  # a snapshot: a fork of that checkpoint
            ref = SnapshotRef.parse(new.template_id)
            made = await blocking(self.backend.fork, ref.session, ref.label, fresh_name(ref.session.value), end_at)
            return self._out(made)
        blueprint = BlueprintName(new.template_id)
        spec = SandboxSpec(fresh_name(blueprint.value), blueprint, None, end_at, new.env_vars or {}, new.metadata or {})
        return self._out(await blocking(self.backend.create, spec))

    async def list(self, request: Request) -> Response:
        query = request.query_params
        found = await blocking(self.backend.sandboxes)
        if states := query.get("state"):
            wanted = set(states.split(","))
            found = [s for s in found if s.state.value in wanted]
        if template := query.get("template"):
            found = [s for s in found if s.blueprint == template]
        if metadata := query.get("metadata"):
            pairs = {unquote(k): unquote(v) for k, v in parse_qsl(metadata)}  # E2B's SDK quotes each, then the pairs
            found = [s for s in found if all(s.metadata.get(k) == v for k, v in pairs.items())]
        found = sorted(found, key=lambda s: s.started_at, reverse=query.get("order", "desc") != "asc")
        start, limit = controlwire.page_of(query.get("nextToken"), query.get("limit"))
        page = found[start : start + limit]
        headers = {"x-next-token": str(start + limit)} if start + limit < len(found) else {}
        return ok([controlwire.dump(controlwire.listed(s)) for s in page], headers=headers)

    async def list_running(self, _request: Request) -> Response:
        found = await blocking(self.backend.sandboxes)
        return ok([controlwire.dump(controlwire.listed(s)) for s in found if s.state is State.RUNNING])

    async def detail(self, request: Request) -> Response:
        s = await blocking(self.backend.sandbox, session(request))
        return ok(controlwire.dump(controlwire.detail(s, self.keys.envd_token(s.name, s.started_at))))

    async def kill(self, request: Request) -> Response:
        await blocking(self.backend.kill, session(request))
        return done()

    async def pause(self, request: Request) -> Response:
        await blocking(self.backend.pause, session(request))
        return done()

    async def connect(self, request: Request) -> Response:
        """Resume a paused sandbox (201) or reach a running one (200); its end moves to now + timeout, for a
        running one only later (E2B's rule)."""
        name, asked = session(request), controlwire.read(controlwire.ConnectRequest, await body(request))
        end_at = self._end(asked.timeout)
        s = await blocking(self.backend.sandbox, name)
        if s.state is State.PAUSED:
            await blocking(self.backend.resume, name)
        if s.timed and (s.state is State.PAUSED or end_at > s.end_at):  # (a person's session keeps no end)
            await blocking(self.backend.set_end, name, end_at)
        return self._out(await blocking(self.backend.sandbox, name), 201 if s.state is State.PAUSED else 200)

    async def set_timeout(self, request: Request) -> Response:
        name, asked = session(request), controlwire.read(controlwire.TimeoutRequest, await body(request))
        await blocking(self.backend.set_end, name, self._end(asked.timeout))
        return done()

    async def snapshot(self, request: Request) -> Response:
        name, asked = session(request), controlwire.read(controlwire.SnapshotRequest, await body(request))
        label = CheckpointLabel(asked.name) if asked.name else None
        return ok(controlwire.dump(controlwire.snapshot(await blocking(self.backend.checkpoint, name, label))), 201)

    async def snapshots(self, request: Request) -> Response:
        given = request.query_params.get("sandboxID")
        found = await blocking(self.backend.checkpoints, SessionName(given) if given else None)
        if wanted := request.query_params.get("name"):
            found = [c for c in found if c.snapshot.label.value == wanted]
        start, limit = controlwire.page_of(request.query_params.get("nextToken"), request.query_params.get("limit"))
        page = found[start : start + limit]
        headers = {"x-next-token": str(start + limit)} if start + limit < len(found) else {}
        return ok([controlwire.dump(controlwire.snapshot(c)) for c in page], headers=headers)

    async def fork(self, request: Request) -> Response:
        name, asked = session(request), controlwire.read(controlwire.ForkRequest, await body(request))
        results = []
        for _ in range(asked.count):
            try:
                made = await blocking(self.backend.fork, name, None, fresh_name(name.value), self._end(asked.timeout))
                results.append(
                    controlwire.ForkResultOut(
                        sandbox=controlwire.sandbox(made, self.keys.envd_token(made.name, made.started_at))
                    )
                )
            except Exception as exc:  # noqa: BLE001  (one fork's failure is its result)
                found = errors.problem(exc)
                results.append(
                    controlwire.ForkResultOut(error=controlwire.ErrorOut(code=found.status, message=found.message))
                )
        return ok([controlwire.dump(r) for r in results], 201)
