"""What one session's egress daemon may take, in one place (docs/security.md states these numbers).

Each bound holds by construction, and the kernel holds the process to a ceiling above it as well, so a path
nobody thought of still meets a limit: a connection is a slot of a pump (pump.py) whatever it sends, one thread
carries every connection, and the process's descriptors (RLIMIT_NOFILE) and, under a uid of its own, its
threads (RLIMIT_NPROC) are capped. A daemon that meets a ceiling refuses the connection that met it and goes on.
"""

from __future__ import annotations

import resource
from collections.abc import Callable
from dataclasses import dataclass

Getter = Callable[[int], tuple[int, int]]


@dataclass(frozen=True)
class Limits:
    """The bounds of one daemon; a test sets its own (small timeouts), the product takes these."""

    connections: int = 128  # guest connections to its door at once (each: 3 descriptors, a socket pair, an upstream)
    published: int = 64  # connections to its published ports at once (each: 1 descriptor, the client's)
    head_timeout: float = 30.0  # a request head, whole
    hello_timeout: float = 15.0  # a TLS ClientHello, or a handshake with the session CA
    send_timeout: float = 60.0  # a peer that takes no byte of what waits for it for this long is dropped
    idle_timeout: float = 600.0  # nothing either way (an agent may wait minutes for an answer's next part)
    window: int = 256 * 1024  # SSH window per channel: the most a guest may send that we have not read
    stall: float = 30.0  # an SSH write blocked this long (the guest stopped reading): the link is made again
    resolver_threads: int = 4  # name lookups at once (the others queue; each has RESOLVE_TIMEOUT)
    files: int = 4096  # RLIMIT_NOFILE: by construction it uses at most 3 * 128 + 64 + about 30
    tasks: int = 256  # RLIMIT_NPROC of its own uid: it runs about 10 threads plus one per published address


def process_limits(limits: Limits, *, own_uid: bool, get: Getter = resource.getrlimit) -> dict[int, tuple[int, int]]:
    """The resource limits to set on the daemon (no higher than the ones it has): descriptors always, threads
    only under a uid of its own (RLIMIT_NPROC counts every process of the uid: the invoking user's too)."""
    wanted = {resource.RLIMIT_NOFILE: limits.files}
    if own_uid:
        wanted[resource.RLIMIT_NPROC] = limits.tasks
    found: dict[int, tuple[int, int]] = {}
    for which, cap in wanted.items():
        _soft, hard = get(which)
        top = cap if hard == resource.RLIM_INFINITY else min(cap, hard)
        found[which] = (top, top)
    return found


def apply(limits: Limits, *, own_uid: bool) -> None:
    for which, values in process_limits(limits, own_uid=own_uid).items():
        resource.setrlimit(which, values)
