"""Who may touch what on the host: private state directories, and unprivileged, limited processes for
everything that parses bytes that came out of a guest.

The guest is hostile, so whatever reads its bytes on the host is a target: the rsync receiver that fills the
session's mirror of the guest's tree, git fetching the guest's commits (a dead VM's workspace disk is not
parsed on the host at all: a reader VM mounts it, session.end.diskreader). None of them runs as root:

- the mirror and the rsync receiver belong to the dedicated system account `_vmsandbox`
  (made by `vmsandbox host setup`), which owns nothing else and can reach nothing else of ours;
- git runs as the invoking user in their own repository (its objects must be theirs anyway);
- each of them gets resource limits (file size, memory, CPU time, processes).

State directories are 0700 with a POSIX ACL that lets exactly two other accounts *traverse* them (never list
or read): libvirt's QEMU user, which opens the session's disks and fw_cfg files, and `_vmsandbox`, which
reaches the mirror. No other local user can enter a session directory.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import pwd
import re
import resource
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from vmsandbox import paths
from vmsandbox.confine import access
from vmsandbox.errors import VmsandboxError

log = logging.getLogger(__name__)

ACCOUNT = "_vmsandbox"  # the unprivileged owner of guest data on the host
QEMU_CONF = Path("/etc/libvirt/qemu.conf")
QEMU_USERS = ("libvirt-qemu", "qemu")  # Debian/Ubuntu, then Fedora/Arch, when qemu.conf does not say
GIB = 1024**3


@dataclass(frozen=True)
class Identity:
    """An account a child process switches to before it runs (uid, gid and supplementary groups)."""

    uid: int
    gid: int
    groups: tuple[int, ...] = ()
    name: str = ""
    home: str = "/nonexistent"


@dataclass(frozen=True)
class Limits:
    """Resource limits set in a child before it runs (None: leave the inherited limit)."""

    file_bytes: int | None = None  # RLIMIT_FSIZE: the largest file it may write
    memory_bytes: int | None = None  # RLIMIT_AS
    cpu_seconds: int | None = None  # RLIMIT_CPU
    processes: int | None = None  # RLIMIT_NPROC: counts every process of the account

    def apply(self) -> None:
        """In the child, after it switched identity: limits can only go down from there."""
        for kind, value in (
            (resource.RLIMIT_FSIZE, self.file_bytes),
            (resource.RLIMIT_AS, self.memory_bytes),
            (resource.RLIMIT_CPU, self.cpu_seconds),
            (resource.RLIMIT_NPROC, self.processes),
        ):
            if value is not None:
                resource.setrlimit(kind, (value, value))


def clean_env(who: Identity | None) -> dict[str, str]:
    """The environment of a child that handles guest data: a PATH, `who`'s home (or none) and a UTF-8 locale.
    Nothing of ours (our HOME, SSH_AUTH_SOCK …) leaks to it."""
    home = who.home if who is not None else "/nonexistent"
    return {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": home, "LC_ALL": "C.UTF-8"}


def guest_data_limits(file_bytes: int) -> Limits:
    """For the rsync receiver: the largest file the sync takes, and generous bounds on
    the rest (an honest transfer of a large tree stays far below them)."""
    return Limits(file_bytes=file_bytes, memory_bytes=4 * GIB, cpu_seconds=3600, processes=64)


# git as the invoking user: their own process count is unknown, so no process limit; memory for big packs.
GIT_LIMITS = Limits(memory_bytes=16 * GIB, cpu_seconds=3600)


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    """vmsandbox runs with umask 077 (everything it writes is private); image builds, which make files for
    every account of a guest, run under another."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def state_dirs() -> None:
    """The state directory (when we make it) and its sessions directory: private, traversable by QEMU's user
    and the guest-data account only (the directories above them: `give_to_qemu`)."""
    state, uids = paths.state_dir(), traversers()
    if not state.exists():
        make_private_dir(state)
    elif not _passable(state, uids):  # made before `host setup` made the guest-data account (its first run does)
        private_dir(state)
    sessions = paths.sessions_dir()
    if not sessions.exists() or sessions.stat().st_mode & 0o077 not in (0, 0o010) or not _passable(sessions, uids):
        make_private_dir(sessions)


def _passable(directory: Path, uids: list[int]) -> bool:
    """Whether every account that must pass through a state directory may."""
    return all(access.may(directory, uid, set(), 1) for uid in uids)


def guest_data_account() -> Identity | None:
    """The account that owns the mirror and runs the processes that parse guest data. None when we are not
    root (then we are unprivileged already)."""
    if os.geteuid() != 0:
        return None
    found = account()
    if found is None:
        raise VmsandboxError(
            f"the unprivileged account {ACCOUNT}, which reads what comes out of a guest, does not exist",
            hint="create it with `sudo vmsandbox host setup`",
        )
    return found


def account() -> Identity | None:
    """The guest-data account, if `host setup` made it."""
    try:
        pw = pwd.getpwnam(ACCOUNT)
    except KeyError:
        return None
    return Identity(pw.pw_uid, pw.pw_gid, (), ACCOUNT)


def invoking_user(uid: int, gid: int) -> Identity | None:
    """The project's owner, for git in their repository. None when that is who we are already."""
    if os.geteuid() != 0 or uid == 0:
        return None
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        return Identity(uid, gid, (gid,))
    return Identity(uid, gid, tuple(os.getgrouplist(pw.pw_name, gid)), pw.pw_name, pw.pw_dir)


