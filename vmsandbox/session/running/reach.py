"""Changing what a running session may reach, while it runs: its allowlist (`vmsandbox policy allow` / `deny`;
`policy ls` reads it) and its published ports (`vmsandbox port publish` / `rm`).

The proxy re-reads the session's egress policy for every new connection, so an allowlist change applies to the
next connection (open ones go on); the change is written to the session's proxy log. Published ports are
served by the egress daemon, which is told to open or close listeners (SIGUSR1) without dropping the
connections it carries.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

from vmsandbox import paths
from vmsandbox.egress import control, policy, ports, proxylog
from vmsandbox.egress.ports import Publish
from vmsandbox.egress.rules.netpolicy import Mode
from vmsandbox.errors import VmsandboxError
from vmsandbox.session import lock, state
from vmsandbox.session.record import Record, names

RELOAD_TIMEOUT = 10.0


@contextlib.contextmanager
def _changing(files: paths.SessionPaths) -> Iterator[None]:
    """One change at a time to a session's policy and ports (read, change, write)."""
    fd = os.open(files.root / "policy.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # (and the lock with it)


def _running(name: str) -> Record:
    record = Record.load(name)
    if not state.is_running(record):
        raise VmsandboxError(
            f"session {name} is not running", hint=f"`vmsandbox start {name}` resumes a stopped one; `vmsandbox ls`"
        )
    return record


@contextlib.contextmanager
def _rewriting(record: Record, doing: str) -> Iterator[None]:
    """The session's lock, then its policy's: a `stop`, a checkpoint, a rollback or an `rm` starts and stops the
    session's egress daemon under the session's lock, and a port's change would otherwise start one for a VM that is
    being saved or removed. A review in this very process (whose page publishes) holds it for this change."""
    with lock.briefly(record.files, record.name, doing), _changing(record.files):
        yield


def _still_running(name: str) -> Record:
    """The record read again once the locks are held: a `stop` or the end of a `run` may have come meanwhile (its
    ports would be published on a VM that is gone, or going)."""
    record = _running(name)
    if record.saved or record.ending is not None:
        raise VmsandboxError(
            f"session {name} is {'stopped' if record.saved else 'ending'}", hint="`vmsandbox ls` shows its state"
        )
    return record


def _logged(record: Record, what: str) -> None:
    proxylog.append(record.files.proxy_log, proxylog.Event(decision="policy", reason=what))


def allow(name: str, entries: list[str]) -> list[str]:
    """Add allowlist entries (HOST, *.DOMAIN, HOST:PORT) to a running session; the ones that were new."""
    record = _running(name)
    if record.network is Mode.NONE:
        raise VmsandboxError(
            f"session {name} has no network (`--network none`): there is no proxy to allow anything through",
            hint="start a session with `--network allowlist` (the default) for that",
        )
    with _changing(record.files):
        data = policy.read_config(record.files)
        added = policy.allowed_more(data, entries)
        policy.write_config(record.files, data)
    if added:
        _logged(record, f"allowed {', '.join(added)} (vmsandbox policy allow)")
    return added


def deny(name: str, entries: list[str]) -> list[str]:
    """Remove allowlist entries from a running session (see policy.allowed_less); the ones removed."""
    record = _running(name)
    with _changing(record.files):
        data = policy.read_config(record.files)
        removed = policy.allowed_less(data, entries, session=name)
        policy.write_config(record.files, data)
    _logged(record, f"denied {', '.join(removed)} (vmsandbox policy deny)")
    return removed


@dataclass(frozen=True)
class Allowlist:
    """What a session's proxy lets through now: its network mode, its allowlist entries (HOST, *.DOMAIN,
    HOST:PORT) and the non-public networks allowed names may resolve to."""

    mode: Mode
    entries: tuple[str, ...]
    networks: tuple[str, ...]


def allowlist(name: str) -> Allowlist:
    """A session's allowlist as its proxy reads it (every change by `policy allow`/`deny` included)."""
    record = Record.load(name)
    if not record.files.egress_config.exists():
        return Allowlist(record.network, (), ())
    data = policy.read_config(record.files)  # (never half written: what the proxy reads, as it reads it)
    networks = ("any",) if data.get("any_network") else tuple(data.get("allow_networks", ()))
    return Allowlist(Mode(data["mode"]), tuple(data["allow"]), networks)


def publish(name: str, wanted: Publish) -> Publish:
    """Publish a guest port of a running session (on a free host port when none is given)."""
    record = _running(name)
    with _rewriting(record, "publishing a port of"):
        record = _still_running(name)
        if any(p.guest == wanted.guest and (wanted.host is None or p.host == wanted.host) for p in record.publish):
            raise VmsandboxError(f"guest port {wanted.guest} of session {name} is published already")
        (chosen,) = ports.choose((wanted,))
        record.publish = (*record.publish, chosen)
        record.save()
        _apply_ports(record)
    return chosen


def unpublish(name: str, guest: int, host: int | None) -> list[Publish]:
    """Stop publishing a guest port (every host port it has, or only `host`)."""
    record = _running(name)
    with _rewriting(record, "unpublishing a port of"):
        record = _still_running(name)
        gone = [p for p in record.publish if p.guest == guest and (host is None or p.host == host)]
        if not gone:
            raise VmsandboxError(
                f"guest port {guest} of session {name} is not published", hint=f"`vmsandbox port {name}` lists them"
            )
        record.publish = tuple(p for p in record.publish if p not in gone)
        record.save()
        _apply_ports(record)
    return gone


def _apply_ports(record: Record) -> None:
    """The daemon serves what the record says now: told to reload, or started if none runs (a session
    without network has a daemon only while it publishes ports)."""
    from vmsandbox.session.start import create

    spec = create.daemon_spec(record)
    current = control.daemon_state(record.files)
    if current is None or not current.alive:
        if record.wants_daemon:
            create.open_egress(record)
        return
    if not record.wants_daemon:
        control.stop(record.files)
        return
    spec.save(record.files)
    control.reload(record.files)
    wanted = {place for p in record.publish for place in p.places()}
    deadline = time.monotonic() + RELOAD_TIMEOUT
    while time.monotonic() < deadline:
        served = control.daemon_state(record.files)
        if served is not None and set(served.ports) == wanted:
            return
        time.sleep(0.1)
    raise VmsandboxError(
        f"the egress daemon of session {record.name} did not take the new ports within {RELOAD_TIMEOUT:.0f} s",
        hint=f"see {record.files.egress_log}",
    )


def secret_changed(secret: str) -> dict[str, str | None]:
    """`secret set` or `secret rm`: each running session whose proxy injects `secret` gets a new egress daemon,
    handed the secret's new value (or none). A daemon holds only what it was handed when it started: it cannot
    read the secret store. Each session restarted, with why its new daemon did not start (None: it did)."""
    from vmsandbox.session.start import create

    done: dict[str, str | None] = {}
    for name in names():
        try:
            record = Record.load(name)
            current = control.daemon_state(record.files)
            if current is None or not current.alive or not record.files.egress_config.exists():
                continue
            rules = policy.proxy_config(policy.read_config(record.files)).secrets
        except (VmsandboxError, OSError, ValueError):
            continue  # gone meanwhile, or not one this account may read
        if any(rule.secret == secret for rule in rules):
            try:
                with _rewriting(record, "handing a secret anew to"):  # (a stop or an rm stops the daemon under it)
                    record = Record.load(name)  # (its ports as they are now: a publish may have come)
                    current = control.daemon_state(record.files)
                    if current is None or not current.alive:  # stopped meanwhile: no VM to hand it to
                        continue
                    create.open_egress(record)
                done[name] = None
            except VmsandboxError as exc:
                done[name] = exc.message
    return done
