"""What the two places (local/, remote/) do the same way, beside the interfaces they implement (interface.py):
a host's one connection, what libvirt says of a session's VM, and the choice between a warm and a cold start."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from vmsandbox import ui
from vmsandbox.errors import VmsandboxError
from vmsandbox.session.place.hostspec import HostSpec
from vmsandbox.session.place.interface import Host
from vmsandbox.session.record import Record
from vmsandbox.vm.node import DomainInfo
from vmsandbox.vm.virt import Hypervisor

T = TypeVar("T")
IDENTITY_TIMEOUT = 60  # a warm-started guest takes its identity in a second or two, even under TCG


def nothing() -> None:
    return None


class Connection:
    """A Host's libvirt connection (interface.Host.libvirt, .close), mixed into each place's Host."""

    spec: HostSpec
    _hv: Hypervisor | None = None

    def libvirt(self) -> Hypervisor:
        if self._hv is None:
            self._hv = Hypervisor(self.spec.uri)
        return self._hv

    def close(self) -> None:
        if self._hv is not None:
            self._hv.close()
            self._hv = None


class Domain:
    """What libvirt says of a session's VM (interface.VM.info), mixed into each place's VM."""

    host: Host
    record: Record

    def info(self) -> DomainInfo | None:
        return self.host.libvirt().info(self.record.domain)


def template_for(record: Record, ensure: Callable[[], T], *, cold: bool, unbuilt: str) -> T | None:
    """The template a session starts from (`ensure()` finds or builds it), or None — and record.start_note says
    why — for a cold boot: --cold, an image build, or `unbuilt` and the reason the template could not be had."""
    if cold or record.disk is not None:
        record.start_note = "--cold" if cold else "an image build boots its disk cold"
        return None
    try:
        return ensure()
    except VmsandboxError as exc:
        record.start_note = f"{unbuilt}: {exc.message}"
        ui.warn(f"{record.start_note}; booting cold")
        return None


def warm_or_cold(record: Record, warm_start: Callable[[], None], undo: Callable[[VmsandboxError], None]) -> bool:
    """Whether `warm_start` started the session's VM (its time recorded); when it failed, `undo(why)` has cleared
    it away, and the caller boots cold."""
    started = time.monotonic()
    try:
        warm_start()
    except VmsandboxError as exc:
        undo(exc)
        return False
    record.boot_seconds = round(time.monotonic() - started, 1)
    record.save()
    return True
