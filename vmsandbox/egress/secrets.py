"""Secrets on the host only: one 0600 file per secret in a 0700 directory of the user's config dir.

The proxy reads a secret when it injects it, so `secret set` and `secret rm` take effect on running sessions.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from vmsandbox import filewrite, paths, sudo
from vmsandbox.errors import VmsandboxError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
MAX_BYTES = 64 * 1024


def validate_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise VmsandboxError(
            f"invalid secret name {name!r}", hint="use up to 64 letters, digits, dots, dashes and underscores"
        )
    return name


def directory() -> Path:
    return paths.config_dir() / "secrets"


def _path(name: str) -> Path:
    return directory() / validate_name(name)


def put(name: str, value: str) -> None:
    value = value.rstrip("\r\n")
    if not value:
        raise VmsandboxError("the secret is empty", hint="pipe it in or type it at the prompt")
    if len(value.encode()) > MAX_BYTES or any(c in value for c in "\r\n\0"):
        raise VmsandboxError("a secret is one line of at most 64 KiB")
    with sudo.as_invoker():
        paths.config_subdir(directory())
        filewrite.write_atomically(_path(name), value, mode=0o600)


def get(name: str) -> str | None:
    """The secret, read as the user (under sudo, root follows no link of theirs to a file only root reads)."""
    try:
        where = _path(name)
        with sudo.as_invoker():
            fd = os.open(where, os.O_RDONLY | os.O_NOFOLLOW)
    except (OSError, VmsandboxError):
        return None
    with os.fdopen(fd) as f:
        return f.read(MAX_BYTES + 1).strip() or None


def remove(name: str) -> bool:
    try:
        with sudo.as_invoker():
            _path(name).unlink()
    except FileNotFoundError:
        return False
    return True


@dataclass(frozen=True)
class Stored:
    name: str
    set_at: float
    length: int


def list_all() -> list[Stored]:
    d = directory()
    found: list[Stored] = []
    if not d.is_dir():
        return found
    for f in sorted(d.iterdir()):
        if f.name.startswith(".") or not NAME_RE.match(f.name):
            continue
        with contextlib.suppress(OSError):
            st = f.stat()
            found.append(Stored(f.name, st.st_mtime, st.st_size))
    return found
