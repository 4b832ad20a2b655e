"""Byte streams for the proxy: asyncio streams with push-back, server-side TLS over bytes already read (so
the ClientHello the proxy inspected is the one the handshake uses), and bounded reads of a request head and
of a ClientHello."""

from __future__ import annotations

import asyncio
import contextlib
import ssl

from vmsandbox.egress.rules import httphead, tlshello
from vmsandbox.egress.rules.httphead import ProtocolError
from vmsandbox.egress.rules.netpolicy import Refused

CHUNK = 64 * 1024
SEND_TIMEOUT = 60.0  # a peer that takes no byte of what waits for it for this long is dropped


class Stream:
    """A byte stream with push-back, over asyncio streams. Sending to a peer that does not read times out
    (TimeoutError after `send_timeout` seconds), and so does closing: the connection is then dropped."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, send_timeout: float = SEND_TIMEOUT
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.pending = bytearray()
        self.send_timeout = send_timeout

    async def recv(self, n: int = CHUNK) -> bytes:
        if self.pending:
            data = bytes(self.pending[:n])
            del self.pending[:n]
            return data
        return await self._recv(n)

    async def _recv(self, n: int) -> bytes:
        return await self.reader.read(n)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        async with asyncio.timeout(self.send_timeout):
            await self.writer.drain()

    async def send_eof(self) -> None:
        if self.writer.can_write_eof():
            with contextlib.suppress(OSError):
                self.writer.write_eof()

    async def close(self) -> None:
        """Close, after what waits is sent; dropped at once when the peer takes none of it in time."""
        waiting = self.writer.transport.get_write_buffer_size()
        self.writer.close()
        try:
            async with asyncio.timeout(self.send_timeout if waiting else None):  # (nothing waits: closed at once)
                await self.writer.wait_closed()
        except Exception:  # noqa: BLE001 - whatever ends the wait, the connection goes
            self.writer.transport.abort()


class TlsStream(Stream):
    """The server side of TLS over a Stream whose first bytes (the ClientHello) were already read, through
    memory BIOs, so the hello the proxy inspected is the one the handshake uses."""

    def __init__(self, inner: Stream, ctx: ssl.SSLContext, first: bytes) -> None:
        super().__init__(inner.reader, inner.writer, send_timeout=inner.send_timeout)
        self.inner = inner
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._tls = ctx.wrap_bio(self._in, self._out, server_side=True)
        self._in.write(first)

    async def _flush(self) -> None:
        data = self._out.read()
        if data:
            await self.inner.send(data)

    async def _fill(self) -> None:
        await self._flush()
        data = await self.inner.recv()
        if data:
            self._in.write(data)
        else:
            self._in.write_eof()

    async def handshake(self) -> None:
        while True:
            try:
                self._tls.do_handshake()
            except ssl.SSLWantReadError:
                await self._fill()
                continue
            await self._flush()
            return

    async def _recv(self, n: int) -> bytes:
        while True:
            try:
                return self._tls.read(n)
            except ssl.SSLWantReadError:
                await self._fill()
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""

    async def send(self, data: bytes) -> None:
        self._tls.write(data)
        await self._flush()

    async def send_eof(self) -> None:
        return  # no half-close in TLS: the connection ends when the upstream ends


async def read_head(stream: Stream) -> bytes:
    """Read a message head up to the empty line; the rest stays pending in the stream."""
    buf = bytearray(stream.pending)
    stream.pending.clear()
    while True:
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            stream.pending[:0] = buf[end + 4 :]
            return bytes(buf[: end + 4])
        if len(buf) > httphead.MAX_HEAD:
            raise ProtocolError("request head too large")
        data = await stream._recv(CHUNK)
        if not data:
            if buf:
                raise ProtocolError("connection closed inside the request head")
            raise EOFError
        buf += data


async def read_hello(stream: Stream) -> bytes:
    """The bytes of the guest's ClientHello (b'' if the guest does not speak TLS first)."""
    buf = bytearray()
    while True:
        data = await stream.recv()
        if not data:
            raise EOFError
        buf += data
        if not tlshello.is_tls(bytes(buf)):
            return b"" if not buf else unread(stream, buf)
        try:
            end = tlshello.needed(bytes(buf))
        except tlshello.HelloError as exc:
            raise Refused(f"bad TLS ClientHello: {exc}") from None
        if end:
            return bytes(buf)


def unread(stream: Stream, data: bytearray) -> bytes:
    stream.pending[:0] = data
    return b""
