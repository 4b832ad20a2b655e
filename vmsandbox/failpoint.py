"""Named fail-points: the places where a fault test may stop the product, as a crash would (the gofail /
fail-rs pattern). The only action is to kill this process with SIGKILL: a fail-point can never change a
decision, skip a check or weaken anything — it can only make vmsandbox die at a named point.

Off unless turned on through the environment:

    VMSANDBOX_FAILPOINTS="pull.apply=kill-after:15"    # die at the 16th hit of pull.apply

Names (each is hit where the code says `failpoint.hit(NAME)`):
    run.capture     after the baseline copy, before the workspace disk is made
    run.boot        the domain created, before the wait for its sshd (a cold start)
    run.restore     the template restored, before the workspace disk is attached (a warm start)
    template.boot   a template's domain created, before the wait for it to boot
    run.egress      the egress daemon spawned, before its door is open
    run.gather      the guest's files fetched to the mirror, before they are compared
    pull.apply      before each change a pull (or recover, or run's review) applies
    apply.chunk     before each chunk of a file written into the project or the outbox (mid-file)
    export.item     before each change exported to the outbox
    push.send       before the project is sent into the guest
    destroy.stop    the egress daemon stopped, before the domain is destroyed
    run.teardown    in the background process that ends a `run`, before it destroys the VM
    image.begin     a build's leftovers removed and its temporary directory made, before debootstrap
    image.bootstrap debootstrap done, before the rootfs is configured
    image.convert   the raw filesystem made, before it is converted to qcow2
"""

from __future__ import annotations

import os
import signal

ENV = "VMSANDBOX_FAILPOINTS"
POINTS = frozenset(
    {
        "run.capture",
        "run.boot",
        "run.restore",
        "template.boot",
        "run.egress",
        "run.gather",
        "pull.apply",
        "apply.chunk",
        "export.item",
        "push.send",
        "destroy.stop",
        "run.teardown",
        "image.begin",
        "image.bootstrap",
        "image.convert",
    }
)
_hits: dict[str, int] = {}


def _armed() -> dict[str, int]:
    """name -> hits allowed before the kill."""
    armed: dict[str, int] = {}
    for item in filter(None, (i.strip() for i in os.environ.get(ENV, "").split(","))):
        name, _, action = item.partition("=")
        verb, _, count = action.partition(":")
        if name in POINTS and verb == "kill-after" and count.isdigit():
            armed[name] = int(count)
    return armed


def hit(name: str) -> None:
    """Pass a fail-point: nothing happens unless a test armed it."""
    if name not in POINTS:
        raise ValueError(f"unknown fail-point {name!r}")
    allowed = _armed().get(name)
    if allowed is None:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] > allowed:
        os.kill(os.getpid(), signal.SIGKILL)
