"""The one place that knows where a VM lives: a session's record (its `host` and `libvirt_uri`), a host named in
the config, or a libvirt URI give a Host — this machine's (local/) or another host's (remote/) — made with the
one connection an operation uses, and closed when it ends. Policy asks here and nowhere else; a new kind of
place is one more line in `_kind`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

from vmsandbox.session.place.hostspec import LOCAL, HostSpec
from vmsandbox.session.place.interface import VM, Abilities, Host
from vmsandbox.session.place.local.place import LocalHost
from vmsandbox.session.place.remote import tunnel
from vmsandbox.session.place.remote.place import RemoteHost
from vmsandbox.session.record import Record


def _kind(uri: str) -> type[Host]:
    """A libvirt on another machine (nothing on this one's file system is visible to it), or this machine's."""
    return RemoteHost if urlsplit(uri).hostname else LocalHost


def abilities(uri: str) -> Abilities:
    """What the place whose libvirt is `uri` can do (known without asking it)."""
    return _kind(uri).abilities


def spec_of(record: Record) -> HostSpec:
    """The host the session's VM lives on."""
    return HostSpec(record.host, record.libvirt_uri)


def spec_for(spec: HostSpec | None, libvirt_uri: str) -> HostSpec:
    """Where a new session goes: the host `spec` names, or (None) this machine, whose libvirt is `libvirt_uri`."""
    return spec or HostSpec(LOCAL, libvirt_uri)


def spec_at(uri: str) -> HostSpec:
    """The host whose libvirt is `uri` (a session whose record cannot be read is known by its URI only)."""
    return HostSpec(urlsplit(uri).hostname or LOCAL, uri)


@contextlib.contextmanager
def host(spec: HostSpec) -> Iterator[Host]:
    """The host `spec` names, for one operation: its connection opened at its first use, closed at the end."""
    made = _kind(spec.uri)(spec)
    try:
        yield made
    finally:
        made.close()


@contextlib.contextmanager
def host_of(record: Record) -> Iterator[Host]:
    """The host the session's VM lives on, for one operation (its VM: `.vm(record)`)."""
    with host(spec_of(record)) as there:
        yield there


@contextlib.contextmanager
def vm_of(record: Record) -> Iterator[VM]:
    """The session's VM, on its host's connection for one operation."""
    with host_of(record) as there:
        yield there.vm(record)


class Hosts:
    """The hosts an operation over many sessions asks (`ls`, `gc`): one each per libvirt URI (the first spec
    given for it names it: `known`, the configured ones), its connection opened at its first use; `here` is
    this machine's libvirt as the config names it now."""

    def __init__(self, here: str, known: Iterable[HostSpec] = ()) -> None:
        self.here = here
        self._made: dict[str, Host] = {}
        for spec in known:
            self.at(spec)

    def at(self, spec: HostSpec) -> Host:
        if spec.uri not in self._made:
            self._made[spec.uri] = _kind(spec.uri)(spec)
        return self._made[spec.uri]

    def of(self, record: Record) -> Host:
        """The host asked about the session: its own; for a session on this machine, this machine's libvirt as
        the config names it now (the record may name the URI of an older config)."""
        spec = spec_of(record)
        return self.at(spec if abilities(spec.uri).elsewhere else HostSpec(spec.name, self.here))

    def vm(self, record: Record) -> VM:
        """The session's VM, on the host asked about it."""
        return self.of(record).vm(record)

    def close(self) -> None:
        for made in self._made.values():
            made.close()


@contextlib.contextmanager
def hosts(here: str, known: Iterable[HostSpec] = ()) -> Iterator[Hosts]:
    """Hosts for one operation over many sessions, every connection closed at its end."""
    found = Hosts(here, known)
    try:
        yield found
    finally:
        found.close()


def check(spec: HostSpec) -> None:
    """Raise (with the fix) unless sessions can run there at all: a host whose guests are reached through a
    tunnel is named by an ssh URI."""
    if abilities(spec.uri).tunnelled:
        tunnel.ssh_argv(spec.uri)


def release(root: Path) -> None:
    """What a place runs on this machine for the session whose directory is `root` (a tunnel), stopped: for a
    session whose record cannot be read, or whose host does not answer."""
    tunnel.close(root)
