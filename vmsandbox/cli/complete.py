"""What the shell completes that it cannot know: every argument and option value that has a finite set (session
names, fan-outs, checkpoint labels, published ports, allowlist entries, blueprints, agents, hosts, images,
secrets, trusted files, `--filter` keys and values, the choices of options). Each reads files only (never libvirt,
never a guest) and fails quietly: a completion that cannot be given is no completion, never an error in the
middle of a command line. A word already on the line is not offered again."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

ACCEL = ("auto", "kvm", "tcg")
REVIEW = ("terminal", "web")
SHELLS = ("bash", "zsh", "fish")
FORMATS = ("json", "table")
INSPECT_FORMATS = (*FORMATS, "ssh-config")


def _starting(words: Iterable[str], incomplete: str, given: Iterable[str] = ()) -> list[str]:
    taken = set(given)
    return sorted({w for w in words if w.startswith(incomplete) and w not in taken})


def _quietly(found: Callable[[], Iterable[str]]) -> list[str]:
    with contextlib.suppress(Exception):
        return list(found())
    return []


def given(ctx: Any) -> list[str]:
    """The words already given on the line, as the parser read them (typer hands a completion no `args`)."""
    found: list[str] = list(ctx.args)  # (what the parser had not placed when an option awaits its value)
    for value in ctx.params.values():
        found += [str(v) for v in value] if isinstance(value, list | tuple) else [str(value)]
    return found


def _session_names() -> list[str]:
    from vmsandbox.core import listing

    return _quietly(listing.names)


def sessions(ctx: Any, incomplete: str) -> list[str]:
    """Session names not yet on the line (`stop exp1 <TAB>` offers the others); with `--group`, fan-outs."""
    from vmsandbox.core import listing

    if ctx.params.get("group"):
        return _starting(_quietly(listing.groups), incomplete, given(ctx))
    return _starting(_session_names(), incomplete, given(ctx))


def other_sessions(ctx: Any, incomplete: str) -> list[str]:
    """Sessions but the ones named before (`diff exp1 --against <TAB>`)."""
    return _starting(_session_names(), incomplete, given(ctx))


def copy_target(ctx: Any, incomplete: str) -> list[str]:
    """`cp HOSTPATH... NAME:PATH`: `NAME:` of each session once a host path is given; the host's paths are the
    shell's own (no answer here lets it complete files)."""
    if ":" in incomplete or not (ctx.params.get("sources") or ctx.params.get("dest")):
        return []
    return [f"{n}:" for n in _starting(_session_names(), incomplete)]


def labels(ctx: Any, incomplete: str) -> list[str]:
    """The checkpoints of the session named before (`checkpoint restore NAME <TAB>`)."""
    from vmsandbox.core import listing

    name = ctx.params.get("name")
    return _starting(_quietly(lambda: listing.labels(name)), incomplete) if name else []


def ports(ctx: Any, incomplete: str) -> list[str]:
    """The guest ports the session named before publishes (`port rm NAME <TAB>`)."""
    from vmsandbox.core import watch

    name = ctx.params.get("name")
    if not name:
        return []
    return _starting(_quietly(lambda: [str(g) for g in sorted({p.guest for p in watch.ports(name)})]), incomplete)


def allowed(ctx: Any, incomplete: str) -> list[str]:
    """The allowlist entries of the session named before (`policy deny NAME <TAB>`), but those given."""
    from vmsandbox.core import watch

    name = ctx.params.get("name")
    return _starting(_quietly(lambda: watch.allowlist(name).entries), incomplete, given(ctx)) if name else []


def blueprints(incomplete: str) -> list[str]:
    from vmsandbox.core import images

    return _starting(_quietly(images.blueprint_names), incomplete)


def agents(incomplete: str) -> list[str]:
    """The blueprints that can be signed in (they name login files)."""
    from vmsandbox.core import images

    return _starting(_quietly(images.with_login), incomplete)


def signed_in(incomplete: str) -> list[str]:
    """The agents whose login is kept."""
    from vmsandbox.core import secrets

    return _starting(_quietly(secrets.logged_in), incomplete)


def hosts(incomplete: str) -> list[str]:
    from vmsandbox.core import hosts

    return _starting(_quietly(hosts.names), incomplete)


def other_hosts(incomplete: str) -> list[str]:
    """The hosts of your config (not this machine, `local`)."""
    return [h for h in hosts(incomplete) if h != "local"]


def images(incomplete: str) -> list[str]:
    from vmsandbox.core import images

    return _starting(_quietly(images.versions), incomplete)


def secrets(incomplete: str) -> list[str]:
    """Stored secrets (`secret rm`)."""
    from vmsandbox.core import secrets

    return _starting(_quietly(lambda: (s.name for s in secrets.listed())), incomplete)


def secret_names(incomplete: str) -> list[str]:
    """The secret names blueprints and your config read (`secret set`)."""
    from vmsandbox.core import secrets

    return _starting(_quietly(secrets.readers), incomplete)


def trusted(incomplete: str) -> list[str]:
    from vmsandbox.core import settings

    return _starting(_quietly(lambda: (path for _, _, path in settings.trusted())), incomplete)


def networks(incomplete: str) -> list[str]:
    from vmsandbox.core import watch

    return _starting(watch.MODES, incomplete)


def accel(incomplete: str) -> list[str]:
    return _starting(ACCEL, incomplete)


def review(incomplete: str) -> list[str]:
    return _starting(REVIEW, incomplete)


def shells(incomplete: str) -> list[str]:
    return _starting(SHELLS, incomplete)


def formats(ctx: Any, incomplete: str) -> list[str]:
    offered = INSPECT_FORMATS if ctx.info_name == "inspect" else FORMATS
    return _starting(offered, incomplete)


FILTER_KEYS = ("name", "state", "host", "network", "blueprint", "group", "project")
CHECKED_FILTERS = ("state", "network", "host")  # keys whose value must be one of a set (the rest: wildcards)


def filter_values(key: str) -> list[str]:
    """The values `ls --filter KEY=` may take (those a session here has, for a name, fan-out or blueprint)."""
    from vmsandbox.core import hosts, images, listing, watch

    found: dict[str, Callable[[], Iterable[str]]] = {
        "state": lambda: listing.STATES,
        "network": lambda: watch.MODES,
        "host": hosts.names,
        "blueprint": images.blueprint_names,
        "group": listing.groups,
        "name": listing.names,
    }
    return _quietly(found[key]) if key in found else []


def filters(incomplete: str) -> list[str]:
    """`ls --filter <TAB>`: its keys (`state=` …); `--filter state=<TAB>`: that key's values."""
    key, eq, value = incomplete.partition("=")
    if not eq:
        return _starting((f"{k}=" for k in FILTER_KEYS), incomplete)
    return [f"{key}={v}" for v in _starting(filter_values(key) or (), value)]


def commands(ctx: Any, incomplete: str) -> list[str]:
    """`help <TAB>`: the commands; `help checkpoint <TAB>`: that noun's verbs."""
    group = ctx.find_root().command
    for word in ctx.params.get("words") or ():
        group = getattr(group, "commands", {}).get(word)
        if group is None:
            return []
    return _starting((n for n, c in getattr(group, "commands", {}).items() if not c.hidden), incomplete)
