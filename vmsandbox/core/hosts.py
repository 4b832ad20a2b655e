"""Hosts, for every front end: the libvirt hosts sessions may run on (this machine, `local`, and those under
`hosts:` in your config) asked at once, added to and taken off your config; this machine set up where no
service manager does it; and every check a session needs (`doctor`), which never stops at a broken settings."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmsandbox import sudo
from vmsandbox.session import settings
from vmsandbox.session.host import configured, doctor, hosts
from vmsandbox.session.host.doctor import Check
from vmsandbox.session.place import hostspec
from vmsandbox.session.record import readable
from vmsandbox.vm import hostsetup

__all__ = ["Check"]


@dataclass(frozen=True)
class Host:
    """A host as `host ls` shows it: what it answered (None: it did not, `problem` says why and `hint` the fix),
    and `sessions`: this account's sessions there, as `ls --filter host=NAME` lists them."""

    name: str
    uri: str
    answered: bool
    versions: str
    accel: str
    memory: tuple[int, int] | None  # (available, total) MiB
    sessions: int
    max_sessions: int | None
    images: int
    problem: str | None
    hint: str | None
    facts: dict[str, Any]


def names() -> list[str]:
    """Every host's name, from your config (nothing is asked of a host)."""
    loaded = settings.load()
    return [spec.name for spec in hostspec.every(loaded.libvirt_uri, loaded.hosts)]


def listed(timeout: float) -> list[Host]:
    """Every host asked at once, each within `timeout` seconds; one that does not answer is listed with why."""
    loaded = settings.load()
    found = hosts.probe_all(hostspec.every(loaded.libvirt_uri, loaded.hosts), timeout)
    mine = Counter(r.host for r in readable())
    shown = []
    for s in found:
        n, count = s.node, mine.get(s.spec.name, 0)
        facts = {**s.as_dict(loaded.memory_mib), "sessions": count}
        versions = "-" if n is None else f"libvirt {n.libvirt}, QEMU {n.qemu}"
        memory = None if n is None else (n.available_mib, n.memory_mib)
        shown.append(
            Host(s.spec.name, s.spec.uri, n is not None, versions, s.accel, memory, count, s.spec.max_sessions,
                 len(s.images), s.problem, s.hint, facts)
        )  # fmt: skip
    return shown


def add(name: str, uri: str, *, max_sessions: int | None, keep_free: str | None, pool_path: str | None) -> None:
    """A host added under `hosts:` of your config (checked as the config reads it: name, URI, sizes)."""
    entry: dict[str, Any] = {"name": name, "uri": uri}
    optional = {"max_sessions": max_sessions, "keep_free": keep_free, "pool_path": pool_path}
    entry.update({k: v for k, v in optional.items() if v is not None})
    configured.add(entry)


def remove(name: str) -> None:
    """A host taken off your config (its sessions, images and volumes there are left as they are)."""
    configured.remove(name)


def config_file() -> Path:
    return configured.user_file()


def setup(user: str | None) -> Iterator[str]:
    """This machine set up where no service manager does it (root): the guest-data account and the libvirt
    group (which `user`, default: who ran sudo, joins), /dev/kvm's group and mode, virtlogd and libvirtd
    started with the group's socket, the image store shared with the group. A line per thing done."""
    invoker = sudo.invoker()
    if user is None and invoker is not None:
        user = invoker.pw_name
    return hostsetup.setup(settings.load().libvirt_uri, user)


def diagnose(project: Path | None) -> list[Check]:
    """Every check a session needs, your config's (and `project`'s file's) first: a broken config is one failed
    check with every problem of it, and the other checks run with what of it passes."""
    return doctor.diagnose(project)
