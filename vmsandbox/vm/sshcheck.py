"""Why a host reached over ssh does not answer, in ssh's words: a short ssh of our own to the host a libvirt URI
names (the ssh libvirt's transport would run, in batch mode, with a connect timeout, asking only `true`), and
what it says sorted into what a person can act on. libvirt's ssh transport loses ssh's words: a port with no
listener reads "Cannot write data: Broken pipe" there, or a timeout."""

from __future__ import annotations

import enum
import shlex
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

from vmsandbox import proc
from vmsandbox.errors import VmsandboxError

SSH_SCHEMES = ("qemu+ssh", "qemu+libssh", "qemu+libssh2")  # libvirt's transports that go through ssh
SSH_FAILED = 255  # ssh's own failure; any other code is the remote command's: ssh got through


class Kind(enum.StrEnum):
    REFUSED = "refused"
    TIMED_OUT = "timed out"
    NOT_SSH = "not ssh"  # something answers, not as an ssh server (or it closed the connection at once)
    NO_ROUTE = "no route"
    UNRESOLVED = "name not resolved"
    KEY_CHANGED = "host key changed"
    KEY_UNKNOWN = "host key unknown"
    AUTH = "authentication failed"
    OTHER = "ssh failed"


@dataclass(frozen=True)
class Target:
    """Where and how libvirt's ssh transport connects, read from a URI."""

    host: str
    port: int | None = None
    user: str | None = None
    command: str = "ssh"  # libvirt's `command=`: the ssh program it runs (qemu+ssh only)
    keyfile: str | None = None
    known_hosts: str | None = None  # libvirt's `known_hosts=` (its libssh transports)

    @property
    def destination(self) -> str:
        """The host as one would type it to ssh: `-p PORT USER@HOST`."""
        port = f"-p {self.port} " if self.port else ""
        return port + shlex.quote(f"{self.user}@{self.host}" if self.user else self.host)


@dataclass(frozen=True)
class Reason:
    kind: Kind
    said: str  # ssh's own line
    hint: str  # the fix


def target(uri: str) -> Target | None:
    """The ssh a libvirt URI goes through (None: it does not go through ssh)."""
    parts = urlsplit(uri)
    if parts.scheme not in SSH_SCHEMES or not parts.hostname:
        return None
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    return Target(
        parts.hostname,
        parts.port,
        unquote(parts.username) if parts.username else None,
        query.get("command", "ssh") if parts.scheme == "qemu+ssh" else "ssh",
        query.get("keyfile"),
        query.get("known_hosts") if parts.scheme != "qemu+ssh" else None,
    )


def argv(to: Target, connect_timeout: int) -> list[str]:
    """The ssh libvirt would run (its options as its transport passes them), asking only `true`."""
    args = [to.command]
    if to.port:
        args += ["-p", str(to.port)]
    if to.user:
        args += ["-l", to.user]
    if to.keyfile:
        args += ["-i", to.keyfile]
    if to.known_hosts:
        args += ["-o", f"UserKnownHostsFile={to.known_hosts}"]
    args += ["-T", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={connect_timeout}", "-e", "none"]
    return [*args, "--", to.host, "true"]


def check(uri: str, timeout: float) -> Reason | None:
    """Ssh to the host `uri` names and say why it does not get through (None: it got through, or `uri` does not
    go through ssh). ssh's connect timeout is three quarters of `timeout`, so that a host that takes the
    connection and never speaks is reported as such within `timeout`."""
    to = target(uri)
    if to is None:
        return None
    try:
        done = proc.run(argv(to, max(1, int(timeout * 3 / 4))), check=False, timeout=timeout)
    except VmsandboxError as exc:  # ssh is not installed (the hint names the package), or it hung
        return Reason(Kind.OTHER, exc.message, exc.hint or f"`ssh {to.destination} true` from here shows where")
    if done.returncode != SSH_FAILED:
        return None
    return reason(done.stderr, to)


_NOISE = ("Warning: Permanently added", "Pseudo-terminal will not be allocated", "debug")


@dataclass(frozen=True)
class _Rule:
    kind: Kind
    needles: tuple[str, ...]  # any of these in a line of ssh's says it is this kind
    hint: str  # {dest}: the host as typed to ssh; {remove}: ssh's own command to drop a changed key


# First match wins: a changed key's banner also says "verification failed"; a silent port's "timed out" comes
# with "banner exchange".
_RULES = (
    _Rule(
        Kind.KEY_CHANGED,
        ("has changed and you have requested strict checking", "IDENTIFICATION HAS CHANGED"),
        "the host shows another key than your known_hosts holds: if it was reinstalled, compare the new "
        "fingerprint with the host's own (`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` there), then "
        "`{remove}` and `ssh {dest} true` once; if it was not, do not connect",
    ),
    _Rule(
        Kind.KEY_UNKNOWN,
        ("host key is known for", "Host key verification failed"),
        "its key is not in your known_hosts (libvirt never asks): `ssh {dest} true` once from a terminal and "
        "compare the fingerprint it shows with the host's own",
    ),
    _Rule(
        Kind.AUTH,
        ("Permission denied", "Too many authentication failures"),
        "let ssh in by key, without a password (libvirt cannot type one): `ssh-copy-id {dest}`, or add the key "
        "to your agent (`ssh-add`)",
    ),
    _Rule(
        Kind.REFUSED,
        ("Connection refused",),
        "nothing listens on that port there: start sshd there, or correct the port in the URI",
    ),
    _Rule(
        Kind.UNRESOLVED,
        ("Could not resolve hostname", "Name or service not known", "name resolution"),
        "check the host name in the URI (ssh also takes a `Host` alias from ~/.ssh/config)",
    ),
    _Rule(
        Kind.NO_ROUTE,
        ("No route to host", "Network is unreachable", "Host is unreachable"),
        "this machine has no route there: check the address in the URI and your network",
    ),
    _Rule(
        Kind.TIMED_OUT,
        ("timed out during banner exchange",),
        "something takes the connection there and never speaks ssh: check the port in the URI, and whether "
        "sshd there is overloaded",
    ),
    _Rule(
        Kind.TIMED_OUT,
        ("timed out",),
        "the host did not answer in time: check that it is up and that no firewall drops ssh on the way "
        "(`ssh -v {dest} true` shows where it stops)",
    ),
    _Rule(
        Kind.NOT_SSH,
        ("kex_exchange_identification", "banner exchange", "Protocol major versions differ"),
        "that port does not answer as an ssh server (or sshd closed the connection at once: its log there says "
        "why): check the port in the URI",
    ),
)


def reason(stderr: str, to: Target) -> Reason:
    """What ssh's complaint (its stderr when it exits 255) means, and the fix."""
    lines = [ln.strip().strip("@").strip() for ln in stderr.splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith(_NOISE)]
    remove = next((ln for ln in lines if ln.startswith("ssh-keygen -f")), f"ssh-keygen -R {shlex.quote(to.host)}")
    for rule in _RULES:
        said = next((ln for n in rule.needles for ln in lines if n in ln), None)
        if said is not None:
            return Reason(rule.kind, said, rule.hint.format(dest=to.destination, remove=remove))
    return Reason(
        Kind.OTHER,
        lines[-1] if lines else f"ssh exited with {SSH_FAILED} and said nothing",
        f"`ssh -v {to.destination} true` from here shows where it stops",
    )
