"""A request's body, carried upstream exactly as its head frames it, and not a byte more; and the relay of
both ways after a head.

Content-Length bytes are counted; a chunked body is read chunk by chunk (each size line checked, each chunk's
CRLF checked, the trailers read and dropped) up to its last chunk. Whatever the guest sends after that (a
second request on the same connection, pipelined) never goes upstream: the upstream was asked for one request
(`Connection: close`), the guest gets that one answer and then the end of the connection.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import Coroutine
from typing import Any

from vmsandbox.egress.proxylog import Event
from vmsandbox.egress.relay.streams import CHUNK, Stream
from vmsandbox.egress.rules.httphead import MAX_HEAD, Body, ProtocolError

AFTER_THE_REQUEST = "bytes after the request were not passed on (one request per connection)"
MAX_SIZE_LINE = 4096  # a chunk's size line, extensions included
_SIZE_LINE = re.compile(rb"([0-9A-Fa-f]{1,15})[ \t]*(;[\t\x20-\x7e]*)?")


async def _recv(client: Stream, n: int, timeout: float) -> bytes:
    async with asyncio.timeout(timeout):
        data = await client.recv(n)
    if not data:
        raise ProtocolError("the connection ended inside the request body")
    return data


async def _line(client: Stream, timeout: float) -> bytes:
    """One CRLF-ended line of the body's framing (without its CRLF); what follows stays pending."""
    buf = bytearray()
    while (end := buf.find(b"\r\n")) < 0:
        if len(buf) > MAX_SIZE_LINE:
            raise ProtocolError("a chunk size line or trailer too long")
        buf += await _recv(client, CHUNK, timeout)
    client.pending[:0] = buf[end + 2 :]
    line = bytes(buf[:end])
    if b"\r" in line or b"\n" in line or b"\0" in line:
        raise ProtocolError("bare CR, LF or NUL in the body's framing")
    return line


async def _exactly(client: Stream, upstream: Stream, n: int, timeout: float) -> None:
    while n:
        data = await _recv(client, min(n, CHUNK), timeout)
        await upstream.send(data)
        n -= len(data)


async def carry(client: Stream, upstream: Stream, body: Body, timeout: float) -> int:
    """Send the body `body` frames from client to upstream; the bytes sent. ProtocolError when the guest's
    chunks are malformed (the upstream has then had part of a body: the caller ends both connections)."""
    if body.length is not None:
        await _exactly(client, upstream, body.length, timeout)
        return body.length
    sent = 0
    while True:
        line = await _line(client, timeout)
        found = _SIZE_LINE.fullmatch(line)
        if found is None:
            raise ProtocolError("a malformed chunk size line")
        size = int(found.group(1), 16)
        head = found.group(1) + b"\r\n"  # its extensions are not passed on
        await upstream.send(head)
        sent += len(head)
        if size == 0:
            break
        await _exactly(client, upstream, size, timeout)
        if await _line(client, timeout) != b"":
            raise ProtocolError("a chunk longer than its size")
        await upstream.send(b"\r\n")
        sent += size + 2
    trailers = 0
    while line := await _line(client, timeout):  # trailers: read, checked for size, never passed on
        trailers += len(line) + 2
        if trailers > MAX_HEAD:
            raise ProtocolError("trailers too large")
    await upstream.send(b"\r\n")
    return sent + 2


async def _within(receiving: Coroutine[Any, Any, bytes], timeout: float) -> bytes:
    async with asyncio.timeout(timeout):
        return await receiving


async def relay(client: Stream, upstream: Stream, ev: Event, body: Body | None, idle: float) -> None:
    """Copy both ways until the upstream is done. With a `body` (a request), exactly that body goes up and what
    follows it is read and dropped (said in the event); without (a TLS tunnel), everything; a half-closed guest
    side is passed on. A malformed body ends both connections (ProtocolError)."""

    async def guest_to_upstream() -> None:
        try:
            if body is not None:
                ev.up += await carry(client, upstream, body, idle)
                while await client.recv():  # a pipelined request: never passed on
                    if AFTER_THE_REQUEST not in (ev.reason or ""):
                        ev.reason = f"{ev.reason}; {AFTER_THE_REQUEST}" if ev.reason else AFTER_THE_REQUEST
            else:
                while data := await _within(client.recv(), idle):
                    ev.up += len(data)
                    await upstream.send(data)
            await upstream.send_eof()
        except (OSError, TimeoutError, ssl.SSLError):
            return  # the guest's side ended (or went quiet): the answer still comes

    async def upstream_to_guest() -> None:
        while data := await _within(upstream.recv(), idle):
            ev.down += len(data)
            ev.answered = True
            await client.send(data)

    sending = asyncio.create_task(guest_to_upstream())
    receiving = asyncio.create_task(upstream_to_guest())
    try:
        await asyncio.wait({sending, receiving}, return_when=asyncio.FIRST_COMPLETED)
        failed = sending.exception() if sending.done() else None
        if failed is not None:
            raise failed
        await receiving
    finally:
        for task in (sending, receiving):
            task.cancel()
        await asyncio.gather(sending, receiving, return_exceptions=True)
