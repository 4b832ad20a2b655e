"""What of yours a session uses without holding it, for every front end: secrets kept on the host (the egress
proxy puts them into requests; the guest sees a placeholder) and agents' logins kept on the host (copied into
each later session of that agent)."""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from vmsandbox import ui
from vmsandbox.core import reviews
from vmsandbox.egress import secrets
from vmsandbox.errors import UsageError, VmsandboxError
from vmsandbox.guest import commands
from vmsandbox.image import blueprint
from vmsandbox.session import lock, settings
from vmsandbox.session.end import lifecycle
from vmsandbox.session.options import RunFlags
from vmsandbox.session.record import Record
from vmsandbox.session.running import logins, reach
from vmsandbox.session.start import create, resolve


@dataclass(frozen=True)
class Secret:
    name: str
    set_at: float
    length: int


def check_name(name: str) -> str:
    """A secret's name as a command line gives it (UsageError for one that cannot be a name)."""
    try:
        return secrets.validate_name(name)
    except VmsandboxError as exc:
        raise UsageError(exc.message, hint=exc.hint) from None


def put(name: str, value: str) -> Path:
    """A secret stored on the host (0600); where the secrets are."""
    secrets.put(check_name(name), value)
    return secrets.directory()


def listed() -> list[Secret]:
    """The stored secrets (names and sizes only, never values)."""
    return [Secret(s.name, s.set_at, s.length) for s in secrets.list_all()]


def remove(name: str) -> None:
    if not secrets.remove(check_name(name)):
        raise VmsandboxError(f"no secret named {name!r}", hint="list them with `vmsandbox secret ls`")


def handed_again(name: str) -> dict[str, str | None]:
    """Running sessions that inject the secret get it anew (their egress daemon restarts: it holds only what it
    was handed); each one, with why its new daemon did not start (None: it did)."""
    return reach.secret_changed(name)


def readers() -> dict[str, str]:
    """Which secret names something reads: each blueprint's mappings and your config (name → who)."""
    users: dict[str, str] = {}
    for bp in sorted(blueprint.available(Path.cwd())):
        with contextlib.suppress(VmsandboxError):  # a broken blueprint says so when it is used
            for mapping in blueprint.load(bp, Path.cwd()).secrets:
                users.setdefault(str(mapping.get("secret")), f"the {bp} blueprint")
    for m in settings.load().secrets:
        users.setdefault(m.secret, "your config")
    return users


def unread(name: str, users: dict[str, str]) -> str | None:
    """A warning when nothing reads a secret of this name (a typo, `_` for `-`), naming the close ones."""
    if name in users:
        return None

    def norm(n: str) -> str:
        return n.lower().replace("_", "-").replace(".", "-")

    close = [u for u in users if norm(u) == norm(name)]
    if close:
        return f"nothing reads a secret named {name!r}; {users[close[0]]} reads {close[0]!r}: " + (
            f"store it as `vmsandbox secret set {close[0]}` (and `vmsandbox secret rm {name}`)"
        )
    known = ", ".join(sorted(users)) or "none"
    return f"no blueprint or config reads a secret named {name!r} yet (the names they read: {known})"


@dataclass(frozen=True)
class Agent:
    """An agent that can be signed in (a blueprint naming login files): its files, its sign-in command."""

    name: str
    files: tuple[str, ...]
    command: tuple[str, ...]


def agent(name: str) -> Agent:
    """The agent `name` (UsageError when it is no blueprint, or one that names no login files)."""
    bp = blueprint.named(name)
    if not bp.login_files:
        raise UsageError(f"blueprint {name} names no login files", hint=f"add `login: {{files: [...]}}` to {bp.source}")
    return Agent(bp.name, tuple(bp.login_files), tuple(bp.login_command or bp.command))


def logged_in() -> dict[str, list[str]]:
    """The agents whose login is kept, with its files (read as you, never through a link)."""
    found: dict[str, list[str]] = {}
    for name in blueprint.available(Path.cwd()):
        with contextlib.suppress(VmsandboxError):
            bp = blueprint.load(name, Path.cwd())
            if bp.login_files and (files := logins.kept(bp)):
                found[name] = files
    return dict(sorted(found.items()))


def forget(name: str) -> list[str]:
    """An agent's kept login removed; its files that were kept."""
    return logins.forget(blueprint.named(name))


def keep_from(name: str, session: Record) -> list[str]:
    """The login an agent made in a running session kept for every later session of it; the files kept."""
    bp = blueprint.named(name)
    if session.blueprint != name:
        raise UsageError(f"session {session.name} is a {session.blueprint} session, not {name}")
    found = logins.read(session, bp)
    if not found:
        raise VmsandboxError(
            f"no login of {name} in session {session.name} (none of ~/{', ~/'.join(bp.login_files)})",
            hint=f"sign in there first ({' '.join(bp.login_command or bp.command)}), then run this again",
        )
    return logins.keep(bp, found)


def sign_in(name: str) -> list[str]:
    """A disposable session of the agent's blueprint on an empty project, its sign-in run there at this terminal,
    then its login kept; the files kept. The session goes whatever happens."""
    found = agent(name)
    project = Path(tempfile.mkdtemp(prefix="vmsandbox-login-"))
    try:
        planned = resolve.resolve(project, name, None, RunFlags(keep=True), agent=False)
        record = create.create(planned.options)
        try:
            said = " ".join(found.command)
            ui.info(f"Sign in to {name} here; the VM ends when `{said}` does.")
            tty = sys.stdin.isatty() and sys.stdout.isatty()
            code = commands.attach(record.endpoint(), record.project, list(found.command), tty=tty)
            if code != 0:
                ui.warn(f"`{said}` exited with {code}")
            return keep_from(name, record)
        finally:
            with lock.held(record.files, record.name, "destroying"):
                lifecycle.destroy(record, force=False, discard=True, limit=reviews.limit())
    finally:
        shutil.rmtree(project, ignore_errors=True)
