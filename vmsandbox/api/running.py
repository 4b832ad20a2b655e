"""A `vmsandbox serve` as the account's other commands see it: the files it leaves in the private state directory
while it serves, the settings E2B's SDK reads from them, the key kept across restarts where a person asks, and
starting one in the background and stopping it.

Files (paths.py; the state directory is 0700, each file 0600 and written whole before it is renamed into place):
serve.json says which process serves where (pid, start time, URL, socket; never the key); serve.env holds what
the SDK needs, key included, as `NAME=value` lines (a dotenv file: `set -a; . FILE`, python-dotenv, systemd); both
go when the server stops. serve.key is there only while the person asks for `--keep-key`. serve.port says the port
the last serve listened on (the next takes it back) and is locked (flock) by the serve that runs: settings that no
live serve backs (one killed with SIGKILL, a crash, a power cut) are removed by the next `serve`, `serve --env` or
`serve --stop` of the account, as soon as it finds the lock free.

What a shell keeps is out of reach: after a serve ends, a shell set up for it sends what E2B's SDK sends (the key,
a sandbox's environment variables, commands) to 127.0.0.1:PORT, a port any account may take (loopback TCP ports are
first come, and the unchanged SDK cannot check whom it reaches). So `--stop` prints `unset` lines (`eval` them) and
says so, the next serve takes the same port back while it is free, and says so when another program took it.

E2B's SDK (2.x) reaches a server of its own only through E2B_API_URL and E2B_SANDBOX_URL, which it marks
deprecated: its current variable, E2B_DOMAIN, makes `https://api.DOMAIN` and `https://49983-ID.DOMAIN` of it
(TLS always, unless E2B_DEBUG, which skips kill and set_timeout and fixes the ports). So the settings name both
URLs, and set E2B_DOMAIN to a `.invalid` name as well: a client that lost E2B_API_URL then fails here instead of
sending the key to E2B's cloud (`api.e2b.app`). pyproject bounds the SDK below 3, where the two URLs go.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import shlex
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from vmsandbox import paths, pids, proc
from vmsandbox.api import servefiles
from vmsandbox.errors import VmsandboxError

KEY_PREFIX = "vmsb_"
KEY = re.compile(r"vmsb_[A-Za-z0-9_-]{43}")  # KEY_PREFIX + secrets.token_urlsafe(32)
API_DOMAIN = "set-e2b-api-url.invalid"  # E2B_DOMAIN: where the SDK goes without E2B_API_URL (nowhere)
NAMES = ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY", "E2B_DOMAIN")
START_WAIT = 60.0  # seconds a background serve has to listen
STOP_WAIT = 30.0  # seconds a serve has to stop once told to (uvicorn's graceful shutdown is 10)
NOT_RUNNING_HINT = "start one: `vmsandbox serve --detach` (background) or `vmsandbox serve` (in a terminal)"


@dataclass(frozen=True)
class Settings:
    url: str
    api_key: str
    socket: Path | None = None

    def variables(self) -> dict[str, str]:
        """What a client sets: E2B's SDK reads these from its environment."""
        values = (self.url, self.url, self.api_key, API_DOMAIN)
        return dict(zip(NAMES, values, strict=True))

    def exports(self) -> list[str]:
        """`export NAME=value` lines, for `eval "$(vmsandbox serve --env)"`."""
        return [f"export {name}={shlex.quote(value)}" for name, value in self.variables().items()]


def unsets() -> list[str]:
    """`unset NAME` lines, for `eval "$(vmsandbox serve --stop)"`: a shell set up for a serve that is gone would send
    the SDK's requests to a port any account may take."""
    return [f"unset {name}" for name in NAMES]


def stale_note(url: str) -> str:
    return (
        f"a `vmsandbox serve` ended without stopping (killed, or the machine went down) and left its settings for "
        f"{url}: removed; a shell still set up for it sends the SDK's requests to a port any account may take: "
        '`eval "$(vmsandbox serve --stop)"` there clears them'
    )


def moved_note(port: int) -> str:
    return (
        f"127.0.0.1:{port}, where this account's last `vmsandbox serve` listened, is taken by another program "
        "(perhaps another account's): shells and programs still set up for it send it your key and requests — "
        '`eval "$(vmsandbox serve --stop)"` in each clears their settings; this serve listens on a new port'
    )


def stopped_note(url: str) -> str:
    return (
        f"shells that took its settings still point at {url}, a port any account on this machine may take now: "
        '`eval "$(vmsandbox serve --stop)"` in each clears them (as here); the next `vmsandbox serve` takes the port '
        "back while it is free"
    )


