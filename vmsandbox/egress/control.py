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
import sys
import time
from dataclasses import dataclass
from typing import Any

from vmsandbox import failpoint, paths, pids, proc
from vmsandbox.egress.ports import Publish
from vmsandbox.errors import VmsandboxError

START_TIMEOUT = 60.0


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

    def save(self, files: paths.SessionPaths) -> None:
        data = {**self.__dict__, "publish": [p.as_dict() for p in self.publish]}
        paths.write_atomically(files.egress_daemon, json.dumps(data, indent=1))

    @classmethod
    def load(cls, files: paths.SessionPaths) -> Spec:
        data: dict[str, Any] = json.loads(files.egress_daemon.read_text())
        data["publish"] = tuple(Publish.from_dict(p) for p in data["publish"])
        return cls(**data)


@dataclass(frozen=True)
class DaemonState:
    pid: int | None
    start: str | None
    forward: Door
    error: str | None
    ports: tuple[str, ...] = ()  # where it serves published ports now (Publish.places)

    @property
    def alive(self) -> bool:
        return pids.alive(self.pid, self.start)


def daemon_state(files: paths.SessionPaths) -> DaemonState | None:
    try:
        data = json.loads(files.egress_state.read_text())
    except (OSError, ValueError):
        return None
    served = tuple(str(p) for p in data.get("ports", ()))
    return DaemonState(data.get("pid"), data.get("start"), Door(data.get("forward", "down")), data.get("error"), served)


def write_state(
    files: paths.SessionPaths,
    forward: Door,
    error: str | None = None,
    *,
    pid: int | None = None,
    ports: tuple[str, ...] = (),
) -> None:
    """The daemon's state file: written by the daemon (its own pid), and once by spawn() for it."""
    pid = os.getpid() if pid is None else pid
    data = {
        "pid": pid,
        "start": pids.process_start(pid),
        "forward": forward.value,
        "error": error,
        "since": time.time(),
        "ports": list(ports),
    }
    paths.write_atomically(files.egress_state, json.dumps(data))


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
    argv = [sys.executable, "-m", "vmsandbox.egress.daemon", spec.session]
    pid = proc.spawn_detached(argv, log_file=files.egress_log)
    # stop() finds a daemon by its state file: one is there from now on, even before the daemon writes its own
    # (it waits for the guest's sshd first), so a vmsandbox killed meanwhile leaves nothing gc cannot stop
    write_state(files, Door.DOWN, "starting", pid=pid)
    return Spawned(pid, pids.process_start(pid))


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
    tail = "\n".join(lines[-8:])
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
