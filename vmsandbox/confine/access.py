"""What other accounts may reach, so that vmsandbox works without sudo.

- The image store (base images, blueprint layers, warm-start templates) is shared by every account in the
  `libvirt` group: `host setup` makes it root:libvirt 2775, and each directory and lock file in it is made
  group-writable the same way. That gives a member nothing new: whoever may drive qemu:///system can already
  make QEMU open any file on the host.
- An unprivileged user's sessions live under their own XDG state directory. libvirt's QEMU runs as its own
  account (libvirt-qemu), so it must be able to *traverse* every directory above a session (never list or
  read them) and read the session's fw_cfg files. Directories of the user get a POSIX ACL entry for QEMU's
  uid (what virt-manager offers to do); a directory of someone else that QEMU cannot pass is an error that
  names it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import grp
import os
import pwd
import stat
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from vmsandbox import paths, ui
from vmsandbox.errors import VmsandboxError

GROUP = "libvirt"  # may use qemu:///system (Debian's libvirt-daemon-system makes it; `host setup` too)
SHARED_MODE = 0o2775  # rwx for owner and group, the group inherited by what is made inside
ACL_XATTR = "system.posix_acl_access"
DEFAULT_ACL_XATTR = "system.posix_acl_default"

# POSIX ACL xattr (linux/posix_acl_xattr.h): a version, then (tag, perm, id) entries sorted by tag and id.
_ACL_VERSION = 2
_USER_OBJ, _USER, _GROUP_OBJ, _GROUP, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_NO_ID = 0xFFFFFFFF
_R, _W, _X = 4, 2, 1


def group_gid() -> int | None:
    try:
        return grp.getgrnam(GROUP).gr_gid
    except KeyError:
        return None


def shared_dir(path: Path, *, sticky: bool = False) -> None:
    """Make `path` (and not its parents) a directory of the shared store. Root makes it root:libvirt 2775; a
    member makes it 2775 where it inherits the group (its parent is shared). One made by someone else is left
    as it is. `sticky`: members may remove only their own entries."""
    with contextlib.suppress(FileExistsError):
        path.mkdir()
    st = path.stat()
    if st.st_uid != os.geteuid():
        return
    gid = group_gid()
    if os.geteuid() == 0 and gid is not None:
        os.chown(path, -1, gid)
        path.chmod(SHARED_MODE | (0o1000 if sticky else 0))
    elif gid is not None and st.st_gid == gid:
        path.chmod(SHARED_MODE | (0o1000 if sticky else 0))
    else:
        path.chmod(0o755)


def store_root(images: Path) -> None:
    """The data directory above the store (0755: QEMU and every account pass through it) and the shared images
    directory in it."""
    old = os.umask(0o022)
    try:
        images.parent.mkdir(parents=True, exist_ok=True)
    finally:
        os.umask(old)
    st = images.parent.stat()
    if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o055 != 0o055:
        images.parent.chmod(0o755)  # a 0700 one (an earlier vmsandbox made it with the state directory)
    shared_dir(images)
    shared_dir(images / paths.IMAGE_PINS, sticky=True)


@contextlib.contextmanager
def flocked(path: Path, *, wait: str | None = None) -> Iterator[bool]:
    """An exclusive flock on a lock file in the shared store (made 0664, so every member can take it). Yields
    False at once when someone else holds it and `wait` is None; with `wait`, calls it (to tell the user) once
    and waits."""
    fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o664)
    try:
        if os.fstat(fd).st_uid == os.geteuid():
            os.fchmod(fd, 0o664)  # the umask (077) took the group's bits
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if wait is None:
                yield False
                return
            ui.info(wait)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield True
    finally:
        os.close(fd)


def not_writable(path: Path) -> VmsandboxError:
    """The error for a shared store this account may not add to."""
    return VmsandboxError(
        f"{path} is not writable for you, so this image (or its warm-start template) cannot be made",
        hint=f"let the libvirt group share it: `sudo vmsandbox host setup --user {me()}` (then log in again)",
    )


def me() -> str:
    """Our account's name (our uid where it has none)."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def listed_in_group(user: str) -> bool:
    """Whether the account database puts `user` in the libvirt group (as primary or supplementary group);
    a login that began before they joined does not carry it yet."""
    try:
        group = grp.getgrnam(GROUP)
        return pwd.getpwnam(user).pw_gid == group.gr_gid or user in group.gr_mem
    except KeyError:
        return False


