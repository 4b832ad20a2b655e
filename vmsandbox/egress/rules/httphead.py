"""Strict parsing and rendering of HTTP/1.x message heads for the egress proxy (pure functions).

Anything ambiguous is refused rather than guessed: folded lines, bare CR or LF, both Content-Length and
Transfer-Encoding, two Host headers, a length that is not ASCII digits, a transfer coding other than chunked.
How the body is framed is decided here, from the head as the guest sent it (`RequestHead.body`), and the head
sent upstream carries exactly that framing, whatever `Connection` names (body.py carries that body and nothing
after it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MAX_HEAD = 32 * 1024
MAX_HEADERS = 100
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]*")
_VERSION = re.compile(r"HTTP/1\.[01]")
_LENGTH = re.compile(r"[0-9]{1,18}")  # ASCII digits only ("²".isdigit() is True; int() refuses it)
FRAMING = frozenset({"host", "content-length", "transfer-encoding"})  # set by the proxy on the way up, never kept
# Hop-by-hop headers (RFC 9110 7.6.1) and the proxy's own: never passed on.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "upgrade",
    }
)


class ProtocolError(ValueError):
    """A malformed or ambiguous message head; the proxy answers 400 and logs it."""


@dataclass(frozen=True)
class Body:
    """How a request's body is framed: `length` bytes, or chunked (None); `stated`: the head said so."""

    length: int | None = 0
    stated: bool = False

    def headers(self) -> list[tuple[str, str]]:
        """The framing header the request goes upstream with."""
        if self.length is None:
            return [("Transfer-Encoding", "chunked")]
        return [("Content-Length", str(self.length))] if self.stated else []


@dataclass
class RequestHead:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]
    body: Body = field(default_factory=Body)

    def get(self, name: str) -> list[str]:
        lname = name.lower()
        return [v for k, v in self.headers if k.lower() == lname]

    def without(self, *names: str) -> list[tuple[str, str]]:
        drop = {n.lower() for n in names}
        return [(k, v) for k, v in self.headers if k.lower() not in drop]


def parse_request(raw: bytes) -> RequestHead:
    """Parse a request head (request line + headers, ending with an empty line)."""
    if len(raw) > MAX_HEAD:
        raise ProtocolError("request head too large")
    if not raw.endswith(b"\r\n\r\n"):
        raise ProtocolError("incomplete request head")
    text = raw[:-4].decode("latin-1")
    lines = text.split("\r\n")
    if any("\r" in line or "\n" in line or "\0" in line for line in lines):
        raise ProtocolError("bare CR, LF or NUL in the request head")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        raise ProtocolError("malformed request line")
    method, target, version = parts
    if not _TOKEN.fullmatch(method) or not _VERSION.fullmatch(version) or not target:
        raise ProtocolError("malformed request line")
    if len(lines) - 1 > MAX_HEADERS:
        raise ProtocolError("too many header fields")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        if line[:1] in (" ", "\t"):
            raise ProtocolError("folded header lines are not accepted")
        name, sep, value = line.partition(":")
        if not sep or not _TOKEN.fullmatch(name):
            raise ProtocolError("malformed header field")
        value = value.strip(" \t")
        if not _VALUE.fullmatch(value):
            raise ProtocolError("control characters in a header value")
        headers.append((name, value))
    head = RequestHead(method.upper(), target, version, headers)
    head.body = _framing(head)
    return head


def _framing(head: RequestHead) -> Body:
    """The body's framing; refuse heads whose framing or target host two parsers could read differently."""
    lengths = set(head.get("content-length"))
    codings = [t.strip().lower() for v in head.get("transfer-encoding") for t in v.split(",")]
    if len(head.get("host")) > 1:
        raise ProtocolError("more than one Host header")
    if codings and lengths:
        raise ProtocolError("both Content-Length and Transfer-Encoding")
    if codings:
        if codings != ["chunked"] or head.version != "HTTP/1.1":
            raise ProtocolError("a transfer coding other than chunked (or in HTTP/1.0)")
        body = Body(None, stated=True)
    elif lengths:
        if len(lengths) > 1 or not all(_LENGTH.fullmatch(v) for v in lengths):
            raise ProtocolError("bad Content-Length")
        body = Body(int(lengths.pop()), stated=True)
    else:
        body = Body()
    if head.method == "CONNECT" and body.length != 0:
        raise ProtocolError("a CONNECT request carries no body")
    return body


def connection_tokens(head: RequestHead) -> set[str]:
    """Header names listed in Connection (also hop-by-hop)."""
    return {t.strip().lower() for v in head.get("connection") for t in v.split(",") if t.strip()}


def forward_headers(head: RequestHead, host_header: str) -> list[tuple[str, str]]:
    """The headers to send upstream: no hop-by-hop ones, the given Host, the body's framing as parsed from the
    head the guest sent (whatever `Connection` names), and Connection: close (one request per upstream
    connection, so every request passes the policy on its own)."""
    drop = HOP_BY_HOP | connection_tokens(head) | FRAMING
    kept = [(k, v) for k, v in head.headers if k.lower() not in drop]
    return [("Host", host_header), *kept, *head.body.headers(), ("Connection", "close")]


def render_request(method: str, target: str, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def render_response(status: int, reason: str, body: str, extra: list[tuple[str, str]] | None = None) -> bytes:
    payload = body.encode("utf-8", errors="replace")
    headers = [
        ("Content-Type", "text/plain; charset=utf-8"),
        ("Content-Length", str(len(payload))),
        ("Connection", "close"),
        *(extra or []),
    ]
    lines = [f"HTTP/1.1 {status} {reason}", *(f"{k}: {_printable(v)}" for k, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", errors="replace") + payload


def _printable(value: str) -> str:
    return "".join(c if " " <= c <= "~" else "?" for c in value)[:300]
