"""The way to a session's guest on another host: the guest's SSH is forwarded to that host's 127.0.0.1 only,
and this machine reaches it through an SSH connection to the host (`ssh -N -L`, the same account, keys and
ssh binary the libvirt URI names), ending on a port of this machine's 127.0.0.1. So no session port is ever
open on a network, and everything that reaches a guest here (ssh, rsync, the egress daemon) reaches it there
unchanged, at 127.0.0.1:<the session's ssh_port>.

The tunnel is a process of its own (it outlives the command that made it, like the session), remembered by pid
and start time in the session directory: a small supervisor (`main` below) that runs that ssh again whenever
it ends (a lost connection), with a growing pause, so the egress daemon's link to the guest comes back by
itself. A command that needs the guest starts the supervisor again when it is gone (a reboot here): on the
same port when it is free, so the pinned known_hosts entry and the ssh config stay right.

The chooser (session.place.choose) checks a host's URI with `ssh_argv` when its abilities say `tunnelled`, and
closes a session's tunnel by its directory alone when its record cannot be read or its host does not answer.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from vmsandbox import filewrite, pids, proc
from vmsandbox.errors import VmsandboxError
from vmsandbox.session.place import hostspec

PID_FILE = "tunnel.json"
LOG_FILE = "tunnel.log"
OPEN_TIMEOUT = 30.0
SSH_SCHEMES = ("qemu+ssh", "qemu+libssh", "qemu+libssh2")


def ssh_argv(uri: str) -> list[str]:
    """The ssh command line (without what to forward) that reaches the host of a libvirt URI as libvirt does:
    its user, port, `keyfile` and `command` (the ssh binary). The host's key is always checked against your
    known_hosts (strict: an unknown or changed key fails): a URI with `no_verify=1` is refused."""
    parts = urlsplit(uri)
    if parts.scheme not in SSH_SCHEMES or not parts.hostname:
        raise VmsandboxError(
            f"sessions on another host reach it over ssh; {uri} is not an ssh URI",
            hint="name the host with qemu+ssh://USER@HOST/system in ~/.config/vmsandbox/config.yaml",
        )
    hostspec.check_host_key(uri, source="a session's tunnel")
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    argv = [query.get("command", "ssh"), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes"]
    argv += ["-o", "ConnectTimeout=15"]
    if parts.port:
        argv += ["-p", str(parts.port)]
    if "keyfile" in query:
        argv += ["-i", query["keyfile"]]
    if parts.username:
        argv += ["-l", parts.username]
    return [*argv, "--", parts.hostname]


def forward_argv(uri: str, local: int, remote: int) -> list[str]:
    """ssh that forwards 127.0.0.1:local here to 127.0.0.1:remote on the host, and nothing else."""
    base = ssh_argv(uri)
    at = base.index("--")
    options = [
        "-N",
        "-o",
        "ExitOnForwardFailure=yes",
        "-o",
        "ServerAliveInterval=15",
        "-o",
        "ServerAliveCountMax=4",
        "-L",
        f"127.0.0.1:{local}:127.0.0.1:{remote}",
    ]
    return [*base[:at], *options, *base[at:]]


def _state(root: Path) -> dict[str, object] | None:
    try:
        data = json.loads((root / PID_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def alive(root: Path) -> bool:
    found = _state(root)
    if found is None:
        return False
    pid, start = found.get("pid"), found.get("start")
    return isinstance(pid, int) and isinstance(start, str) and pids.alive(pid, start)


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def open_(root: Path, uri: str, local: int, remote: int) -> None:
    """Start the tunnel (closing one that ran) and wait until it listens on 127.0.0.1:local."""
    close(root)
    argv = proc.own_module("vmsandbox.session.place.remote.tunnel", uri, str(local), str(remote))
    pid = proc.spawn_detached(argv, log_file=root / LOG_FILE)
    filewrite.write_atomically(root / PID_FILE, json.dumps({"pid": pid, "start": pids.process_start(pid)}))
    deadline = time.monotonic() + OPEN_TIMEOUT
    while time.monotonic() < deadline:
        if not alive(root):
            break
        if not port_free(local):  # ssh listens (ExitOnForwardFailure: it would have died if it could not)
            return
        time.sleep(0.1)
    close(root)
    log = (root / LOG_FILE).read_text(errors="replace").strip().splitlines()[-3:]
    raise VmsandboxError(
        f"could not open the ssh tunnel to the session's host ({uri}): " + (" / ".join(log) or "no answer"),
        hint="check that `virsh -c URI version` works from here (ssh by key, without a password)",
    )


def close(root: Path) -> None:
    found = _state(root)
    if found is not None and alive(root):
        pid = found["pid"]
        if isinstance(pid, int):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    (root / PID_FILE).unlink(missing_ok=True)


def main(args: list[str]) -> int:
    """The supervisor: `python -m vmsandbox.session.place.remote.tunnel URI LOCAL REMOTE` runs the forwarding ssh
    until it is stopped (SIGTERM, which ends ssh with it), again after each end."""
    uri, local, remote = args[0], int(args[1]), int(args[2])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    pause = 0.25
    while True:
        started = time.monotonic()
        result = proc.run(forward_argv(uri, local, remote), check=False)
        print(f"ssh ended ({result.returncode}): {result.stderr.strip()[-500:]}", flush=True)
        pause = 0.25 if time.monotonic() - started > 60 else min(pause * 2, 30.0)
        time.sleep(pause)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
