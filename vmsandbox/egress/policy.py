"""A session's egress: its policy file, per-session CA and guest placeholders, and its proxy daemon.

The guest's only door out is its own 127.0.0.1:3128, a reverse forward over an SSH connection that the
session's proxy daemon (vmsandbox.egress.daemon) holds open. When the daemon dies the door closes: the guest gets
"connection refused" at once, nothing else changes, and `vmsandbox ls`/`exec`/`shell` say so.
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import shlex
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmsandbox import paths, proc, ui
from vmsandbox.egress import certs, netpolicy
from vmsandbox.egress import secrets as secretstore
from vmsandbox.egress.netpolicy import Mode, Policy
from vmsandbox.egress.proxy import ProxyConfig, SecretRule
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest import ssh
from vmsandbox.image import blueprint
from vmsandbox.session.config import Settings

FWCFG_CA = "ca"  # the session CA certificate, trusted by the guest's system store
START_TIMEOUT = 60.0
ANY_NETWORK = (ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0"))
# Test-only: names the proxy sends to 127.0.0.1 stand-ins ("name=127.0.0.1:PORT,..."), and the CA that
# signs those stand-ins' certificates. Only loopback targets are accepted.
TEST_UPSTREAMS_ENV = "VMSANDBOX_TEST_UPSTREAMS"
TEST_CA_ENV = "VMSANDBOX_TEST_UPSTREAM_CA"


def check_secrets(settings: Settings, *, quiet: bool = False) -> None:
    """Before anything is made: every required secret must be set on the host (an optional one that is not
    only gets a note, unless quiet)."""
    if settings.network is Mode.NONE:
        return
    for m in settings.secrets:
        if secretstore.get(m.secret) is not None:
            continue
        if m.required:
            raise VmsandboxError(
                f"secret {m.secret} (for {m.header} on {m.host}) is not set",
                hint=f"set it with `vmsandbox secret set {m.secret}` (it stays on the host)",
            )
        if not quiet:
            ui.info(
                f"Secret {m.secret} is not set, so {m.host} gets no {m.header} from the host (log in inside "
                f"the guest instead, or `vmsandbox secret set {m.secret}`)"
            )


def upstream_overrides(environ: dict[str, str] | None = None) -> dict[str, tuple[str, int]]:
    env = os.environ if environ is None else environ
    text = env.get(TEST_UPSTREAMS_ENV, "").strip()
    found: dict[str, tuple[str, int]] = {}
    for item in filter(None, (i.strip() for i in text.split(","))):
        name, _, target = item.partition("=")
        address, _, port = target.rpartition(":")
        if address != ssh.LOOPBACK or not port.isdigit():
            raise VmsandboxError(f"{TEST_UPSTREAMS_ENV}: {item!r} must be NAME=127.0.0.1:PORT (loopback only)")
        found[name.strip().lower()] = (address, int(port))
    return found


def prepare(name: str, files: paths.SessionPaths, settings: Settings, *, trusted: bool = False) -> dict[str, str]:
    """Write the session's egress policy (and its CA, as a fw_cfg file for the guest); return the guest
    environment that holds the placeholders."""
    upstreams = upstream_overrides()
    test_ca = os.environ.get(TEST_CA_ENV) or None
    if upstreams:
        ui.warn(f"test-only upstream overrides are active: {', '.join(sorted(upstreams))}")
    rules = [
        SecretRule(m.secret, m.host, m.header, f"vmsandbox-placeholder-{secrets.token_hex(16)}", m.value, m.env)
        for m in settings.secrets
        if settings.network is not Mode.NONE
    ]
    data: dict[str, Any] = {
        "mode": settings.network.value,
        # a host that gets a secret is allowed (over TLS only: that is where the proxy injects)
        "allow": list(dict.fromkeys([*(str(r) for r in settings.rules()), *(f"{r.host}:443" for r in rules)])),
        "allow_networks": list(settings.allow_networks),
        # image builds run the blueprint's own recipe: like the host's debootstrap, they may reach registries
        # that resolve to private addresses (loopback, link-local and metadata stay refused)
        "any_network": trusted,
        "secrets": [r.as_dict() for r in rules],
        "revoked": False,
        "test_upstreams": {k: f"{a}:{p}" for k, (a, p) in upstreams.items()},
        "test_ca": test_ca,
    }
    write_config(files, data)
    if rules:
        certs.create_ca(files.ca_cert, files.ca_key, session=name, hosts=[r.host for r in rules])
        (files.fwcfg_dir / FWCFG_CA).write_bytes(files.ca_cert.read_bytes())
    # a secret that is not set gets no placeholder: the agent then offers its own login instead
    return {r.env: r.placeholder for r in rules if r.env and secretstore.get(r.secret) is not None}


def write_config(files: paths.SessionPaths, data: dict[str, Any]) -> None:
    paths.write_atomically(files.egress_config, json.dumps(data, indent=2, sort_keys=True), mode=0o600)


def read_config(files: paths.SessionPaths) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(files.egress_config.read_text())
    return data


def proxy_config(data: dict[str, Any]) -> ProxyConfig:
    upstreams = {}
    for k, v in data.get("test_upstreams", {}).items():
        address, _, port = v.rpartition(":")
        upstreams[k] = (address, int(port))
    policy = Policy(
        Mode(data["mode"]),
        tuple(netpolicy.parse_rule(a, source="egress.json") for a in data["allow"]),
        upstreams,
        ANY_NETWORK
        if data.get("any_network")
        else tuple(netpolicy.parse_network(n, source="egress.json") for n in data.get("allow_networks", [])),
    )
    return ProxyConfig(
        policy=policy,
        secrets=tuple(SecretRule(**s) for s in data["secrets"]),
        revoked=bool(data.get("revoked")),
        test_ca=Path(data["test_ca"]) if data.get("test_ca") else None,
    )


# ---------------------------------------------------------------- the daemon


@dataclass(frozen=True)
class DaemonState:
    pid: int | None
    start: str | None
    forward: str  # up | down
    error: str | None

    @property
    def alive(self) -> bool:
        return proc.alive(self.pid, self.start)


def daemon_state(files: paths.SessionPaths) -> DaemonState | None:
    try:
        data = json.loads(files.egress_state.read_text())
    except (OSError, ValueError):
        return None
    return DaemonState(data.get("pid"), data.get("start"), data.get("forward", "down"), data.get("error"))


def write_state(files: paths.SessionPaths, forward: str, error: str | None = None) -> None:
    pid = os.getpid()
    data = {"pid": pid, "start": proc.process_start(pid), "forward": forward, "error": error, "since": time.time()}
    paths.write_atomically(files.egress_state, json.dumps(data))


def status(files: paths.SessionPaths, *, wanted: bool) -> str:
    """off (no daemon wanted: no network, no ports), up (the guest's door is open), down (the daemon runs,
    the connection is being restored) or stopped (no daemon: the guest has no egress)."""
    if not wanted:
        return "off"
    st = daemon_state(files)
    if st is None or not st.alive:
        return "stopped"
    return st.forward


def start(name: str, files: paths.SessionPaths, *, timeout: float = START_TIMEOUT) -> None:
    """Start the session's proxy daemon and wait until the guest's door (and its published ports) are open."""
    stop(files)
    files.egress_state.unlink(missing_ok=True)
    pid = proc.spawn_detached([sys.executable, "-m", "vmsandbox.egress.daemon", name], log_file=files.egress_log)
    start_time = proc.process_start(pid)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = daemon_state(files)
        if st is not None and st.forward == "up":
            return
        if not proc.alive(pid, start_time):
            break
        time.sleep(0.1)
    stop(files)
    lines = files.egress_log.read_text(errors="replace").splitlines() if files.egress_log.exists() else []
    tail = "\n".join(lines[-8:])
    raise VmsandboxError(
        f"the egress proxy of session {name} did not open the guest's door within {timeout:.0f} s"
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


# ---------------------------------------------------------------- clean


def clean_script(user: str, credentials: tuple[str, ...]) -> str:
    """Run as root in the guest: drop the placeholders and every credential file the session's blueprint or
    any shipped blueprint names (an agent may have been installed by hand); print what went."""
    rels = " ".join(shlex.quote(r) for r in dict.fromkeys([*blueprint.shipped_credentials(), *credentials]))
    return (
        "set -u; { cat /etc/vmsandbox/proxy.env; "
        "grep -v -e '=vmsandbox-placeholder-' /etc/vmsandbox/session.env || true; } "
        ">/etc/environment.new && mv /etc/environment.new /etc/environment; "
        f'for home in /root "$(getent passwd {shlex.quote(user)} | cut -d: -f6)"; do '
        '[ -n "$home" ] || continue; '
        f"for rel in {rels}; do "
        'f="$home/$rel"; if [ -e "$f" ] || [ -L "$f" ]; then rm -f -- "$f" && echo "$f"; fi; done; done; '
        "git config --system --unset-all credential.helper 2>/dev/null || true"
    )


def revoke(files: paths.SessionPaths) -> None:
    """Placeholders stop being replaced: whatever copied one cannot use it through the proxy any more."""
    data = read_config(files)
    data["revoked"] = True
    write_config(files, data)
