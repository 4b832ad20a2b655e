"""vmsandbox's extension, beside E2B's control plane under `/vmsandbox/v1`: sessions on a host project, their
changes read as a frozen review, chosen items (or hunks) of that review applied to the project, checkpoints,
rollback and fork.

A review is the contract: it is read once and frozen by the backend; applying names the review and, per item,
the id and the digest it showed, so nothing that was not shown can be applied, and an item whose guest side
changed after it was read is refused (the backend compares). A session made here is driven with E2B's SDK like
any other (`Sandbox.connect(name)`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from vmsandbox.api.plane import extwire
from vmsandbox.api.plane.control import Clock, end_after, now
from vmsandbox.api.plane.controlwire import page_of, read
from vmsandbox.api.respond import Endpoint, answers, body, ok, session
from vmsandbox.api.threads import blocking
from vmsandbox.core.sandbox.interface import Backend
from vmsandbox.core.sandbox.model import Badge, Choice, SandboxSpec
from vmsandbox.core.sandbox.names import (
    BlueprintName,
    CheckpointLabel,
    Digest,
    ProjectPath,
    SessionName,
    Token,
    fresh_name,
)

PREFIX = "/vmsandbox/v1"


def dump(model: extwire.Wire) -> object:
    return model.model_dump(mode="json", by_alias=True)


class Extension:
    def __init__(self, backend: Backend, clock: Clock = now) -> None:
        self.backend = backend
        self.clock = clock

    def routes(self) -> list[BaseRoute]:
        table: Sequence[tuple[str, Endpoint, str]] = (
            ("/sessions", self.create, "POST"),
            ("/sessions", self.list, "GET"),
            ("/sessions/{name}", self.one, "GET"),
            ("/sessions/{name}/reviews", self.review, "POST"),
            ("/sessions/{name}/reviews/{review}", self.reviewed, "GET"),
            ("/sessions/{name}/reviews/{review}/apply", self.apply, "POST"),
            ("/sessions/{name}/checkpoints", self.checkpoints, "GET"),
            ("/sessions/{name}/checkpoints", self.checkpoint, "POST"),
            ("/sessions/{name}/rollback", self.rollback, "POST"),
            ("/sessions/{name}/fork", self.fork, "POST"),
        )
        return [Route(PREFIX + p, answers(h), methods=[method]) for p, h, method in table]

    def _end(self, timeout: int | None) -> datetime:
        return end_after(self.clock, timeout)

    async def create(self, request: Request) -> Response:
        new = read(extwire.NewSession, await body(request))
        blueprint = BlueprintName(new.blueprint)
        name = SessionName(new.name) if new.name else fresh_name(blueprint.value)
        spec = SandboxSpec(
            name=name,
            blueprint=blueprint,
            project=ProjectPath(Path(new.project)),
            end_at=self._end(new.timeout),
            envs=new.envs,
            metadata=new.metadata,
        )
        return ok(dump(extwire.session(await blocking(self.backend.create, spec))), 201)

    async def list(self, _request: Request) -> Response:
        found = await blocking(self.backend.sandboxes)
        return ok([dump(extwire.session(s)) for s in found])

    async def one(self, request: Request) -> Response:
        return ok(dump(extwire.session(await blocking(self.backend.sandbox, session(request)))))

    async def review(self, request: Request) -> Response:
        """Read the changes as a frozen review: its first page (`GET …/reviews/ID?nextToken=` gives the rest)."""
        start, most = _page(request)
        return ok(dump(extwire.review(await blocking(self.backend.review, session(request)), start, most)), 201)

    async def reviewed(self, request: Request) -> Response:
        name, review = session(request), Token(str(request.path_params["review"]))
        start, most = _page(request)
        return ok(dump(extwire.review(await blocking(self.backend.reviewed, name, review), start, most)))

    async def apply(self, request: Request) -> Response:
        name, review = session(request), Token(str(request.path_params["review"]))
        asked = read(extwire.ApplyIn, await body(request))
        choices = [
            Choice(
                item=Token(c.item),
                digest=Digest(c.digest),
                hunks=None if c.hunks is None else tuple(Token(h) for h in c.hunks),
            )
            for c in asked.choices
        ]
        include = [Badge(k) for k in asked.include]
        return ok(dump(extwire.applied(await blocking(self.backend.apply, name, review, choices, include))))

    async def checkpoints(self, request: Request) -> Response:
        found = await blocking(self.backend.checkpoints, session(request))
        return ok([dump(extwire.checkpoint(c)) for c in found])

    async def checkpoint(self, request: Request) -> Response:
        name, asked = session(request), read(extwire.CheckpointIn, await body(request))
        label = CheckpointLabel(asked.label) if asked.label else None
        return ok(dump(extwire.checkpoint(await blocking(self.backend.checkpoint, name, label))), 201)

    async def rollback(self, request: Request) -> Response:
        name, asked = session(request), read(extwire.RollbackIn, await body(request))
        return ok(dump(extwire.session(await blocking(self.backend.rollback, name, CheckpointLabel(asked.label)))))

    async def fork(self, request: Request) -> Response:
        name, asked = session(request), read(extwire.ForkIn, await body(request))
        label = CheckpointLabel(asked.label) if asked.label else None
        new = SessionName(asked.name) if asked.name else fresh_name(name.value)
        made = await blocking(self.backend.fork, name, label, new, self._end(asked.timeout))
        return ok(dump(extwire.session(made)), 201)


def _page(request: Request) -> tuple[int, int]:
    query = request.query_params
    return page_of(query.get("nextToken"), query.get("limit"), most=extwire.REVIEW_PAGE)
