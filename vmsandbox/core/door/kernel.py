"""Who holds the other end of an accepted connection, as the kernel says it: on a Unix socket SO_PEERCRED; on
loopback TCP the one socket at the client's address and port connected to ours, asked for by its 4-tuple over
NETLINK_SOCK_DIAG (inet_diag: the request `ss` makes, answered from the kernel's hash table, whatever the size
of the socket table — /proc/net/tcp is read whole, and another account can make it as long as it likes). More
than a few connections at once are asked for in one dump whose filter (the server's address and port) the kernel
runs: it answers with the sockets connected to that server only.

Only a live socket somebody still holds counts: ESTABLISHED (or half-closed by its holder, FIN_WAIT1/2) with an
inode. A TIME_WAIT socket, an orphan its holder closed, a listener or a half-open socket that happens to sit at
the address is none of these and names nobody — a TIME_WAIT row says uid 0 whoever made it — so it is refused,
as a socket that is not found is.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300
NLMSG_ERROR = 0x2
NLMSG_DONE = 0x3
INET_DIAG_REQ_BYTECODE = 1
INET_DIAG_BC_D_COND = 8  # the socket's remote address (a prefix) and port
NO_COOKIE = 0xFFFFFFFF  # INET_DIAG_NOCOOKIE: the socket is named by its addresses alone
ALL_STATES = 0xFFFFFFFF

_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port
_REQUEST = struct.Struct("=BBBBI")  # inet_diag_req_v2: family, protocol, extensions, pad, states
_ID = struct.Struct("!HH16s16s")  # inet_diag_sockid: source and destination port and address (network order)
_ID_REST = struct.Struct("=III")  # its interface and cookie (host order)
_MESSAGE = struct.Struct("=BBBB")  # inet_diag_msg: family, state, timer, retransmits; then its sockid
_MESSAGE_REST = struct.Struct("=IIIII")  # expires, rqueue, wqueue, uid, inode
_ATTRIBUTE = struct.Struct("=HH")  # nlattr: length, type
_OP = struct.Struct("=BBH")  # inet_diag_bc_op: code, where to go on a match, where on none (bytes ahead)
_HOSTCOND = struct.Struct("=BBxxi")  # inet_diag_hostcond: family, prefix length, port (then the address)

ESTABLISHED, FIN_WAIT1, FIN_WAIT2 = 1, 4, 5
LIVE = frozenset({ESTABLISHED, FIN_WAIT1, FIN_WAIT2})  # (TIME_WAIT is 6; LISTEN 10; SYN_SENT 2)
LIVE_STATES = sum(1 << state for state in LIVE)
FEW = 4  # connections asked for one by one (a hash lookup each); more, in one dump
MOST_ANSWER_SECONDS = 5.0  # a dump's answer, whole: past this, nobody is named
LOOKUP_SECONDS = 2.0  # each reply (before Linux 6.9 a request may wait on a lock every account's requests take)


@dataclass(frozen=True)
class Row:
    """What inet_diag says of one socket."""

    family: int
    state: int
    local: tuple[str, int]
    remote: tuple[str, int]
    uid: int
    inode: int


def _packed(family: int, host: str) -> bytes:
    return socket.inet_pton(family, host).ljust(16, b"\0")


def request(family: int, local: tuple[str, int], remote: tuple[str, int], sequence: int = 1) -> bytes:
    """The netlink message that asks for the one TCP socket at `local` connected to `remote`."""
    body = _REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, ALL_STATES)
    body += _ID.pack(local[1], remote[1], _packed(family, local[0]), _packed(family, remote[0]))
    body += _ID_REST.pack(0, NO_COOKIE, NO_COOKIE)
    return _HEADER.pack(_HEADER.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, sequence, 0) + body


def dump_request(family: int, server: tuple[str, int], sequence: int = 1) -> bytes:
    """The netlink message that asks for every live TCP socket connected to `server` (its address and port, in a
    filter the kernel runs: it answers with those sockets only, whatever else the table holds)."""
    address = socket.inet_pton(family, server[0])
    cond = _HOSTCOND.pack(family, 8 * len(address), server[1]) + address
    length = _OP.size + len(cond)
    code = _OP.pack(INET_DIAG_BC_D_COND, length, length + 4) + cond  # (a match: on to the end, accepted; none: past it)
    attribute = _ATTRIBUTE.pack(_ATTRIBUTE.size + len(code), INET_DIAG_REQ_BYTECODE) + code
    body = _REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, LIVE_STATES)
    body += _ID.pack(0, 0, b"\0" * 16, b"\0" * 16) + _ID_REST.pack(0, NO_COOKIE, NO_COOKIE) + attribute
    flags = NLM_F_REQUEST | NLM_F_DUMP
    return _HEADER.pack(_HEADER.size + len(body), SOCK_DIAG_BY_FAMILY, flags, sequence, 0) + body


def messages(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """Each netlink message in one datagram: its type, sequence number and whole bytes."""
    at = 0
    while at + _HEADER.size <= len(data):
        length, kind, _flags, seq, _port = _HEADER.unpack_from(data, at)
        if length < _HEADER.size or at + length > len(data):
            return
        yield kind, seq, data[at : at + length]
        at += (length + 3) & ~3


def parse(data: bytes, sequence: int = 1) -> Row | None:
    """The socket a reply describes; None for an error (ENOENT: no such socket) or anything unexpected."""
    if len(data) < _HEADER.size:
        return None
    length, kind, _flags, seq, _port = _HEADER.unpack_from(data)
    want = _HEADER.size + _MESSAGE.size + _ID.size + _ID_REST.size + _MESSAGE_REST.size
    if kind == NLMSG_ERROR or seq != sequence or length < want or len(data) < want:
        return None
    family, state, _timer, _retrans = _MESSAGE.unpack_from(data, _HEADER.size)
    if family not in (socket.AF_INET, socket.AF_INET6):
        return None
    at = _HEADER.size + _MESSAGE.size
    sport, dport, src, dst = _ID.unpack_from(data, at)
    at += _ID.size + _ID_REST.size
    _expires, _rq, _wq, uid, inode = _MESSAGE_REST.unpack_from(data, at)
    size = 4 if family == socket.AF_INET else 16
    local = (socket.inet_ntop(family, src[:size]), sport)
    remote = (socket.inet_ntop(family, dst[:size]), dport)
    return Row(family, state, local, remote, uid, inode)


_thread = threading.local()  # each thread's netlink socket (the gate's judge's), kept: asking needs no descriptor


def _netlink() -> tuple[socket.socket, int]:
    """This thread's netlink socket (made once: a crowd that takes every free descriptor of the process cannot
    make a lookup fail, and so refuse the person), and the sequence number of its next request."""
    nl: socket.socket | None = getattr(_thread, "nl", None)
    if nl is None:
        nl = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG)
        nl.settimeout(LOOKUP_SECONDS)
        _thread.nl, _thread.sequence = nl, 0
    _thread.sequence = _thread.sequence % 0xFFFFFFFF + 1
    return nl, _thread.sequence


def lookup(family: int, local: tuple[str, int], remote: tuple[str, int], wait: float = LOOKUP_SECONDS) -> Row | None:
    """inet_diag's answer for the TCP socket at `local` connected to `remote` (None: none, or no answer within
    `wait` seconds)."""
    try:
        nl, sequence = _netlink()
        nl.settimeout(max(0.01, wait))
        nl.sendto(request(family, local, remote, sequence), (0, 0))
        while True:
            data = nl.recv(8192)
            if len(data) >= _HEADER.size and _HEADER.unpack_from(data)[3] == sequence:
                return parse(data, sequence)
            # (the answer to an earlier request that was given up on: read on to this one's)
    except OSError:
        with contextlib.suppress(AttributeError, OSError):
            _thread.nl.close()
        _thread.nl = None  # (made again by the next lookup)
        return None


def dump(family: int, server: tuple[str, int]) -> list[Row] | None:
    """inet_diag's rows of every live TCP socket connected to `server` (None: no whole answer in time)."""
    deadline = time.monotonic() + MOST_ANSWER_SECONDS
    rows: list[Row] = []
    try:
        nl, sequence = _netlink()
        nl.sendto(dump_request(family, server, sequence), (0, 0))
        while (left := deadline - time.monotonic()) > 0:
            nl.settimeout(min(LOOKUP_SECONDS, left))
            for kind, seq, message in messages(nl.recv(65536)):
                if seq != sequence:
                    continue  # (the answer to an earlier request that was given up on)
                if kind == NLMSG_DONE:
                    return rows
                if kind == NLMSG_ERROR:
                    return None
                row = parse(message, sequence)
                if row is not None:
                    rows.append(row)
    except OSError:
        pass
    with contextlib.suppress(AttributeError, OSError):
        _thread.nl.close()
    _thread.nl = None  # (made again by the next request: what is left of this answer goes with it)
    return None