def _write_private(target: Path, text: str) -> None:
    """`text` as `target`, 0600 from its first byte, put in place whole (a reader never sees half of it)."""
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fresh = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}")
    fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    fresh.replace(target)


def _read_private(target: Path) -> str | None:
    """A file of ours in the state directory, if there is one: this account's, not a link, no one else's to read."""
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise VmsandboxError(f"cannot read {target}: {exc.strerror}", hint=f"remove it (`rm {target}`)") from None
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise VmsandboxError(
                f"{target} is not this account's alone (owner uid {st.st_uid}, mode {st.st_mode & 0o777:o})",
                hint=f"remove it (`rm {target}`): vmsandbox writes it again, 0600",
            )
        return f.read()


def api_key(*, keep: bool) -> tuple[str, str | None]:
    """The key a starting serve uses, and a note for the person when it is not the obvious one. Kept (`keep`):
    the one kept before, or a new one kept from now on. Not kept: a new one, and a key kept before is removed
    (a key stays on disk only while the person asks)."""
    kept_file = servefiles.serve_key_file()
    kept = _read_private(kept_file)
    if keep:
        if kept is not None and KEY.fullmatch(kept.strip()):
            return kept.strip(), None
        fresh = KEY_PREFIX + secrets.token_urlsafe(32)
        _write_private(kept_file, fresh + "\n")
        return fresh, f"a new key, kept in {kept_file} for the next `vmsandbox serve --keep-key`"
    if kept is None:
        return KEY_PREFIX + secrets.token_urlsafe(32), None
    kept_file.unlink()
    return KEY_PREFIX + secrets.token_urlsafe(32), f"a new key: the one kept in {kept_file} is removed (no --keep-key)"


