"""The API as one ASGI app: E2B's control plane, envd's side, the extension and /openapi.json behind the guard,
and the reaper that ends sessions whose time has come while it serves."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from vmsandbox.api import threads
from vmsandbox.api.envd import routes
from vmsandbox.api.keyguard import Guard, Keys
from vmsandbox.api.plane import openapi
from vmsandbox.api.plane.control import Clock, Control, now, sweep
from vmsandbox.api.plane.extension import Extension
from vmsandbox.core.sandbox.interface import Backend

log = logging.getLogger(__name__)
REAP_EVERY = 5.0  # seconds between looks for sessions whose end has come


async def _openapi(_request: Request) -> Response:
    return JSONResponse(openapi.document())


async def _no_route(_request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    message = "no such endpoint" if status == 404 else "not served with this method" if status == 405 else "failed"
    return JSONResponse({"code": status, "message": message, "hint": "/openapi.json lists what is served"}, status)


async def _reap(backend: Backend, clock: Clock, every: float) -> None:
    while True:
        await asyncio.sleep(every)
        try:
            ended = await threads.blocking(sweep, backend, clock())
        except Exception:
            log.exception("looking for sessions whose time has come failed")
            continue
        for name in ended:
            log.info("session %s reached its timeout and was ended", name)


def make(backend: Backend, *, api_key: str, port: int, clock: Clock = now, reap: bool = True) -> ASGIApp:
    """The app for a server on 127.0.0.1:`port` (and a Unix socket, where Host means nothing)."""
    keys = Keys(api_key, backend.born)  # (a sandbox's token is bound to when it was made)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        threads.widen()
        reaper = asyncio.create_task(_reap(backend, clock, REAP_EVERY)) if reap else None
        try:
            yield
        finally:
            if reaper is not None:
                reaper.cancel()

    mounted = [
        Route("/openapi.json", _openapi, methods=["GET"]),
        *Control(backend, keys, clock).routes(),
        *Extension(backend, clock).routes(),
        *routes.routes(backend, keys),
    ]
    app = Starlette(routes=mounted, lifespan=lifespan, exception_handlers={HTTPException: _no_route})
    return Guard(app, keys=keys, port=port)
