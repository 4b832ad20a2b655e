"""Failures as the three dialects answer them: E2B's control plane and the extension (`{"code": 404,
"message": …}`), Connect (`{"code": "not_found", "message": …}`) and envd's file API (as the control plane).

Inside, everything is a VmsandboxError with its hint; only here does it become a status and a code. The message
a client reads holds the hint (E2B's SDK shows `message` alone); the extension's answer also has it apart.
An unexpected exception answers 500 with no detail (it may quote anything) and is logged whole.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from vmsandbox.core.sandbox import interface
from vmsandbox.core.sandbox.names import InvalidError
from vmsandbox.errors import VmsandboxError

log = logging.getLogger(__name__)


class UnauthenticatedError(VmsandboxError):
    """No key, or not the key."""


class ForbiddenError(VmsandboxError):
    """Not from here: another account, another host name."""


class BodyTooLargeError(VmsandboxError):
    """A request body over the bound."""


class UnimplementedError(VmsandboxError):
    """What E2B has and vmsandbox does not do (yet)."""


NOT_RUNNING = ": it was not found running"


@dataclass(frozen=True)
class Problem:
    status: int  # HTTP status (control plane, extension, envd's files)
    code: str  # Connect's code
    message: str  # what went wrong, then the fix
    hint: str | None = None


# most specific first: NotRunningError before ConflictError, ExistsError before ConflictError
_KINDS: tuple[tuple[type[VmsandboxError], int, str], ...] = (
    (InvalidError, 400, "invalid_argument"),
    (interface.RefusedError, 400, "invalid_argument"),
    (UnauthenticatedError, 401, "unauthenticated"),
    (ForbiddenError, 403, "permission_denied"),
    (interface.NotFoundError, 404, "not_found"),
    (interface.NotRunningError, 409, "unavailable"),
    (interface.ExistsError, 409, "already_exists"),
    (interface.ConflictError, 409, "failed_precondition"),
    (BodyTooLargeError, 413, "out_of_range"),
    (interface.TooLargeError, 413, "out_of_range"),
    (UnimplementedError, 501, "unimplemented"),
)


def problem(exc: BaseException) -> Problem:
    if not isinstance(exc, VmsandboxError):
        log.error("the API failed", exc_info=exc)
        return Problem(500, "internal", "internal error: `vmsandbox -v serve` logs what failed")
    status, code = next(((s, c) for kind, s, c in _KINDS if isinstance(exc, kind)), (500, "internal"))
    message = exc.message
    if isinstance(exc, interface.NotRunningError):
        message += NOT_RUNNING  # how E2B's SDK tells a sandbox that is gone from one that is unreachable
    return Problem(status, code, message if exc.hint is None else f"{message} (hint: {exc.hint})", exc.hint)


def control_body(p: Problem) -> dict[str, object]:
    """E2B's Error (code, message), with the hint apart for clients that read it."""
    body: dict[str, object] = {"code": p.status, "message": p.message}
    if p.hint:
        body["hint"] = p.hint
    return body


def connect_status(code: str) -> int:
    """The HTTP status of a unary Connect error (Connect's table)."""
    return _CONNECT_STATUS.get(code, 500)


_CONNECT_STATUS = {
    "canceled": 499,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "unavailable": 503,
    "unauthenticated": 401,
}