def _named() -> dict[str, Any] | None:
    """What serve.json says, whether or not its serve still runs."""
    try:
        found = json.loads(servefiles.serve_file().read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def running() -> dict[str, object] | None:
    """The serve that runs for this account, if one does (its pid, start, URL and socket; not its key)."""
    found = _named()
    if found is None or not pids.alive(found.get("pid"), found.get("start")):
        return None
    return found


@contextlib.contextmanager
def _port_lock() -> Iterator[int | None]:
    """serve.port, locked (flock, never waited for): its descriptor while held; None while a serve holds it."""
    target = servefiles.serve_port_file()
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(target, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise VmsandboxError(f"cannot open {target}: {exc.strerror}", hint=f"remove it (`rm {target}`)") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise VmsandboxError(
                f"{target} is not this account's alone (owner uid {st.st_uid}, mode {st.st_mode & 0o777:o})",
                hint=f"remove it (`rm {target}`): vmsandbox writes it again, 0600",
            )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield None
            return
        yield fd
    finally:
        os.close(fd)


def _remove_settings() -> str | None:
    """serve.env and serve.json removed (under serve.port's lock); the URL they named, if there were any."""
    named = _named() or {}
    env = None
    with contextlib.suppress(VmsandboxError):  # (one not this account's alone goes too: the directory is ours)
        env = _read_private(servefiles.serve_env_file())
    found = [f for f in (servefiles.serve_env_file(), servefiles.serve_file()) if f.exists() or f.is_symlink()]
    for f in found:
        f.unlink(missing_ok=True)
    url = named.get("url")
    if not isinstance(url, str):
        url = next((line[13:] for line in (env or "").splitlines() if line.startswith("E2B_API_URL=")), "")
    return (url or "its port") if found else None


def forget_stale() -> str | None:
    """Remove the settings no live serve backs — serve.env (the key) and serve.json, left by a serve that ended
    without its own clean-up (SIGKILL, a crash, the machine going down) — and say the URL they named (None: there
    were none). Nothing while a serve holds serve.port's lock (it runs, or starts)."""
    if not paths.state_dir().is_dir():
        return None
    with _port_lock() as free:
        named = _named()
        if free is None or (named is not None and pids.alive(named.get("pid"), named.get("start"))):
            return None  # (alive without the lock: a serve of a vmsandbox before it; its files are its own)
        return _remove_settings()


def last_port() -> int:
    """The port this account's last serve listened on (0: none said)."""
    said = (_read_private(servefiles.serve_port_file()) or "").strip()
    return int(said) if said.isascii() and said.isdigit() and 0 < int(said) < 65536 else 0


def current() -> Settings:
    """The settings of the serve that runs for this account, from its env file (what no serve backs is removed)."""
    stale = forget_stale()
    found = running()
    text = _read_private(servefiles.serve_env_file()) if found is not None else None
    if found is None or text is None:
        said = f" ({stale_note(stale)})" if stale else ""
        raise VmsandboxError(f"no `vmsandbox serve` runs for this account{said}", hint=NOT_RUNNING_HINT)
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition("=")
        values[name] = value
    if values.get("E2B_API_URL") != found.get("url") or not KEY.fullmatch(values.get("E2B_API_KEY", "")):
        raise VmsandboxError(
            f"{servefiles.serve_env_file()} does not match the serve that runs (pid {found.get('pid')})",
            hint="stop it (`vmsandbox serve --stop`) and start it again",
        )
    where = found.get("socket")
    return Settings(values["E2B_API_URL"], values["E2B_API_KEY"], Path(where) if isinstance(where, str) else None)


@contextlib.contextmanager
def announced(settings: Settings) -> Iterator[None]:
    """serve.json and serve.env, for as long as this server runs, under serve.port's lock (and its port said there
    for the next serve); what a serve that ended without its clean-up left is removed first."""
    with _port_lock() as mine:
        if mine is None:
            raise VmsandboxError(
                "`vmsandbox serve` already runs for this account",
                hint="use that one (`vmsandbox serve --env` prints its settings), or `vmsandbox serve --stop` it",
            )
        _remove_settings()
        os.ftruncate(mine, 0)
        os.pwrite(mine, f"{urlsplit(settings.url).port or ''}\n".encode(), 0)
        me = os.getpid()
        data = {"pid": me, "start": pids.process_start(me), "url": settings.url}
        data["socket"] = str(settings.socket) if settings.socket else None
        head = f"# E2B's SDK settings of `vmsandbox serve` (pid {me}); this file goes when it stops\n"
        _write_private(
            servefiles.serve_file(), json.dumps(data)
        )  # (first: a serve --env never takes the key for stale)
        _write_private(
            servefiles.serve_env_file(), head + "".join(f"{k}={v}\n" for k, v in settings.variables().items())
        )
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                servefiles.serve_env_file().unlink(missing_ok=True)
                servefiles.serve_file().unlink(missing_ok=True)


def _until(done: Callable[[], bool], seconds: float) -> bool:
    """Whether `done` came true within `seconds` (looked at again every 50 ms)."""
    tick = threading.Event()
    deadline = threading.Timer(seconds, tick.set)
    deadline.start()
    try:
        while not done():
            if tick.wait(0.05):
                return done()
        return True
    finally:
        deadline.cancel()


def _exited(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    return True


def _log_tail(since: int) -> str:
    with contextlib.suppress(OSError), servefiles.serve_log().open("rb") as f:
        f.seek(since)
        return f.read()[-2000:].decode(errors="replace").strip()
    return ""


def start_detached(args: list[str]) -> Settings:
    """`vmsandbox serve ARGS` in the background (its own session, its stderr in serve.log), once it listens."""
    log_file = servefiles.serve_log()
    log_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    since = log_file.stat().st_size if log_file.exists() else 0
    pid = proc.spawn_detached(proc.own_module("vmsandbox", "serve", *args), log_file=log_file)
    found: list[Settings] = []

    def ready() -> bool:
        if (running() or {}).get("pid") == pid:
            with contextlib.suppress(VmsandboxError):
                found.append(current())
        return bool(found) or _exited(pid)

    if _until(ready, START_WAIT) and found:
        return found[0]
    if not _exited(pid):
        os.kill(pid, signal.SIGTERM)
        why = f"it did not listen within {START_WAIT:g} s"
    else:
        why = "it ended"
    raise VmsandboxError(
        f"`vmsandbox serve` in the background did not start: {why}: {_log_tail(since) or 'it said nothing'}",
        hint=f"its log is {log_file}; `vmsandbox serve` in a terminal shows the same",
    )


def stop() -> tuple[int, str]:
    """Stop the serve that runs for this account (SIGTERM: its requests end, its files go); its pid and URL. Settings
    no live serve backs are removed, whether one ran or not."""
    found = running()
    if found is None:
        stale = forget_stale()
        raise VmsandboxError(
            "no `vmsandbox serve` runs for this account" + (f" ({stale_note(stale)})" if stale else ""),
            hint="nothing to stop",
        )
    pid, start, url = found["pid"], found["start"], str(found.get("url"))
    if not isinstance(pid, int) or not isinstance(start, str):  # (never: running() found it alive by both)
        raise VmsandboxError(f"{servefiles.serve_file()} names no process", hint="nothing to stop")
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if not _until(lambda: not pids.alive(pid, start), STOP_WAIT):
        raise VmsandboxError(
            f"`vmsandbox serve` (pid {pid}) did not stop within {STOP_WAIT:g} s", hint=f"`kill -KILL {pid}` ends it"
        )
    forget_stale()  # (its own exit removes them; one that ended otherwise did not)
    return pid, url
