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
import errno
import os
import shlex
from pathlib import Path, PurePosixPath

from vmsandbox import paths, sudo
from vmsandbox.confine import beneath
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest import commands
from vmsandbox.guest.bootfiles import Bundle, GuestUser
from vmsandbox.image.blueprint import Blueprint
from vmsandbox.session.record import Record

MAX_LOGIN_BYTES = 1024**2  # a login file is a few KiB; one larger is not kept
LOGINS_DIR = "logins"


def store(blueprint: str) -> Path:
    return paths.config_dir() / LOGINS_DIR / blueprint


def _kept(bp: Blueprint) -> dict[str, bytes]:
    """The blueprint's login files kept on the host, read as the user (under sudo, root reads nothing of their
    config directory) and beneath it (confine.beneath): a link planted there (to root's own keys) leads nowhere,
    a file that is not a plain one or is larger than MAX_LOGIN_BYTES is not read."""
    found: dict[str, bytes] = {}
    with sudo.as_invoker():
        try:
            top = beneath.Root.open(paths.config_dir())
        except OSError:
            return found
        with top:
            for rel in bp.login_files:
                with contextlib.suppress(beneath.Outside):
                    data = top.read(_stored(bp, rel), limit=MAX_LOGIN_BYTES)
                    if data is not None:
                        found[rel] = data
    return found


def _stored(bp: Blueprint, rel: str) -> str:
    """Where a login file is kept beneath the config directory (Outside for a name that is not plain)."""
    return "/".join(beneath.split("/".join([LOGINS_DIR, bp.name, *PurePosixPath(rel).parts])))


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
    """The login files the session holds that differ from those kept, when they are a new or refreshed login."""
    return fresh_login(bp, read(record, bp), _kept(bp))


def fresh_login(bp: Blueprint, now: dict[str, bytes], was: dict[str, bytes]) -> dict[str, bytes]:
    """Of the login files in the guest (`now`), those that differ from the kept ones (`was`), if they are a
    login: where some of them are credentials, one of those must be among them. (Claude Code rewrites
    `.claude.json` at every start, signed in or not: without its `.credentials.json` that is no login, and a
    person who never signed in was asked to keep one.)"""
    fresh = {rel: data for rel, data in now.items() if was.get(rel) != data}
    signs = [rel for rel in bp.login_files if rel in bp.credentials]
    if signs and not any(rel in fresh for rel in signs):
        return {}
    return fresh


def keep(bp: Blueprint, files: dict[str, bytes]) -> list[str]:
    """Keep these login files for later sessions of `bp` (0600, in 0700 directories); the paths kept. Written
    as the user (under sudo, root writes nothing in their config directory) and beneath it (confine.beneath): a
    directory on the way is opened without following a link (one there is refused), each file made beside its
    name and renamed over it."""
    with sudo.as_invoker():
        paths.config_subdir(paths.config_dir())
        with beneath.Root.open(paths.config_dir()) as top:
            for rel, data in files.items():
                _write(top, rel, bp, data)
    return sorted(files)


def _write(top: beneath.Root, rel: str, bp: Blueprint, data: bytes) -> None:
    try:
        where = _stored(bp, rel)
    except beneath.Outside:
        raise VmsandboxError(f"refusing the login file path {rel!r}") from None

    def private(fd: int, _made: bool) -> None:
        os.fchmod(fd, 0o700)

    def made(fd: int, tmp: str) -> None:
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd)
        with os.fdopen(out, "wb") as f:
            f.write(data)

    try:
        top.replace(where, made, temporary=f".{where.rpartition('/')[2]}.", mode=0o700, each=private)
    except NotADirectoryError as exc:
        raise _not_a_directory(where, exc) from exc
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise _not_a_directory(where, exc) from exc


def _not_a_directory(where: str, exc: OSError) -> VmsandboxError:
    part = (exc.filename or "").rpartition("/")[2]
    return VmsandboxError(
        f"{where}: {part} is not a directory of your config (a link?); nothing was kept",
        hint=f"remove it from {paths.config_dir()}, then keep the login again",
    )


def forget(bp: Blueprint) -> list[str]:
    gone = kept(bp)
    with sudo.as_invoker(), beneath.Root.open(paths.config_dir()) as top:
        for rel in gone:
            top.remove(_stored(bp, rel))
    return gone