def _parse(raw: bytes) -> list[tuple[int, int, int]]:
    version = struct.unpack_from("<I", raw)[0]
    if version != _ACL_VERSION:
        raise ValueError(f"ACL version {version}")
    return [struct.unpack_from("<HHI", raw, off) for off in range(4, len(raw) - 7, 8)]


def _pack(entries: list[tuple[int, int, int]]) -> bytes:
    entries = sorted(entries, key=lambda e: (e[0], e[2]))
    return struct.pack("<I", _ACL_VERSION) + b"".join(struct.pack("<HHI", *e) for e in entries)


def _acl_of(path: Path) -> list[tuple[int, int, int]]:
    """The access ACL, or the one the mode bits stand for."""
    try:
        return _parse(os.getxattr(path, ACL_XATTR, follow_symlinks=False))
    except OSError:
        return _of_mode(path.lstat())


def _of_mode(st: os.stat_result) -> list[tuple[int, int, int]]:
    mode = stat.S_IMODE(st.st_mode)
    return [(_USER_OBJ, mode >> 6 & 7, _NO_ID), (_GROUP_OBJ, mode >> 3 & 7, _NO_ID), (_OTHER, mode & 7, _NO_ID)]


def acl_at(fd: int, st: os.stat_result) -> list[tuple[int, int, int]]:
    """The access ACL of what the descriptor fd holds (its stat `st`), or the one its mode bits stand for. An ACL
    that cannot be read for another reason than its absence is an OSError: who may do what is then unknown."""
    try:
        return _parse(os.getxattr(fd, ACL_XATTR))
    except OSError as exc:
        if exc.errno not in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
        return _of_mode(st)


def traverse_only_acl(uids: list[int]) -> bytes:
    """An access ACL: the owner rwx, each uid x (traverse, never list or read), nobody else anything."""
    entries = [(_USER_OBJ, 7, _NO_ID), (_GROUP_OBJ, 0, _NO_ID), (_OTHER, 0, _NO_ID)]
    entries += [(_USER, _X, uid) for uid in uids]
    entries.append((_MASK, _X if uids else 0, _NO_ID))
    return _pack(entries)


def inherit_for_me(directory: Path) -> None:
    """A default ACL on a directory of ours: what libvirt and QEMU make in it (as root or as QEMU's account;
    a warm start's identity socket) carries an entry for us, so that we may use it as its mode allows its
    group. Without it an unprivileged owner could not connect to their own session's identity port."""
    me = os.geteuid()
    entries = [(_USER_OBJ, 7, _NO_ID), (_USER, 7, me), (_GROUP_OBJ, 0, _NO_ID), (_MASK, 7, _NO_ID), (_OTHER, 0, _NO_ID)]
    os.setxattr(directory, DEFAULT_ACL_XATTR, _pack(entries), follow_symlinks=False)


