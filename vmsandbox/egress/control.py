"""Starting, stopping and watching a session's egress daemon (daemon.py).

The daemon gets everything it needs from a spec file the session writes (`egress-daemon.json`): where the
guest's SSH answers, whether it opens the guest's door out, the published ports, and how to tell that the VM
is gone. It reports its state in `egress-state.json`. When it dies the door closes: the guest gets
"connection refused" at once, nothing else changes, and `vmsandbox ls`/`exec`/`shell` say so.
"""

from __future__ import annotations

import enum
import json
import os
import signal
import time
from dataclasses import dataclass
from typing import Any

from vmsandbox import failpoint, paths, pids, proc, ui
from vmsandbox.egress import account, held, policy, secrets
from vmsandbox.egress.held import Held
from vmsandbox.egress.ports import Publish
from vmsandbox.errors import VmsandboxError

START_TIMEOUT = 60.0
DOWN_GRACE = 30.0  # a daemon that has said "down" this long (it retries every 10 s at most) is started again


class Door(enum.StrEnum):
    """What `ls` shows of a session's egress."""

    OFF = "off"  # no daemon wanted: no network and no published ports
    UP = "up"  # the guest's door (and its ports) are open
    DOWN = "down"  # the daemon runs; the connection is being restored
    STOPPED = "stopped"  # no daemon: the guest has no egress


@dataclass(frozen=True)
class Spec:
    """What the daemon of one session serves."""

    session: str
    ssh_port: int
    door: bool  # open the guest's 127.0.0.1:3128 (the network mode has a door)
    publish: tuple[Publish, ...]
    libvirt_uri: str
    domain: str
    # spawned with a guest that starts now: its clock is the host's at the first link (a cold boot reads the
    # host's, a warm start's identity sets it), which then needs no step
    fresh: bool = False

    def save(self, files: paths.SessionPaths) -> None:
        data = {**self.__dict__, "publish": [p.as_dict() for p in self.publish]}
        held.rewrite(files.egress_daemon, json.dumps(data, indent=1))

    @classmethod
    def load(cls, files: paths.SessionPaths) -> Spec:
        return cls.parse(held.read(files.egress_daemon))

    @classmethod
    def parse(cls, text: str) -> Spec:
        data: dict[str, Any] = json.loads(text)
        data["publish"] = tuple(Publish.from_dict(p) for p in data["publish"])
        return cls(**data)


@dataclass(frozen=True)
class DaemonState:
    pid: int | None
    start: str | None
    forward: Door
    error: str | None
    ports: tuple[str, ...] = ()  # where it serves published ports now (Publish.places)
    since: float | None = None  # when it wrote this (time.time())

    @property
    def alive(self) -> bool:
        return pids.alive(self.pid, self.start)


def daemon_state(files: paths.SessionPaths) -> DaemonState | None:
    try:
        data = json.loads(held.read(files.egress_state))
    except (OSError, ValueError):
        return None
    served = tuple(str(p) for p in data.get("ports", ()))
    since = data.get("since")
    return DaemonState(
        data.get("pid"),
        data.get("start"),
        Door(data.get("forward", "down")),
        data.get("error"),
        served,
        float(since) if isinstance(since, int | float) else None,
    )


def write_state(
    files: paths.SessionPaths,
    forward: Door,
    error: str | None = None,
    *,
    pid: int | None = None,
    ports: tuple[str, ...] = (),
    into: Held | None = None,
) -> None:
    """The daemon's state file: written by the daemon (its own pid, `into` the file it holds), and once by spawn()
    for it."""
    pid = os.getpid() if pid is None else pid
    data = {
        "pid": pid,
        "start": pids.process_start(pid),
        "forward": forward.value,
        "error": error,
        "since": time.time(),
        "ports": list(ports),
    }
    if into is not None:
        into.write(json.dumps(data))
    else:
        held.rewrite(files.egress_state, json.dumps(data))


def reload(files: paths.SessionPaths) -> None:
    """Tell the running daemon to serve the published ports its spec names now (SIGUSR1)."""
    st = daemon_state(files)
    if st is not None and st.pid is not None and st.alive:
        os.kill(st.pid, signal.SIGUSR1)