def qemu_account() -> Identity | None:
    """libvirt's QEMU account, with its groups."""
    uid = qemu_uid()
    if uid is None:
        return None
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        return Identity(uid, uid, (), str(uid))
    return Identity(uid, pw.pw_gid, tuple(os.getgrouplist(pw.pw_name, pw.pw_gid)), pw.pw_name)


def qemu_uid() -> int | None:
    """The uid libvirt runs QEMU as (qemu.conf's `user`, else the distribution's default account)."""
    names: list[str] = []
    try:
        text = QEMU_CONF.read_text()
    except OSError:
        text = ""
    m = re.search(r'^\s*user\s*=\s*"([^"]+)"', text, re.MULTILINE)
    if m:
        names.append(m.group(1))
    names += QEMU_USERS
    for name in names:
        if name.startswith("+") and name[1:].isdigit():
            return int(name[1:])
        try:
            return pwd.getpwnam(name).pw_uid
        except KeyError:
            continue
    return None


def give_to_qemu(directory: Path, account: int | None = None) -> None:
    """Files that QEMU itself opens (fw_cfg entries; it runs as libvirt's unprivileged user, or as the session's
    own `account`: confine.pool): readable by that account through an ACL entry each, and nothing more — the
    directory and the files stay ours (its QEMU may neither add a link beside them for us to follow, nor rewrite
    what we read back). QEMU must pass every directory above them (the session's disks sit beside them; a home
    that is 0700, say): those of ours it cannot pass get an ACL entry for it (root's too: QEMU never runs as
    root)."""
    qemu = qemu_account() if account is None else Identity(account, account, (), f"session account {account}")
    if qemu is None:
        return
    uid = qemu.uid
    for d in access.let_traverse(directory, uid, set(qemu.groups), f"libvirt's QEMU ({qemu.name})"):
        log.info("%s: QEMU's account %s may now pass through it (an ACL entry)", d, qemu.name)
    for f in directory.iterdir():
        if not stat.S_ISREG(f.lstat().st_mode):
            raise VmsandboxError(f"{f} is not a file vmsandbox made", hint="remove the session and make it again")
        access.let_read(f, uid)


def traversers() -> list[int]:
    """The accounts that must traverse state directories: QEMU's user and the guest-data account."""
    guest_data = account()
    found = [qemu_uid(), guest_data.uid if guest_data is not None else None]
    return sorted({uid for uid in found if uid is not None and uid != os.geteuid()})


def private_dir(path: Path, *, traverse: bool = True) -> None:
    """Make `path` (an existing directory of ours) 0700; with `traverse`, let QEMU's user and the guest-data
    account pass through it. Where the filesystem has no ACLs, it falls back to 0711 (other users can pass
    through but list nothing; everything inside stays 0600/0700) and logs why."""
    path.chmod(0o700)
    uids = traversers() if traverse else []
    if not uids:
        return
    try:
        os.setxattr(path, access.ACL_XATTR, access.traverse_only_acl(uids), follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM):
            raise
        log.warning("%s: no POSIX ACLs here (%s); mode 0711 instead", path, exc.strerror)
        path.chmod(0o711)


def make_private_dir(path: Path, *, traverse: bool = True) -> None:
    """mkdir (parents as needed: 0755, only the leaf is private) and make it private; an existing directory is
    made private too."""
    with umask(0o022):
        path.parent.mkdir(parents=True, exist_ok=True)
    path.mkdir(exist_ok=True, mode=0o700)
    private_dir(path, traverse=traverse)


def hand_over(root: Path, who: Identity | None) -> None:
    """Give a tree to `who` (no symlink followed) and drop what must never exist on the host: setuid, setgid
    and sticky bits and world-writable modes. The root itself becomes 0700.

    The tree may be written meanwhile by the account it is handed to, so it is walked by descriptors
    (`os.fwalk`): each directory is entered from its parent's descriptor and checked to be the directory
    that was listed, and each entry is changed through a descriptor opened beside it with O_NOFOLLOW. A
    directory swapped for a link (to /etc, say) is skipped, never walked or changed."""
    for _dirpath, dirnames, filenames, dir_fd in os.fwalk(root, follow_symlinks=False):
        for name in [*dirnames, *filenames]:
            with contextlib.suppress(FileNotFoundError):  # removed meanwhile: nothing to hand over
                _settle(name, who, dir_fd)
    _settle(str(root), who, None)
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(root_fd, 0o700)
    finally:
        os.close(root_fd)


UNSAFE_BITS = 0o7002  # setuid, setgid, sticky, world-writable


def _settle(name: str, who: Identity | None, dir_fd: int | None) -> None:
    """One entry (`name` in the directory `dir_fd`), through an O_PATH descriptor: even if something swapped
    it for a symlink meanwhile, only the entry itself is changed, never what a link points at."""
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if stat.S_ISLNK(st.st_mode):
            if who is not None:
                os.chown(name, who.uid, who.gid, dir_fd=dir_fd, follow_symlinks=False)
            return
        this = Path(f"/proc/self/fd/{fd}")  # the very inode we checked, whatever the path holds now
        if who is not None and (st.st_uid, st.st_gid) != (who.uid, who.gid):
            os.chown(this, who.uid, who.gid)
        if st.st_mode & UNSAFE_BITS:
            this.chmod(stat.S_IMODE(st.st_mode) & ~UNSAFE_BITS & 0o777)
    finally:
        os.close(fd)