def drop_acl(path: Path) -> None:
    """Back to the mode bits alone (a private build directory about to be published)."""
    try:
        os.removexattr(path, ACL_XATTR, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise


def grant(path: Path, uid: int, perms: int) -> None:
    """Add `perms` for `uid` to path's access ACL (keeping every other entry) and widen the mask to carry it.
    The group-owner's entry keeps its bits: the mask only ever grows by `perms`."""
    entries = _acl_of(path)
    found = [e for e in entries if e[0] == _USER and e[2] == uid]
    merged = [e for e in entries if not (e[0] == _USER and e[2] == uid) and e[0] != _MASK]
    had = found[0][1] if found else 0
    merged.append((_USER, had | perms, uid))
    mask = 0
    for tag, bits, _ in merged:
        if tag in (_USER, _GROUP_OBJ, _GROUP):
            mask |= bits
    merged.append((_MASK, mask, _NO_ID))
    os.setxattr(path, ACL_XATTR, _pack(merged), follow_symlinks=False)


def may(path: Path, uid: int, gids: set[int], perms: int) -> bool:
    """Whether the account (uid, gids) has `perms` on path, by its mode and access ACL."""
    return allows(path.stat(), _acl_of(path), uid, gids, perms)


def allows(st: os.stat_result, entries: list[tuple[int, int, int]], uid: int, gids: set[int], perms: int) -> bool:
    """Whether the account (uid, gids) has `perms` on what has the stat `st` and the ACL `entries` (acl_at)."""
    if uid == 0:
        return True
    mask = next((b for t, b, _ in entries if t == _MASK), 7)
    if st.st_uid == uid:
        return next(b for t, b, _ in entries if t == _USER_OBJ) & perms == perms
    named = [b for t, b, i in entries if t == _USER and i == uid]
    if named:
        return named[0] & mask & perms == perms
    groups = [b & mask for t, b, i in entries if (t == _GROUP_OBJ and st.st_gid in gids) or (t == _GROUP and i in gids)]
    if groups:
        return any(b & perms == perms for b in groups)
    return next(b for t, b, _ in entries if t == _OTHER) & perms == perms


@dataclass(frozen=True)
class Writers:
    """Who may write in a directory (add, rename and remove its entries), by its mode and access ACL."""

    uids: frozenset[int]  # its owner and the accounts named in its ACL with write
    gids: frozenset[int]  # its group and the groups named in its ACL with write (their members may)
    everyone: bool  # every account may


def writers(st: os.stat_result, entries: list[tuple[int, int, int]]) -> Writers:
    """Who may write where `st` and `entries` (acl_at) say. The owner always counts: it may give itself the write."""
    mask = next((b for t, b, _ in entries if t == _MASK), 7)
    uids, gids, everyone = {st.st_uid}, set(), False
    for tag, bits, ident in entries:
        masked = bits & mask if tag in (_USER, _GROUP_OBJ, _GROUP) else bits
        if not masked & _W:
            continue
        if tag == _USER:
            uids.add(ident)
        elif tag == _GROUP_OBJ:
            gids.add(st.st_gid)
        elif tag == _GROUP:
            gids.add(ident)
        elif tag == _OTHER:
            everyone = True
    return Writers(frozenset(uids), frozenset(gids), everyone)


def let_traverse(path: Path, uid: int, gids: set[int], who: str) -> list[Path]:
    """Let the account `uid` traverse every directory from / down to `path`. Directories of ours get an ACL
    entry; returns those it changed. One of someone else's it cannot pass is an error."""
    changed: list[Path] = []
    for d in [*reversed(path.parents), path]:
        if may(d, uid, gids, _X):
            continue
        if d.stat().st_uid != os.geteuid():
            raise VmsandboxError(
                f"{who} cannot pass through {d}, above your sessions, so it cannot open their disks",
                hint=f"keep sessions elsewhere: `export VMSANDBOX_STATE_DIR=/some/dir` ({who} must be able to "
                "pass through every directory above it), or ask its owner to `chmod o+x` it",
            )
        try:
            grant(d, uid, _X)
        except OSError as exc:
            raise no_acls(d, exc) from exc
        changed.append(d)
    return changed


def no_acls(path: Path, exc: OSError) -> VmsandboxError:
    return VmsandboxError(
        f"cannot give libvirt's QEMU access to {path} with a POSIX ACL: {exc.strerror or exc}",
        hint="keep sessions on a file system with ACLs (ext4, xfs, btrfs, tmpfs): `export "
        "VMSANDBOX_STATE_DIR=/some/dir`, or run with sudo",
    )


def let_read(path: Path, uid: int) -> None:
    """Let `uid` read one file of ours (QEMU, a session's fw_cfg entries). Never by mode bits: they hold keys."""
    try:
        grant(path, uid, _R)
    except OSError as exc:
        raise no_acls(path, exc) from exc
