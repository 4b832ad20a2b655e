"""What the JSON endpoints (E2B's control plane and the extension) share: a bounded JSON body in, a JSON answer
or E2B's error out."""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from vmsandbox.api import errors
from vmsandbox.api.errors import BodyTooLargeError
from vmsandbox.core.sandbox.names import InvalidError, SessionName

MAX_BODY = 1024**2  # a JSON request body

Endpoint = Callable[[Request], Awaitable[Response]]


def answers(handler: Endpoint) -> Endpoint:
    """The handler, with every failure answered as E2B's Error (status, message with the fix)."""

    @functools.wraps(handler)
    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except Exception as exc:  # noqa: BLE001  (every failure is an answer)
            found = errors.problem(exc)
            return JSONResponse(errors.control_body(found), found.status)

    return endpoint


async def body(request: Request) -> Any:
    """The request's JSON, at most MAX_BODY bytes; an empty body is `{}`."""
    data = bytearray()
    async for piece in request.stream():
        data += piece
        if len(data) > MAX_BODY:
            raise BodyTooLargeError(f"a request body over {MAX_BODY} bytes", hint="send less at once")
    if not data.strip():
        return {}
    try:
        return json.loads(data)
    except ValueError:  # (not JSON, not UTF-8, or a number past the 4,300 digits Python converts)
        raise InvalidError("the request body is not JSON", hint="send a JSON object (see /openapi.json)") from None


def session(request: Request, key: str = "name") -> SessionName:
    return SessionName(str(request.path_params[key]))


def ok(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse(data, status_code=status, headers=headers)


def done() -> Response:
    return Response(status_code=204)
