"""Connect RPC, the server side, with the JSON codec only: what E2B's SDKs speak to envd.

- Unary: `POST /pkg.Service/Method`, `Content-Type: application/json`, the message as the body; the answer is
  the message, or an error `{"code": "not_found", "message": …}` with Connect's HTTP status.
- Server streaming: `application/connect+json`; the request is one envelope (a flags byte, a 4-byte big-endian
  length, the message); the answer is 200 and a stream of envelopes ending with an end-of-stream one (flag 2)
  that holds `{}` or `{"error": …}`.
- Client streaming: envelopes both ways; the messages are read as they arrive.

Why by hand and not connectrpc's server: the surface is these three shapes and one codec, the messages are a
few plain JSON objects (wire.py), and it needs no protobuf runtime or generated code: `vmsandbox serve` works
without E2B's SDK installed. Binary protobuf and compression are refused with what to send instead.
"""

from __future__ import annotations

import enum
import json
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from vmsandbox.api import errors
from vmsandbox.api.envd.wire import Message
from vmsandbox.core.sandbox.names import GuestUser, SessionName
from vmsandbox.errors import VmsandboxError

UNARY_TYPE = "application/json"
STREAM_TYPE = "application/connect+json"
MAX_MESSAGE = 16 * 1024**2  # a message in (stdin, a path list); a file's content goes through /files instead
END_STREAM = 0b10
HEADER = struct.Struct(">BI")