def status(files: paths.SessionPaths, *, wanted: bool) -> Door:
    if not wanted:
        return Door.OFF
    st = daemon_state(files)
    if st is None or not st.alive:
        return Door.STOPPED
    return st.forward


def needs_restart(files: paths.SessionPaths, *, wanted: bool, now: float | None = None) -> str | None:
    """Why the session's egress daemon must be started again before the guest has a network (its last
    reason, as it recorded it), or None: it serves, or it is not wanted."""
    if not wanted:
        return None
    st = daemon_state(files)
    if st is None or not st.alive:
        said = st.error if st is not None and st.error not in (None, "stopped", "starting") else None
        return "had stopped" + (f" ({said})" if said else "")
    down_for = (time.time() if now is None else now) - (st.since or 0)
    if st.forward is Door.DOWN and down_for > DOWN_GRACE:
        return f"has been down for {down_for:.0f} s ({st.error or 'no reason given'})"
    return None


@dataclass(frozen=True)
class Spawned:
    pid: int
    start: str | None


def start(spec: Spec, files: paths.SessionPaths, *, timeout: float = START_TIMEOUT) -> None:
    """Start the session's proxy daemon and wait until the guest's door (and its published ports) are open."""
    wait_open(spec, files, spawn(spec, files), timeout=timeout)


def spawn(spec: Spec, files: paths.SessionPaths) -> Spawned:
    """Start the session's proxy daemon (it waits for the guest's sshd by itself: spawned while the guest
    boots, its own start-up costs the session nothing)."""
    stop(files)
    files.egress_state.unlink(missing_ok=True)
    spec.save(files)
    argv = proc.own_module("vmsandbox.egress.daemon", spec.session)
    pid = proc.spawn_detached(argv, log_file=files.egress_log, stdin=handover(files))
    # stop() finds a daemon by its state file: one is there from now on, even before the daemon writes its own
    # (it waits for the guest's sshd first), so a vmsandbox killed meanwhile leaves nothing gc cannot stop
    write_state(files, Door.DOWN, "starting", pid=pid)
    return Spawned(pid, pids.process_start(pid))


def handover(files: paths.SessionPaths) -> bytes:
    """What a daemon reads on its stdin before anything else: the uid it becomes (account.pick: None without
    root) and the secrets its session maps, no others (it cannot read the secret store itself)."""
    mapped = policy.proxy_config(policy.read_config(files)).secrets if files.egress_config.exists() else ()
    names = {rule.secret for rule in mapped}
    found = {name: value for name in sorted(names) if (value := secrets.get(name)) is not None}
    uid = account.pick()
    if uid is not None and (closed := account.code_readable(uid)) is not None:
        ui.warn(
            f"the egress daemon runs as root: other accounts cannot read {closed}, where vmsandbox's code is "
            "(install it where every account may read it, as `make setup` does, and it runs as a uid of its own)"
        )
        uid = None
    return json.dumps({"uid": uid, "secrets": found}).encode()


def wait_open(spec: Spec, files: paths.SessionPaths, spawned: Spawned, *, timeout: float = START_TIMEOUT) -> None:
    """Wait until the daemon has opened the guest's door (and its published ports); stop it if it cannot."""
    pid, start_time = spawned.pid, spawned.start
    failpoint.hit("run.egress")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = daemon_state(files)
        if st is not None and st.forward is Door.UP:
            return
        if not pids.alive(pid, start_time):
            break
        time.sleep(0.1)
    stop(files)
    lines = files.egress_log.read_text(errors="replace").splitlines() if files.egress_log.exists() else []
    tail = "\n".join(ui.printable(line, markup=False) for line in lines[-8:])  # (written escaped: twice safe)
    raise VmsandboxError(
        f"the egress proxy of session {spec.session} did not open the guest's door within {timeout:.0f} s"
        + (f":\n{tail}" if tail else ""),
        hint=f"see {files.egress_log}; run with `--network none` to go without network",
    )


def stop(files: paths.SessionPaths) -> None:
    st = daemon_state(files)
    if st is None or st.pid is None or not st.alive:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(st.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            if not st.alive:
                return
            time.sleep(0.05)
