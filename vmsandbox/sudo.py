"""Who ran `sudo vmsandbox`, and running a block as them: what root writes among the invoking user's files
(their configuration, secrets, logins) is written as that user."""

from __future__ import annotations

import contextlib
import os
import pwd
import threading
from collections.abc import Iterator


def invoker() -> pwd.struct_passwd | None:
    """Who ran `sudo vmsandbox`, when that is what runs us (root, with SUDO_USER naming another account)."""
    user, uid = os.environ.get("SUDO_USER"), os.environ.get("SUDO_UID", "0")
    if os.getuid() != 0 or not user or uid == "0":  # (the real uid: as_invoker changes only the effective one)
        return None
    try:
        found = pwd.getpwnam(user)
    except KeyError:
        return None
    return found if str(found.pw_uid) == uid else None


_as_invoker_lock = threading.RLock()


@contextlib.contextmanager
def as_invoker() -> Iterator[None]:
    """Under sudo, the block runs as the invoking user (effective uid, gid and groups): whatever root writes in
    that user's config directory is written as the user, so a link the user's account planted there (at any
    depth, to any file) leads nowhere the user could not write already; and what is made is theirs. Without
    sudo it changes nothing."""
    who = invoker()
    if who is None:
        yield
        return
    with _as_invoker_lock:  # (the effective ids are the whole process's: one switch at a time, nested ones inside it)
        if os.geteuid() != 0:
            yield
            return
        groups, gid = os.getgroups(), os.getegid()
        os.setgroups(os.getgrouplist(who.pw_name, who.pw_gid))
        os.setegid(who.pw_gid)
        os.seteuid(who.pw_uid)
        try:
            yield
        finally:
            os.seteuid(0)
            os.setegid(gid)
            os.setgroups(groups)
