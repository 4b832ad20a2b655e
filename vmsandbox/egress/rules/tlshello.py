"""Reading the server name (SNI) out of a TLS ClientHello, as a pure function over bytes."""

from __future__ import annotations

RECORD_HEADER = 5
HANDSHAKE = 0x16
CLIENT_HELLO = 0x01
SNI_EXTENSION = 0x0000
# Encrypted Client Hello (RFC 9849) and its draft ESNI: the real server name travels encrypted, and the SNI in
# the clear is a decoy (the "public name") that would pass the allowlist while the TLS goes elsewhere.
HIDDEN_NAME_EXTENSIONS = {0xFE0D: "Encrypted Client Hello", 0xFFCE: "encrypted SNI"}
MAX_HELLO = 64 * 1024


class HelloError(ValueError):
    """The bytes are not a well-formed TLS ClientHello."""


def is_tls(first: bytes) -> bool:
    return len(first) >= 1 and first[0] == HANDSHAKE


def needed(data: bytes) -> int:
    """How many bytes of `data` (records from the start of a connection) hold the whole ClientHello, or 0 if
    more must be read first. HelloError when it cannot be a ClientHello or grows past MAX_HELLO."""
    handshake, end = _handshake_bytes(data)
    if len(handshake) >= 4:
        if handshake[0] != CLIENT_HELLO:
            raise HelloError("the first handshake message is not a ClientHello")
        total = 4 + int.from_bytes(handshake[1:4], "big")
        if total > MAX_HELLO:
            raise HelloError("ClientHello too large")
        if len(handshake) >= total:
            return end
    if len(data) > MAX_HELLO:
        raise HelloError("ClientHello too large")
    return 0


def _handshake_bytes(data: bytes) -> tuple[bytes, int]:
    """The handshake payload of the complete records at the start of data, and where they end."""
    out = bytearray()
    pos = 0
    while len(data) - pos >= RECORD_HEADER:
        if data[pos] != HANDSHAKE:
            raise HelloError("not a TLS handshake record")
        length = int.from_bytes(data[pos + 3 : pos + 5], "big")
        if length == 0 or length > 16384 + 2048:
            raise HelloError("bad TLS record length")
        if len(data) - pos - RECORD_HEADER < length:
            break
        out += data[pos + RECORD_HEADER : pos + RECORD_HEADER + length]
        pos += RECORD_HEADER + length
    return bytes(out), pos


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise HelloError("truncated ClientHello")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def number(self, n: int) -> int:
        return int.from_bytes(self.take(n), "big")

    def vector(self, length_bytes: int) -> bytes:
        return self.take(self.number(length_bytes))


def server_name(data: bytes) -> str | None:
    """The host_name in the SNI extension of the ClientHello at the start of data (None if it has none)."""
    handshake, _ = _handshake_bytes(data)
    r = _Reader(handshake)
    if r.number(1) != CLIENT_HELLO:
        raise HelloError("the first handshake message is not a ClientHello")
    body = _Reader(r.take(r.number(3)))
    body.take(2 + 32)  # legacy_version, random
    body.vector(1)  # legacy_session_id
    body.vector(2)  # cipher_suites
    body.vector(1)  # legacy_compression_methods
    if body.pos == len(body.data):
        return None  # no extensions at all
    extensions = _Reader(body.vector(2))
    names: list[str] = []
    while extensions.pos < len(extensions.data):
        kind = extensions.number(2)
        payload = extensions.vector(2)
        if kind in HIDDEN_NAME_EXTENSIONS:
            raise HelloError(f"{HIDDEN_NAME_EXTENSIONS[kind]} hides the real server name; it is not passed")
        if kind != SNI_EXTENSION:
            continue
        if names:
            raise HelloError("two SNI extensions")
        entries = _Reader(_Reader(payload).vector(2))
        while entries.pos < len(entries.data):
            name_type = entries.number(1)
            value = entries.vector(2)
            if name_type == 0:
                try:
                    names.append(value.decode("ascii"))
                except UnicodeDecodeError:
                    raise HelloError("SNI host name is not ASCII") from None
        if not names:
            raise HelloError("SNI extension without a host name")
    if len(names) > 1:
        raise HelloError("more than one SNI host name")
    return names[0].lower().removesuffix(".") if names else None
