"""The libvirt hosts a session may run on: this machine (`libvirt_uri`, named `local`) and the ones the user's
config names under `hosts:`.

    hosts:
      - name: big
        uri: qemu+ssh://me@big.example/system
        max_sessions: 10       # optional: no more sessions than this there
        keep_free: 4G          # optional: memory a session placed there must leave free (default 1G)
        pool_path: /var/lib/libvirt/vmsandbox   # optional: where its images and sessions' volumes live

`hosts:` is read from the user's config only, never from a project (a URI names a program-running transport
as easily as a host).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from vmsandbox.errors import VmsandboxError

LOCAL = "local"
DEFAULT_POOL_PATH = "/var/lib/libvirt/vmsandbox"
DEFAULT_KEEP_FREE_MIB = 1024
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}\Z")
# Transports that authenticate and encrypt (ssh, TLS) or stay on this machine (a unix socket).
_SCHEMES = ("qemu", "qemu+ssh", "qemu+libssh", "qemu+libssh2", "qemu+tls", "qemu+unix")


@dataclass(frozen=True)
class HostSpec:
    name: str
    uri: str
    max_sessions: int | None = None
    keep_free_mib: int = DEFAULT_KEEP_FREE_MIB
    pool_path: str = DEFAULT_POOL_PATH


def parse_uri(uri: str, *, source: str) -> str:
    parts = urlsplit(uri)
    if parts.scheme == "qemu+tcp":
        raise VmsandboxError(
            f"{source}: {uri!r} uses qemu+tcp, which neither encrypts nor authenticates",
            hint="use qemu+ssh://USER@HOST/system (or qemu+tls://)",
        )
    check_host_key(uri, source=source)
    if parts.scheme not in _SCHEMES or parts.path not in ("/system", "/session"):
        raise VmsandboxError(
            f"{source}: {uri!r} is not a libvirt QEMU URI",
            hint="write it like qemu+ssh://USER@HOST/system, or qemu:///system for this machine",
        )
    return uri


def check_host_key(uri: str, *, source: str) -> None:
    """Refuse a URI that turns off ssh's check of the host's key (libvirt's `no_verify`): the host is pinned in
    your known_hosts, or it is not used."""
    query = parse_qs(urlsplit(uri).query)
    if query.get("no_verify", ["0"])[-1] != "0" or query.get("known_hosts_verify", ["normal"])[-1] == "ignore":
        raise VmsandboxError(
            f"{source}: {uri!r} turns off the check of the host's SSH key (no_verify, known_hosts_verify=ignore)",
            hint="add the host's key to your known_hosts (`ssh` to it once and compare the fingerprint), then drop "
            "that parameter from the URI",
        )


def parse_hosts(
    entries: list[dict[str, Any]], *, source: str, parse_size_mib: Callable[..., int]
) -> tuple[HostSpec, ...]:
    """The `hosts:` list of a config file, checked: known keys, names unique and not `local`, URIs of libvirt's
    QEMU driver over a transport that authenticates (sizes read by the config's own `parse_size_mib`)."""
    # here: a remote session's tunnel supervisor imports this module for its host-key rule, never for a config
    from vmsandbox.filemodels import HostEntry
    from vmsandbox.schema import check

    found: list[HostSpec] = []
    for i, entry in enumerate(entries):
        where = f"{source}: `hosts[{i}]`"
        data = check(entry, HostEntry, source=where)
        name = data["name"]
        if not _NAME.match(name) or name == LOCAL:
            raise VmsandboxError(
                f"{where}: `name` {name!r} is not a host name vmsandbox takes",
                hint=f"lower-case letters, digits and dashes, at most 32; `{LOCAL}` is this machine",
            )
        if any(h.name == name for h in found):
            raise VmsandboxError(f"{where}: the host name {name!r} is given twice")
        most = data.get("max_sessions")
        if most is not None and most < 1:
            raise VmsandboxError(f"{where}: `max_sessions` must be at least 1")
        pool_path = data.get("pool_path", DEFAULT_POOL_PATH)
        if not pool_path.startswith("/") or "\n" in pool_path:
            raise VmsandboxError(f"{where}: `pool_path` must be an absolute path on that host")
        keep = data.get("keep_free")
        found.append(
            HostSpec(
                name,
                parse_uri(data["uri"], source=f"{where}: `uri`"),
                most,
                DEFAULT_KEEP_FREE_MIB if keep is None else parse_size_mib(keep, what=f"{where}: `keep_free`", least=0),
                pool_path.rstrip("/") or "/",
            )
        )
    return tuple(found)


def every(libvirt_uri: str, configured: tuple[HostSpec, ...]) -> list[HostSpec]:
    """This machine first, then the configured hosts."""
    return [HostSpec(LOCAL, libvirt_uri), *configured]


def named(libvirt_uri: str, configured: tuple[HostSpec, ...], name: str) -> HostSpec:
    for spec in every(libvirt_uri, configured):
        if spec.name == name:
            return spec
    known = ", ".join(h.name for h in every(libvirt_uri, configured))
    raise VmsandboxError(
        f"no host named {name!r}",
        hint=f"the hosts are: {known}; add one under `hosts:` in ~/.config/vmsandbox/config.yaml",
    )
