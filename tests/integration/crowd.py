"""Another local account's load on a front end, run as that account by test_frontdoor_load.py (standard library
only: it is started as `python crowd.py …` by an account that imports nothing of ours).

    crowd.py table PAIRS            hold PAIRS connected loopback pairs (2 * PAIRS rows of the kernel's socket
                                    table), print `ready`, and hold them until stdin closes
    crowd.py flood COUNT HOST:PORT...  connect COUNT times to each address (sending nothing), print `ready` once the
                                    first round is made, then close them and connect again, round after round,
                                    until stdin closes (looked at every STOP_EVERY connections, so that a round
                                    in progress ends too); then print what the rounds saw, as JSON
"""

from __future__ import annotations

import contextlib
import json
import resource
import select
import socket
import sys
import time

CONNECT_SECONDS = 5.0  # a connection the kernel's queue has no room for is counted failed, not waited on
STOP_EVERY = 100


def _more_descriptors() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _told_to_stop(wait: float = 0.0) -> bool:
    readable, _, _ = select.select([sys.stdin], [], [], wait)
    return bool(readable) and sys.stdin.readline() == ""


def table(pairs: int) -> None:
    _more_descriptors()
    held = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4096)
        for _ in range(pairs):
            held.append(socket.create_connection(listener.getsockname()))
            held.append(listener.accept()[0])
    print("ready", flush=True)
    while not _told_to_stop(3600):
        pass


def _round(count: int, ports: list[tuple[str, int]], first: bool = False) -> dict[str, dict[str, int]]:
    seen = {}
    for port in ports:
        made: list[socket.socket] = []
        failed = 0
        for n in range(count):
            if not first and n % STOP_EVERY == 0 and _told_to_stop():
                break
            try:
                made.append(socket.create_connection(port, timeout=CONNECT_SECONDS))
            except OSError:
                failed += 1
        refused = 0
        for s in made:  # what the server answered before it closed them (a 403), read without waiting
            s.setblocking(False)
            with contextlib.suppress(OSError):
                refused += s.recv(64).startswith(b"HTTP/1.1 403")
            s.close()
        seen[f"{port[0]}:{port[1]}"] = {"made": len(made), "failed": failed, "answered_403": refused}
    return seen


def flood(count: int, ports: list[tuple[str, int]]) -> None:
    _more_descriptors()
    start = time.monotonic()
    rounds = [_round(count, ports, first=True)]
    print("ready", flush=True)
    while not _told_to_stop():
        rounds.append(_round(count, ports))
    print(json.dumps({"rounds": rounds, "seconds": time.monotonic() - start}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "table":
        table(int(sys.argv[2]))
    else:
        flood(int(sys.argv[2]), [(p.rsplit(":", 1)[0], int(p.rsplit(":", 1)[1])) for p in sys.argv[3:]])