class RpcError(VmsandboxError):
    """A failure with Connect's code named (where no backend error says it)."""

    def __init__(self, code: str, message: str, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.code = code


class Kind(enum.Enum):
    UNARY = "unary"
    SERVER_STREAM = "server streaming"
    CLIENT_STREAM = "client streaming"


@dataclass(frozen=True)
class Call:
    """Who asks what of which sandbox: made by the envd edge once the access token is checked."""

    sandbox: SessionName
    user: GuestUser | None  # from `Authorization: Basic` (None: the session's user)
    timeout: float | None  # seconds, from Connect-Timeout-Ms
    keepalive: float  # seconds between keepalive events on a quiet stream (Keepalive-Ping-Interval)


Unary = Callable[[Call, Message], Awaitable[Message]]
ServerStream = Callable[[Call, Message], Awaitable[AsyncIterator[Message]]]  # set up, then the events
ClientStream = Callable[[Call, AsyncIterator[Message]], Awaitable[Message]]


@dataclass(frozen=True)
class Method:
    kind: Kind
    handler: Unary | ServerStream | ClientStream


def code_and_message(exc: BaseException) -> tuple[str, str]:
    if isinstance(exc, RpcError):
        return exc.code, str(exc)
    found = errors.problem(exc)
    return found.code, found.message


def error_response(exc: BaseException) -> Response:
    code, message = code_and_message(exc)
    return JSONResponse({"code": code, "message": message}, status_code=errors.connect_status(code))


def envelope(flags: int, data: bytes) -> bytes:
    return HEADER.pack(flags, len(data)) + data


def end_of_stream(exc: BaseException | None) -> bytes:
    if exc is None:
        return envelope(END_STREAM, b"{}")
    code, message = code_and_message(exc)
    return envelope(END_STREAM, json.dumps({"error": {"code": code, "message": message}}).encode())


def parse(data: bytes) -> Message:
    try:
        found = json.loads(data)
    except ValueError:  # (not JSON, not UTF-8, or a number past the 4,300 digits Python converts)
        raise RpcError("invalid_argument", "the message is not JSON", hint=_CODEC_HINT) from None
    if not isinstance(found, dict):
        raise RpcError("invalid_argument", "the message is not a JSON object", hint=_CODEC_HINT)
    return found


_CODEC_HINT = "send Connect's JSON codec (application/json, application/connect+json), uncompressed, as E2B's SDKs do"


def _check_codec(request: Request, stream: bool) -> None:
    given = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    wanted = STREAM_TYPE if stream else UNARY_TYPE
    if given != wanted:
        raise RpcError("unimplemented", f"content type {given or 'none'!r} is not served here", hint=_CODEC_HINT)
    encoding = request.headers.get("connect-content-encoding" if stream else "content-encoding", "identity")
    if encoding.strip().lower() != "identity":
        raise RpcError("unimplemented", f"compression {encoding!r} is not served here", hint=_CODEC_HINT)


async def envelopes(request: Request) -> AsyncIterator[bytes]:
    """The messages of a streamed request body, as they arrive, each at most MAX_MESSAGE."""
    buffer = bytearray()
    async for piece in request.stream():
        buffer += piece
        while len(buffer) >= HEADER.size:
            flags, size = HEADER.unpack_from(buffer)
            if size > MAX_MESSAGE:
                raise RpcError("resource_exhausted", f"a message of {size} bytes is over the bound of {MAX_MESSAGE}")
            if flags & ~END_STREAM:
                raise RpcError("unimplemented", "a compressed message", hint=_CODEC_HINT)
            if len(buffer) < HEADER.size + size:
                break
            data = bytes(buffer[HEADER.size : HEADER.size + size])
            del buffer[: HEADER.size + size]
            yield data
    if buffer:
        raise RpcError("invalid_argument", "the request ended inside a message")


async def _single(request: Request) -> Message:
    found: list[bytes] = []
    async for data in envelopes(request):
        found.append(data)
        if len(found) > 1:
            break
    if len(found) != 1:
        raise RpcError("invalid_argument", "a server-streaming call takes exactly one message")
    return parse(found[0])


async def _body(request: Request) -> bytes:
    data = bytearray()
    async for piece in request.stream():
        data += piece
        if len(data) > MAX_MESSAGE:
            raise RpcError("resource_exhausted", f"a message over the bound of {MAX_MESSAGE} bytes")
    return bytes(data)


def _streamed(events: AsyncIterator[bytes]) -> Response:
    return StreamingResponse(events, media_type=STREAM_TYPE, headers={"cache-control": "no-store"})


async def serve(request: Request, method: Method, call: Call) -> Response:
    """Answer one call of `method` in its shape; every failure is an answer in Connect's form."""
    try:
        _check_codec(request, stream=method.kind is not Kind.UNARY)
        handler: Any = method.handler
        if method.kind is Kind.UNARY:
            answer = await handler(call, parse(await _body(request)))
            return Response(json.dumps(answer), media_type=UNARY_TYPE)
        if method.kind is Kind.SERVER_STREAM:
            events = await handler(call, await _single(request))  # a failure to set up: an error answer
            return _streamed(_server_stream(events))
    except Exception as exc:  # noqa: BLE001  (every failure is an answer)
        return error_response(exc)
    return await _client_stream(handler, call, request)


async def _server_stream(events: AsyncIterator[Message]) -> AsyncIterator[bytes]:
    try:
        async for event in events:
            yield envelope(0, json.dumps(event).encode())
    except Exception as exc:  # noqa: BLE001  (the stream ends with it)
        yield end_of_stream(exc)
        return
    yield end_of_stream(None)


async def _client_stream(handler: ClientStream, call: Call, request: Request) -> Response:
    """The request's messages are taken as they arrive, then the one answer is sent: the whole request is read
    before the answer starts (a streamed answer would listen on the same channel for the client leaving)."""

    async def messages() -> AsyncIterator[Message]:
        async for data in envelopes(request):
            yield parse(data)

    try:
        answer = envelope(0, json.dumps(await handler(call, messages())).encode()) + end_of_stream(None)
    except Exception as exc:  # noqa: BLE001  (the stream ends with it)
        answer = end_of_stream(exc)
    return Response(answer, media_type=STREAM_TYPE, headers={"cache-control": "no-store"})


def timeout_of(request: Request) -> float | None:
    given = request.headers.get("connect-timeout-ms")
    if not given:
        return None
    if not (given.isascii() and given.isdigit() and len(given) <= 10):  # (`isdigit` takes "²", `int` does not)
        raise RpcError("invalid_argument", f"Connect-Timeout-Ms is not a number of milliseconds: {given[:20]!r}")
    return int(given) / 1000
