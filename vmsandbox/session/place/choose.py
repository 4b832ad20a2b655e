"""The one place that knows where a VM lives: a session's record (its `host` and `libvirt_uri`), a host named in
the config, or a libvirt URI give a Place — this machine's (session.local) or another host's
(session.remote). Policy asks here and nowhere else; a new kind of place is one more line in `_kind` and in
`KINDS`."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from vmsandbox.session.place.hostspec import LOCAL, HostSpec
from vmsandbox.session.place.interface import Place
from vmsandbox.session.place.local.place import LocalPlace
from vmsandbox.session.place.remote.place import RemotePlace
from vmsandbox.session.record import Record

KINDS: tuple[type[Place], ...] = (LocalPlace, RemotePlace)


def _kind(uri: str) -> type[Place]:
    """A libvirt on another machine (nothing on this one's file system is visible to it), or this machine's."""
    return RemotePlace if urlsplit(uri).hostname else LocalPlace


def of(record: Record) -> Place:
    """Where the session's VM lives."""
    return _kind(record.libvirt_uri)(HostSpec(record.host, record.libvirt_uri))


def of_host(spec: HostSpec | None, libvirt_uri: str) -> Place:
    """Where a new session goes: the host `spec` names, or (None) this machine, whose libvirt is `libvirt_uri`."""
    chosen = spec or HostSpec(LOCAL, libvirt_uri)
    return _kind(chosen.uri)(chosen)


def of_uri(uri: str) -> Place:
    """The place whose libvirt is `uri` (a session whose record cannot be read is known by its URI only)."""
    return _kind(uri)(HostSpec(urlsplit(uri).hostname or LOCAL, uri))


def release_any(root: Path) -> None:
    """A session whose record cannot be read (so whose place is not known): what any kind of place runs on this
    machine for it, stopped."""
    for kind in KINDS:
        kind.release(root)


def every(libvirt_uri: str, configured: tuple[HostSpec, ...]) -> list[Place]:
    """This machine first, then the configured hosts."""
    return [of_host(None, libvirt_uri), *(of_host(h, libvirt_uri) for h in configured)]
