"""envd's `/files`: a file's content down (GET) and up (POST, as multipart/form-data or
application/octet-stream, the latter optionally gzip-encoded), both bounded by MAX_FILE.

An upload is spooled (memory, then a private temporary file) and counted as it arrives; the backend gets it
whole or not at all. A download is checked with stat first (a directory, or a file over the bound, is refused
before a byte is sent) and cut at the bound if the file grows while it is read.
"""

from __future__ import annotations

import base64
import binascii
import tempfile
import zlib
from collections.abc import AsyncIterator, Iterator

from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Message

from vmsandbox.api import errors
from vmsandbox.api.envd.process import reach
from vmsandbox.api.errors import BodyTooLargeError
from vmsandbox.api.keyguard import Keys
from vmsandbox.api.threads import blocking
from vmsandbox.core.sandbox.interface import Backend, Files, RefusedError
from vmsandbox.core.sandbox.model import Entry, EntryType
from vmsandbox.core.sandbox.names import GuestPath, GuestUser, InvalidError

MAX_FILE = 1024**3  # bytes of one file either way
MAX_FILES = 64  # files in one multipart upload
SPOOL = 8 * 1024**2  # held in memory before the spool goes to a temporary file
CHUNK = 256 * 1024
TOO_LARGE_HINT = "move larger files with `vmsandbox cp`, or split them with commands.run"


def _answer(exc: Exception) -> Response:
    found = errors.problem(exc)
    return JSONResponse(errors.control_body(found), found.status)


def user_of(request: Request) -> GuestUser | None:
    """The account a request acts as: `Authorization: Basic base64("user:")` as E2B's SDK sends it."""
    given = request.headers.get("authorization")
    if not given:
        return None
    scheme, _, value = given.partition(" ")
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        decoded = ""
    if scheme.lower() != "basic" or ":" not in decoded:
        raise InvalidError("Authorization is not `Basic` with a user", hint="pass `user=` to the SDK, or leave it out")
    name = decoded.partition(":")[0]
    return GuestUser(name) if name else None


def _user(request: Request) -> GuestUser | None:
    name = request.query_params.get("username")
    return GuestUser(name) if name else user_of(request)


def _path(request: Request) -> GuestPath:
    given = request.query_params.get("path")
    if not given:
        raise InvalidError("no path given", hint="pass the file's path in the guest")
    return GuestPath(given)


async def _files(request: Request, backend: Backend, keys: Keys) -> Files:
    return await reach(backend.files, await keys.check_envd(request.headers))


async def read(request: Request, *, backend: Backend, keys: Keys) -> Response:
    try:
        chunks = await _opened(request, await _files(request, backend, keys))
    except Exception as exc:  # noqa: BLE001  (every failure is an answer)
        return _answer(exc)
    return StreamingResponse(_bounded(chunks), media_type="application/octet-stream")


async def _opened(request: Request, files: Files) -> Iterator[bytes]:
    path, user = _path(request), _user(request)
    entry = await blocking(files.stat, path, user)
    if entry.type is EntryType.DIR:
        raise RefusedError(f"{entry.path} is a directory", hint="list it with files.list")
    if entry.size > MAX_FILE:
        raise BodyTooLargeError(
            f"{entry.path} has {entry.size} bytes, over the bound of {MAX_FILE}", hint=TOO_LARGE_HINT
        )
    return await blocking(files.read, path, user)


async def _bounded(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    sent = 0
    try:
        while (chunk := await blocking(next, chunks, None)) is not None:
            sent += len(chunk)
            if sent > MAX_FILE:  # it grew while read: the download breaks rather than passes the bound
                raise BodyTooLargeError(f"the file grew past the bound of {MAX_FILE} bytes while it was read")
            yield chunk
    finally:  # read to the end, cut, or its client gone: the backend's reader is closed
        close = getattr(chunks, "close", None)
        if callable(close):
            await blocking(close)


async def write(request: Request, *, backend: Backend, keys: Keys) -> Response:
    try:
        written = await _written(request, await _files(request, backend, keys))
    except Exception as exc:  # noqa: BLE001  (every failure is an answer)
        return _answer(exc)
    return JSONResponse([{"name": e.name, "type": e.type.value, "path": e.path} for e in written])


async def _written(request: Request, files: Files) -> list[Entry]:
    user = _user(request)
    kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if kind == "multipart/form-data":
        return await _multipart(request, files, user)
    if kind == "application/octet-stream":
        return [await _octets(request, files, _path(request), user)]
    raise InvalidError(
        f"an upload of {kind or 'no type'!r}", hint="send multipart/form-data or application/octet-stream"
    )


async def _multipart(request: Request, files: Files, user: GuestUser | None) -> list[Entry]:
    try:
        form = await _counted(request, MAX_FILE).form(max_files=MAX_FILES, max_fields=MAX_FILES)
    except (HTTPException, MultiPartException) as exc:
        detail = exc.detail if isinstance(exc, HTTPException) else exc.message
        raise InvalidError(f"not a multipart upload: {detail}", hint="send each file as a part named `file`") from None
    try:
        parts = [p for p in form.getlist("file") if isinstance(p, UploadFile)]
        if not parts:
            raise InvalidError("no `file` part in the upload", hint="send each file as a part named `file`")
        given = request.query_params.get("path")
        written = []
        for part in parts:
            path = GuestPath(given) if given and len(parts) == 1 else GuestPath(part.filename or "")
            written.append(await blocking(files.write, path, user, part.file))
        return written
    finally:
        await form.close()


def _counted(request: Request, most: int) -> Request:
    """The request, with its body refused once more than `most` bytes of it arrived (the form parser reads
    whatever it is sent)."""
    seen = 0

    async def receive() -> Message:
        nonlocal seen
        message = await request.receive()
        seen += len(message.get("body", b""))
        if seen > most:
            raise BodyTooLargeError(f"an upload over the bound of {most} bytes", hint=TOO_LARGE_HINT)
        return message

    return Request(request.scope, receive)


async def _octets(request: Request, files: Files, path: GuestPath, user: GuestUser | None) -> Entry:
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("identity", "gzip"):
        raise InvalidError(f"content encoding {encoding!r}", hint="send the file as it is, or gzip-encoded")
    inflate = zlib.decompressobj(wbits=31) if encoding == "gzip" else None
    with tempfile.SpooledTemporaryFile(max_size=SPOOL) as spool:
        size = 0
        async for piece in request.stream():
            data = inflate.decompress(piece, MAX_FILE + 1 - size) if inflate is not None else piece
            size += len(data)
            if size > MAX_FILE:
                raise BodyTooLargeError(f"an upload over the bound of {MAX_FILE} bytes", hint=TOO_LARGE_HINT)
            spool.write(data)
        if inflate is not None:
            spool.write(inflate.flush())
        spool.seek(0)
        return await blocking(files.write, path, user, spool)
