"""The one check of each kind of value that config files and blueprints both take, wherever it is written: a
blueprint's `allow: ["http://bad"]` is refused as the same entry in `.vmsandbox.yaml` is, by the same words.
(Here, below both readers: session.settings reads config files, image.blueprint reads blueprints.)"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any
from urllib.parse import urlsplit

from vmsandbox.document import Problem, refused
from vmsandbox.egress.rules import addresses, netpolicy
from vmsandbox.egress.rules.mapping import parse_secret_mapping
from vmsandbox.errors import VmsandboxError


def allow_entry(entry: str, where: str) -> netpolicy.Rule:
    """An allowlist entry: HOST, *.DOMAIN or HOST:PORT (a URL is said as one, with the entry it means)."""
    if "://" in entry:
        url = urlsplit(entry.strip())
        meant = (url.hostname or "HOST") + (f":{url.port}" if url.port else "")
        raise VmsandboxError(f"{where}: {entry!r} is a URL, not a host name", hint=f"write {meant}")
    return netpolicy.parse_rule(entry, source=where)


# Each list key's check of one entry, given the entry and how to name it (`FILE: `allow[1]``): what it reads as.
ENTRY_CHECKS: dict[str, Callable[[Any, str], Any]] = {
    "allow": allow_entry,
    "allow_networks": lambda entry, where: addresses.parse_network(entry, source=where),
    "secrets": lambda entry, where: parse_secret_mapping(entry, source=where),
}


def entries(
    key: str, given: list[Any], *, source: str, where: Callable[[int], str], skip: Collection[int] = ()
) -> tuple[list[tuple[Any, Any]], list[Problem]]:
    """The entries of the list `key` (of the file `source`) that its check takes, each as (given, read), and a
    problem at each one refused; `skip` the entries whose shape was refused already."""
    check = ENTRY_CHECKS[key]
    taken: list[tuple[Any, Any]] = []
    problems: list[Problem] = []
    for i, entry in enumerate(given):
        if i in skip:
            continue
        try:
            taken.append((entry, check(entry, where(i))))
        except VmsandboxError as exc:
            problems += refused(exc, source, (key, i))
    return taken, problems