def holder(row: Row | None, family: int, local: tuple[str, int], remote: tuple[str, int]) -> int | None:
    """The uid of the account that holds the socket `row` describes, if it is a live one at exactly that 4-tuple."""
    if row is None or row.family != family or row.state not in LIVE or row.inode == 0:
        return None
    same = _packed(family, row.local[0]) == _packed(family, local[0]) and row.local[1] == local[1]
    if not same or _packed(family, row.remote[0]) != _packed(family, remote[0]) or row.remote[1] != remote[1]:
        return None
    return row.uid


def tcp_holder(
    family: int, client: tuple[str, int], server: tuple[str, int], wait: float = LOOKUP_SECONDS
) -> int | None:
    """Who holds the client's end of a loopback TCP connection to `server` (a blocking call, `wait` seconds at
    most: the gate's judge makes it, in a thread of its own)."""
    client, server = (client[0], client[1]), (server[0], server[1])  # (IPv6 names carry flow and scope)
    if wait <= 0:
        return None
    return holder(lookup(family, client, server, wait), family, client, server)


def tcp_holders(
    family: int, server: tuple[str, int], clients: Collection[tuple[str, int]]
) -> dict[tuple[str, int], int | None]:
    """Who holds each client's end of a loopback TCP connection to `server`: a lookup each for a few, one dump of
    the sockets connected to `server` for more (a crowd costs the kernel one request, not one per connection)."""
    server = (server[0], server[1])
    wanted = [(c[0], c[1]) for c in clients]
    if len(wanted) <= FEW:  # (their answers, together, within MOST_ANSWER_SECONDS as a dump's)
        deadline = time.monotonic() + MOST_ANSWER_SECONDS
        return {c: tcp_holder(family, c, server, deadline - time.monotonic()) for c in wanted}
    rows = dump(family, server)
    if rows is None:
        return dict.fromkeys(wanted)
    by_client = {(_packed(family, r.local[0]), r.local[1]): r for r in rows if r.family == family}
    return {c: holder(by_client.get((_packed(family, c[0]), c[1])), family, c, server) for c in wanted}


def unix_holder(sock: socket.socket) -> int | None:
    """Who connected to a Unix socket (SO_PEERCRED, taken when they connected)."""
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)
