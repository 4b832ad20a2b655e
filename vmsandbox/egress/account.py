"""The account a session's egress daemon runs as when vmsandbox runs as root: a uid of its own, which no account
of the system has and no other process runs as, so it owns nothing and can reach nothing of ours.

The daemon parses every request and TLS greeting the guest sends (and, through paramiko, what the guest's sshd
says), so a flaw there must not be root's. It opens what it needs as root (its files: egress.held, the session's
keys and CA, the published ports), reads the secrets its session maps from its stdin, then becomes this uid for
good. Without root there is nothing to drop: it runs as the invoking user, who owns the session anyway.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import pwd
import secrets
from pathlib import Path
from typing import IO

from vmsandbox.confine import access
from vmsandbox.errors import VmsandboxError

# systemd's range for dynamic users (DynamicUser=): Debian makes no account there
UIDS = range(61184, 65520)
_PR_SET_NO_NEW_PRIVS = 38
_X, _R_X = 1, 5


def running_uids(proc: Path = Path("/proc")) -> set[int]:
    """The real, effective and saved uids of every process (its status: /proc/PID itself is root's when the
    process is not dumpable, as a daemon that dropped root is not)."""
    found: set[int] = set()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("Uid:"):
                    found.update(int(u) for u in line.split()[1:])
                    break
    return found


def pick(busy: set[int] | None = None) -> int | None:
    """A uid for a new daemon (None when we are not root: it runs as us)."""
    if os.geteuid() != 0:
        return None
    busy = running_uids() if busy is None else busy
    start = secrets.randbelow(len(UIDS))  # from a random place: two sessions started at once rarely race
    for i in range(len(UIDS)):
        uid = UIDS[(start + i) % len(UIDS)]
        if uid in busy:
            continue
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
    raise VmsandboxError(
        f"no free uid for the egress daemon between {UIDS.start} and {UIDS.stop - 1}",
        hint="that range is for dynamic accounts; move the accounts made in it elsewhere",
    )


def code_readable(uid: int) -> Path | None:
    """None when `uid` can read the code the daemon still imports once it is that uid (vmsandbox's and its
    libraries' directories, and every directory above them); else the first place it cannot pass or read."""
    import importlib.util

    found = [importlib.util.find_spec(name) for name in ("vmsandbox", "paramiko")]
    for top in {Path(spec.origin).parent for spec in found if spec is not None and spec.origin is not None}:
        for d in [*reversed(top.parents), top]:
            if not access.may(d, uid, set(), _R_X if d == top else _X):
                return d
    return None


def become(uid: int) -> None:
    """This process becomes `uid` (its group the same number, no supplementary groups) for good: the kernel
    drops every capability and makes it undumpable (no other process of that uid may trace it), and
    no_new_privs keeps a setuid program from lifting it back."""
    if uid not in UIDS:
        raise ValueError(f"uid {uid} is not one for an egress daemon")
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (uid, uid, uid):
        raise OSError(f"still {os.getresuid()} after switching to uid {uid}")


def handed(stream: IO[bytes] | None) -> tuple[int | None, dict[str, str]]:
    """What control.handover wrote on the daemon's stdin: the uid to become and its session's secrets (None and
    none when nothing was written: a daemon started without a handover, as a test may)."""
    raw = stream.read(1 << 20) if stream is not None else b""
    data = json.loads(raw) if raw.strip() else {}
    if not isinstance(data, dict):
        raise ValueError("the handover on stdin is not a JSON object")  # noqa: TRY004 - a bad value: no start
    uid, given = data.get("uid"), data.get("secrets") or {}
    if not isinstance(given, dict) or not all(isinstance(v, str) for v in given.values()):
        raise ValueError("the handover's secrets are not strings by name")
    return (None if uid is None else int(uid)), {str(k): v for k, v in given.items()}
