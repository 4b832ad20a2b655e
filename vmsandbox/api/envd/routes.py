"""envd's side of the API: every sandbox behind one URL (E2B_SANDBOX_URL), told apart by `E2b-Sandbox-Id`
and let in by the access token handed out for it. The RPC services (process.py, filesystem.py) over Connect,
`/health` (what E2B's SDK probes after a failure) and `/files` (files.py)."""

from __future__ import annotations

import functools

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from vmsandbox.api import errors
from vmsandbox.api.envd import connect, files
from vmsandbox.api.envd.connect import Call, Method
from vmsandbox.api.envd.files import user_of
from vmsandbox.api.envd.filesystem import FilesystemService
from vmsandbox.api.envd.process import ProcessService, reach
from vmsandbox.api.keyguard import Keys
from vmsandbox.core.sandbox.interface import Backend, NotRunningError
from vmsandbox.core.sandbox.names import InvalidError

KEEPALIVE = 50.0  # seconds, when a client does not say (E2B's SDK says 50)
KEEPALIVE_RANGE = (1.0, 3600.0)


def keepalive_of(request: Request) -> float:
    given = request.headers.get("keepalive-ping-interval")
    if not given:
        return KEEPALIVE
    if not (given.isascii() and given.isdigit() and len(given) <= 10):  # (`isdigit` takes "²", `float` does not)
        raise InvalidError(f"Keepalive-Ping-Interval is not a number of seconds: {given[:20]!r}")
    low, high = KEEPALIVE_RANGE
    return min(max(float(given), low), high)


async def rpc(request: Request, *, method: Method, keys: Keys) -> Response:
    try:
        call = Call(
            sandbox=await keys.check_envd(request.headers),
            user=user_of(request),
            timeout=connect.timeout_of(request),
            keepalive=keepalive_of(request),
        )
    except Exception as exc:  # noqa: BLE001  (every failure is an answer)
        return connect.error_response(exc)
    return await connect.serve(request, method, call)


async def health(request: Request, *, backend: Backend, keys: Keys) -> Response:
    """204 while the sandbox runs; 502 saying it `was not found` otherwise (what E2B's SDK reads as ended)."""
    try:
        await reach(backend.processes, await keys.check_envd(request.headers))
    except Exception as exc:  # noqa: BLE001  (every failure is an answer)
        found = errors.problem(exc)
        status = 502 if isinstance(exc, NotRunningError) else found.status
        return JSONResponse(errors.control_body(found), status)
    return Response(status_code=204)


def routes(backend: Backend, keys: Keys) -> list[BaseRoute]:
    methods: dict[str, Method] = ProcessService(backend).methods() | FilesystemService(backend).methods()
    found: list[BaseRoute] = [
        Route(path, functools.partial(rpc, method=method, keys=keys), methods=["POST"])
        for path, method in methods.items()
    ]
    found.append(Route("/health", functools.partial(health, backend=backend, keys=keys), methods=["GET"]))
    found.append(Route("/files", functools.partial(files.read, backend=backend, keys=keys), methods=["GET"]))
    found.append(Route("/files", functools.partial(files.write, backend=backend, keys=keys), methods=["POST"]))
    return found
