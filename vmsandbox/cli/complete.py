"""What the shell completes that it cannot know: session names, checkpoint labels, blueprints, hosts, and the
choices of options. Each reads files only (never libvirt, never a guest) and fails quietly: a completion
that cannot be given is no completion, never an error in the middle of a command line."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

ACCEL = ("auto", "kvm", "tcg")
LOGS = ("console", "proxy")
REVIEW = ("terminal", "web")
SHELLS = ("bash", "zsh", "fish")


def _starting(words: Any, incomplete: str) -> list[str]:
    return sorted(w for w in words if w.startswith(incomplete))


def sessions(incomplete: str) -> list[str]:
    from vmsandbox.session.record import names

    with contextlib.suppress(Exception):
        return _starting(names(), incomplete)
    return []


def labels(ctx: Any, incomplete: str) -> list[str]:
    """The checkpoints of the session named before (`rollback NAME <TAB>`)."""
    from vmsandbox import paths
    from vmsandbox.session.place import checkpoints

    with contextlib.suppress(Exception):
        name = ctx.params.get("name")
        if name:
            return _starting((c.label for c in checkpoints.listed(paths.session_paths(name))), incomplete)
    return []


def blueprints(incomplete: str) -> list[str]:
    from vmsandbox.image import blueprint

    with contextlib.suppress(Exception):
        return _starting(blueprint.available(Path.cwd()), incomplete)
    return []


def hosts(incomplete: str) -> list[str]:
    from vmsandbox.session import settings as config
    from vmsandbox.session.place import hostspec

    with contextlib.suppress(Exception):
        settings = config.load()
        return _starting((h.name for h in hostspec.every(settings.libvirt_uri, settings.hosts)), incomplete)
    return []


def networks(incomplete: str) -> list[str]:
    from vmsandbox.egress.rules.netpolicy import Mode

    return _starting((m.value for m in Mode), incomplete)


def accel(incomplete: str) -> list[str]:
    return _starting(ACCEL, incomplete)


def logs(incomplete: str) -> list[str]:
    return _starting(LOGS, incomplete)


def review(incomplete: str) -> list[str]:
    return _starting(REVIEW, incomplete)


def shells(incomplete: str) -> list[str]:
    return _starting(SHELLS, incomplete)
