"""Logins that outlive a session. An agent signed in with a subscription (Claude's `/login`, a ChatGPT or
Google sign-in) keeps its credential in files of the guest's home (the blueprint's `login: files:`); those die
with the VM. `vmsandbox login add AGENT` (or `--from NAME`, or a yes at the end of a run) keeps them on the host,
0600 in a 0700 directory of the user's config, and every later session of that blueprint gets them copied in
at boot, like `copy:` files.

What comes back is guest bytes: they are only ever stored and copied into later guests, never read or parsed
on the host (base64 from the guest, size-bounded), and only on the person's say-so (a command, or a question
at a terminal): a guest that rewrote its login file (another account's token, a config that points the agent
elsewhere) would otherwise reach every later session of that agent."""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import shlex
import stat
from pathlib import Path, PurePosixPath

from vmsandbox import paths
from vmsandbox.confine import sudo
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest import commands
from vmsandbox.guest.files import Bundle, GuestUser
from vmsandbox.image.blueprint import Blueprint
from vmsandbox.session.record import Record

MAX_LOGIN_BYTES = 1024**2  # a login file is a few KiB; one larger is not kept
LOGINS_DIR = "logins"


def store(blueprint: str) -> Path:
    return paths.config_dir() / LOGINS_DIR / blueprint


def _kept(bp: Blueprint) -> dict[str, bytes]:
    """The blueprint's login files kept on the host, read as the user (under sudo, root reads nothing of their
    config directory) and never through a link: a link planted there (to root's own keys) leads nowhere."""
    found: dict[str, bytes] = {}
    top_dir = paths.config_dir()
    with sudo.as_invoker():
        try:
            top = os.open(top_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return found
        try:
            for rel in bp.login_files:
                data = _read_under(top, [LOGINS_DIR, bp.name, *PurePosixPath(rel).parts])
                if data is not None:
                    found[rel] = data
        finally:
            os.close(top)
    return found


def _read_under(top: int, parts: list[str]) -> bytes | None:
    """The regular file parts[-1] below the directory fd `top`, reached without following any link, at most
    MAX_LOGIN_BYTES (None when it is not there, not a plain file, or larger)."""
    if any(p in ("", ".", "..") or "/" in p for p in parts):
        return None
    fd = os.dup(top)
    try:
        for part in parts[:-1]:
            try:
                inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError:
                return None
            os.close(fd)
            fd = inner
        try:
            f = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
        except OSError:
            return None
        with os.fdopen(f, "rb") as opened:
            if not stat.S_ISREG(os.fstat(opened.fileno()).st_mode):
                return None
            data = opened.read(MAX_LOGIN_BYTES + 1)
        return data if len(data) <= MAX_LOGIN_BYTES else None
    finally:
        os.close(fd)


def kept(bp: Blueprint) -> list[str]:
    """The blueprint's login files kept on the host."""
    return sorted(_kept(bp))


def add_to(bundle: Bundle, bp: Blueprint) -> list[str]:
    """Copy the kept login of `bp` into a session's boot bundle; a note per file."""
    found = _kept(bp)
    for rel, data in found.items():
        bundle.add_bytes(bundle.owner.guest_home / rel, data, 0o600)
    return [f"{bp.name}'s login ({rel}, kept by `vmsandbox login`)" for rel in found]


def read(record: Record, bp: Blueprint) -> dict[str, bytes]:
    """The login files as they are in the session's guest now (those that exist), as bytes."""
    if not bp.login_files:
        raise VmsandboxError(
            f"blueprint {bp.name} names no login files", hint=f"add `login: {{files: [...]}}` to {bp.source}"
        )
    home = GuestUser(record.user, record.uid, record.gid).guest_home
    found: dict[str, bytes] = {}
    for rel in bp.login_files:
        path = shlex.quote(str(home / PurePosixPath(rel)))
        script = (
            f"test -f {path} && ! test -L {path} || exit 3; "
            f"test $(stat -c %s {path}) -le {MAX_LOGIN_BYTES} || exit 4; base64 -w0 {path}"
        )
        done = commands.run_as_root(record.endpoint(), script, check=False, max_output=2 * MAX_LOGIN_BYTES)
        if done.returncode == 3:
            continue
        if done.returncode != 0:
            raise VmsandboxError(f"the login file ~/{rel} of session {record.name} could not be read (too large?)")
        try:
            found[rel] = base64.b64decode(done.stdout.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise VmsandboxError(f"the login file ~/{rel} of session {record.name} came back garbled") from None
    return found


def changed(record: Record, bp: Blueprint) -> dict[str, bytes]:
    """The login files the session holds that differ from those kept (a new or refreshed login)."""
    now = read(record, bp)
    was = _kept(bp)
    return {rel: data for rel, data in now.items() if was.get(rel) != data}


def keep(bp: Blueprint, files: dict[str, bytes]) -> list[str]:
    """Keep these login files for later sessions of `bp` (0600, in a 0700 directory); the paths kept. Written
    as the user (under sudo, root writes nothing in their config directory) and never through a link: each
    directory is opened without following one, the file made beside its name and renamed over it."""
    with sudo.as_invoker():
        paths.config_subdir(paths.config_dir())
        top = os.open(paths.config_dir(), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            for rel, data in files.items():
                _write_under(top, [LOGINS_DIR, bp.name, *PurePosixPath(rel).parts], data)
        finally:
            os.close(top)
    return sorted(files)


def _write_under(top: int, parts: list[str], data: bytes) -> None:
    """parts[-1] in the directory parts[:-1] below the directory fd `top`: each directory made 0700 where it is
    missing and opened without following a link (one there is refused), the file written 0600 and renamed."""
    if any(p in ("", ".", "..") or "/" in p for p in parts):
        raise VmsandboxError(f"refusing the login file path {'/'.join(parts)!r}")
    fd = os.dup(top)
    try:
        for part in parts[:-1]:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o700, dir_fd=fd)
            try:
                inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                raise VmsandboxError(
                    f"{'/'.join(parts)}: {part} is not a directory of your config (a link?); nothing was kept",
                    hint=f"remove it from {paths.config_dir()}, then keep the login again",
                ) from exc
            os.close(fd)
            fd = inner
            os.fchmod(fd, 0o700)
        tmp = f".{parts[-1]}.{os.getpid()}.tmp"
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd)
        try:
            with os.fdopen(out, "wb") as f:
                f.write(data)
            os.rename(tmp, parts[-1], src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=fd)
            raise
    finally:
        os.close(fd)


def forget(bp: Blueprint) -> list[str]:
    gone = kept(bp)
    with sudo.as_invoker():
        for rel in gone:
            (store(bp.name) / rel).unlink()
    return gone
