"""The person's rights, kept by root. Under sudo, vmsandbox reads a person's project for them as root; it reads
nothing there they could not read themselves, and never through a directory another account can change:

- what it copies, a process of theirs copies (`person`: the uid, gid and groups of who ran sudo), so the kernel
  judges every file as it would judge them;
- what root reads itself (a config file, the credential scan) it reads only where their rights allow (`may`: the
  mode and the access ACL, as the kernel reads them);
- the way to a project is opened from `/` one directory at a time, never through a link (`reach`), and each
  directory on it must be one no other account can change the next step of (`others`): no owner but root or the
  person, and no write for another account — by its group (one with other members), an ACL entry, or the mode
  bits for all — unless it is sticky and the next step is the person's (or root's), which no one else may then
  rename or remove.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from vmsandbox import sudo
from vmsandbox.confine import access
from vmsandbox.confine.accounts import Identity
from vmsandbox.errors import VmsandboxError

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ, WRITE, PASS = 4, 2, 1
LIST = READ | PASS  # a directory's names, and what they name


def person() -> Identity | None:
    """Under sudo, who ran it (uid, gid, groups): whose rights root copies and reads their files with. None when the
    kernel judges already: vmsandbox runs as the person, or as root for root."""
    who = sudo.invoker()
    if who is None or os.geteuid() != 0:
        return None
    groups = tuple(os.getgrouplist(who.pw_name, who.pw_gid))
    return Identity(who.pw_uid, who.pw_gid, groups, who.pw_name, who.pw_dir)


def may(fd: int, who: Identity, perms: int, st: os.stat_result | None = None) -> bool:
    """Whether `who` has `perms` (READ, WRITE, PASS) on what the descriptor fd holds, by its mode and ACL."""
    st = os.fstat(fd) if st is None else st
    return access.allows(st, access.acl_at(fd, st), who.uid, {who.gid, *who.groups}, perms)


def may_at(dir_fd: int, name: str, who: Identity, perms: int) -> bool:
    """may() for the directory `name` of dir_fd (never through a link); False when it is none, or gone."""
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        return may(fd, who, perms)
    finally:
        os.close(fd)


def name_of(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def members(gid: int) -> set[int | str] | None:
    """The accounts of the group gid (by uid; a listed name the password database does not know, by name): its
    listed members and those whose primary group it is. None when the group is not known."""
    try:
        listed = grp.getgrgid(gid).gr_mem
    except KeyError:
        return None
    found: set[int | str] = {p.pw_uid for p in pwd.getpwall() if p.pw_gid == gid}
    for name in listed:
        try:
            found.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            found.add(name)
    return found


Groups = dict[int, "set[int | str] | None"]  # members() of the groups met in one walk (asked once each)


def others(fd: int, me: int, st: os.stat_result | None = None, known: Groups | None = None) -> list[str]:
    """The other accounts (root and `me` apart) that may add, rename or remove entries in the directory fd, as a
    person reads them ("every account", "bob (its owner)", "the group team (bob, carol)", "bob (an ACL entry)").
    `known`: the members of groups already asked in this walk (filled as it goes)."""
    st = os.fstat(fd) if st is None else st
    known = {} if known is None else known
    can = access.writers(st, access.acl_at(fd, st))
    if can.everyone:
        return ["every account"]
    found = [f"{name_of(uid)} ({'its owner' if uid == st.st_uid else 'an ACL entry'})"
             for uid in sorted(can.uids) if uid not in (me, 0)]  # fmt: skip
    for gid in sorted(can.gids):
        try:
            group = grp.getgrgid(gid).gr_name
        except KeyError:
            group = f"gid {gid}"
        if gid not in known:
            known[gid] = members(gid)
        accounts = known[gid]
        if accounts is None:
            found.append(f"the group {group} (its members are not known)")
            continue
        theirs = sorted(name_of(a) if isinstance(a, int) else a for a in accounts if a not in (me, 0))
        if theirs:
            found.append(f"the group {group} ({', '.join(theirs)})")
    return found


def steady(fd: int, me: int, entry: os.stat_result, st: os.stat_result | None = None) -> list[str]:
    """Who else could change what the name `entry` holds in the directory fd (rename it, put another thing in its
    place): others(), but in a sticky directory of root's or the person's only its owner or they may rename an
    entry, so one of theirs stays."""
    st = os.fstat(fd) if st is None else st
    found = others(fd, me, st)
    sticky = st.st_mode & stat.S_ISVTX and st.st_uid in (me, 0) and entry.st_uid in (me, 0)
    return [] if sticky else found


class Changeable(VmsandboxError):  # noqa: N818 - a refusal, like beneath.Outside
    """A directory on the way to a path that another account can change the next step of."""

    def __init__(self, where: Path, step: str, whom: list[str], *, sticky_helps: bool) -> None:
        super().__init__(f"{where} can be changed by {', '.join(whom)}: another account could put something else at "
                         f"{where / step}")  # fmt: skip
        self.where, self.whom = where, whom
        self.sticky_helps = sticky_helps  # the directory is root's or the person's: made sticky, it keeps their entry


@dataclass(frozen=True)
class Reached:
    """A directory opened from `/` (fd: the caller's to close), and the first directory above it that the person
    may not pass (None: they may pass them all, or the kernel judged as we went)."""

    fd: int
    blocked: Path | None


def reach(path: Path, me: int, who: Identity | None) -> Reached:
    """The directory `path` (absolute, its links resolved), opened from `/` one component at a time without
    following a link. Changeable when a directory on the way lets another account than `me` (and root) change the
    next step (`steady`); OSError when a component is missing, not a directory or a link (it changed meanwhile).
    With `who`, the first directory they may not pass is told."""
    fd = os.open("/", DIR_FLAGS)
    blocked: Path | None = None
    here = Path("/")
    try:
        for part in path.parts[1:]:
            st = os.fstat(fd)
            if who is not None and blocked is None and not may(fd, who, PASS, st):
                blocked = here
            fd = _step(fd, st, here, part, me)
            here = here / part
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise
    return Reached(fd, blocked)


def _step(fd: int, st: os.stat_result, here: Path, part: str, me: int) -> int:
    """The directory `part` of fd (at `here`, its stat `st`), once no other account can change it there; fd is
    closed when it is opened."""
    entry = os.stat(part, dir_fd=fd, follow_symlinks=False)
    whom = steady(fd, me, entry, st)
    if whom:
        raise Changeable(here, part, whom, sticky_helps=st.st_uid in (me, 0) and entry.st_uid in (me, 0))
    inner = os.open(part, DIR_FLAGS, dir_fd=fd)
    now = os.fstat(inner)
    if (now.st_dev, now.st_ino) != (entry.st_dev, entry.st_ino):
        os.close(inner)
        raise OSError(errno.ESTALE, "it changed while it was opened", str(here / part))
    os.close(fd)
    return inner
