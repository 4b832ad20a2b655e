"""What may be a project: a tree of the person's own, and nothing the system or another account keeps. Checked
where a session's project is opened (create.py; resolve.py before a project's config is read), so the terminal,
the page and the API refuse the same trees with the same words.

Refused, by what a tree is rather than by its name:
- **Not the person's.** The top or any directory in it owned by another account than the person's (under sudo,
  the person is who ran sudo), or writable by another account (every account, a group with other members, an ACL
  entry): another account's home or `.ssh` at any depth, `/tmp` and `/dev/shm` (anyone's files and links land
  there), a team's shared tree — and a tree nobody listed that another account keeps or can write in.
- **On a way another account can change.** The project is opened once, from `/`, one directory at a time and never
  through a link (confine.rights.reach); each directory above it must be one no other account can rename the next
  step in (a team directory `root:team 2775` is not, unless it is sticky), and under sudo one the person may pass.
  The tree is checked from that descriptor, and a capture copies from it (`opened`): what was checked is what is
  copied, whatever the path holds by then.
- **The system's.** A tree of the Filesystem Hierarchy Standard's system directories (/etc, /usr, /boot, /run,
  /proc, /sys, /dev, /var, …): the project is one of them, inside one, or holds one — by device and inode, so a
  bind mount or a link to /etc by another name is /etc too (root owns these trees: ownership alone lets root in).
- **Homes.** `/` and any directory at or above a home (the person's, or any account's in the password database);
  inside the person's own key and config directories; holding `.ssh`, `.gnupg` or `.password-store` at its top.
- vmsandbox's own state, config and data (every session's keys and mirrors).
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import stat
from collections.abc import Iterator
from pathlib import Path

from vmsandbox import paths, sudo
from vmsandbox.confine import beneath, rights
from vmsandbox.errors import VmsandboxError

KEY_DIRS = (".ssh", ".gnupg", ".aws", ".kube", ".docker", ".password-store", ".config", ".local")
# Of those, the ones no project holds at its top (.config and .docker do: .NET's tool manifest, compose setups):
# a directory holding one is a home by another name, or a copy of one.
HOME_MARKERS = (".ssh", ".gnupg", ".password-store")
# The Filesystem Hierarchy Standard's trees of the system (its programs, libraries, configuration, variable state,
# boot files and the kernel's own file systems), and inside them the one that is anyone's (FHS: /var/tmp).
SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run", "/sbin",
                "/sys", "/usr", "/var")  # fmt: skip
OPEN_TREES = ("/var/tmp",)  # noqa: S108  (a place, not a file made there)
HOME_PARENTS = ("/home",)  # where accounts' homes are made: a project may be in one, never the whole of it
HINT = "run vmsandbox inside a project directory of yours"

Identity = tuple[int, int]


def person() -> pwd.struct_passwd | None:
    """Whose project it must be: who ran sudo, or the account that runs vmsandbox."""
    found = sudo.invoker()
    if found is not None:
        return found
    with contextlib.suppress(KeyError):
        return pwd.getpwuid(os.geteuid())
    return None


def person_uid() -> int:
    who = person()
    return os.geteuid() if who is None else who.pw_uid


def _homes() -> list[Path]:
    """The homes of whoever runs vmsandbox: $HOME, the account's own, and under sudo the invoking user's."""
    found = [Path.home()]
    with contextlib.suppress(KeyError):
        found.append(Path(pwd.getpwuid(os.geteuid()).pw_dir))
    invoker = sudo.invoker()
    if invoker is not None:
        found.append(Path(invoker.pw_dir))
    return [h.resolve() for h in found if str(h) not in ("", "/")]


def _identity(path: str | Path) -> Identity | None:
    try:
        st = Path(path).stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _trees(names: tuple[str, ...]) -> dict[Identity, str]:
    return {found: name for name in names if (found := _identity(name)) is not None}


def validate_project(path: Path) -> Path:
    """The project directory, resolved, once it is a tree of the person's own (the module says what is not)."""
    with opened(path) as project:
        return project.path


@contextlib.contextmanager
def opened(path: Path) -> Iterator[beneath.Root]:
    """The project, opened once (from `/`, never through a link) and checked from that descriptor: a capture that
    copies from it copies the tree that was checked, whatever its path holds by then."""
    project = open_project(path)
    try:
        yield project
    finally:
        project.close()


def open_project(path: Path) -> beneath.Root:
    """The project directory (its path resolved) opened as `opened` says, once it is a tree of the person's own; the
    caller closes it."""
    if not path.exists():
        raise VmsandboxError(f"{path} does not exist", hint="give the path of a project directory")
    if not path.is_dir():
        raise VmsandboxError(f"{path} is not a directory", hint="give the path of a project directory")
    resolved = path.resolve()
    _not_a_home(resolved)
    system, open_ = _trees(SYSTEM_TREES), _trees(OPEN_TREES)
    _not_the_systems(resolved, system, open_)
    _no_other_home(resolved)
    own = _vmsandbox_own(resolved)
    if own is not None:
        raise VmsandboxError(f"refusing to sandbox {resolved}: it {own} (every session's keys, mirrors and secrets)",
                             hint=HINT)  # fmt: skip
    top = beneath.Root(_reach(resolved), resolved)
    try:
        _no_home_markers(top)
        _all_the_persons(top, system)
    except BaseException:
        top.close()
        raise
    return top


def _no_home_markers(top: beneath.Root) -> None:
    """Not holding `.ssh`, `.gnupg` or `.password-store` at its top (a home by another name, or a copy of one)."""
    held = [m for m in HOME_MARKERS if _is_dir(top.fd, m)]
    if held:
        raise VmsandboxError(
            f"refusing to sandbox {top.path}: it holds {', '.join(held)}, like a home directory (keys and config "
            "the agent would read)",
            hint=f"{HINT}; move {top.path / held[0]} out of the project if it is the project's own",
        )


def _is_dir(fd: int, name: str) -> bool:
    try:
        return stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _reach(resolved: Path) -> int:
    """A descriptor of the project, opened from `/` on a way no other account can change (rights.reach); under sudo
    a way the person may pass, too (what they could not reach is not theirs to read through vmsandbox)."""
    me, who = person_uid(), rights.person()
    try:
        reached = rights.reach(resolved, me, who)
    except rights.Changeable as exc:
        sticky = f"`sudo chmod +t {exc.where}` (then only an entry's owner may rename it)"
        shared = f"; if {exc.where} is shared on purpose, make it sticky: {sticky}" if exc.sticky_helps else ""
        raise VmsandboxError(
            f"refusing to sandbox {resolved}: {exc.message}",
            hint=f"keep the project where only you can change the way to it (in your home, say){shared}",
        ) from None
    except OSError as exc:
        closed = exc.errno == errno.EACCES  # (root kept out: a home on NFS that squashes root)
        raise VmsandboxError(
            f"refusing to sandbox {resolved}: {exc.filename or resolved} could not be opened as a directory "
            f"({exc.strerror})",
            hint="run vmsandbox as yourself (a member of the libvirt group), without sudo"
            if closed
            else "try again once nothing else changes it",
        ) from None
    if reached.blocked is not None and who is not None:
        try:
            _check_dir(resolved, resolved, reached.fd, me, {})  # (whose the tree is tells more: said first)
        finally:
            os.close(reached.fd)
        raise VmsandboxError(
            f"refusing to sandbox {resolved}: you ({who.name}) may not pass {reached.blocked}, above it; vmsandbox "
            "reads for you only what you could read yourself",
            hint=f"run vmsandbox on a project you can reach (or as an account that can), or let yourself through "
            f"{reached.blocked} if that is meant",
        )
    return reached.fd


def _not_a_home(resolved: Path) -> None:
    """Not `/`, nor the person's home or a directory above one, nor inside a home's key and config
    directories."""
    if resolved == Path("/") or any(resolved == h or resolved in h.parents for h in _homes()):
        raise VmsandboxError(f"refusing to sandbox {resolved}: it is too broad (it holds a home directory)", hint=HINT)
    if resolved.parent == paths.sandbox_projects().resolve():
        return  # an API sandbox's own empty project: in the state directory, which a plain account has in ~/.local
    for home in _homes():
        for keys in KEY_DIRS:
            if resolved.is_relative_to(home / keys):
                raise VmsandboxError(
                    f"refusing to sandbox {resolved}: it is inside {home / keys}, which holds your keys or config",
                    hint=HINT,
                )


def _no_other_home(resolved: Path) -> None:
    """Not at or above any account's home (the password database's)."""
    me = person_uid()
    for account in pwd.getpwall():
        home = Path(account.pw_dir)
        if account.pw_uid == me or not home.is_absolute() or home == Path("/"):
            continue
        if resolved == home or resolved in home.parents:
            raise VmsandboxError(
                f"refusing to sandbox {resolved}: it holds the home of {account.pw_name} ({home})", hint=HINT
            )


def _not_the_systems(resolved: Path, system: dict[Identity, str], open_: dict[Identity, str]) -> None:
    """Neither a system tree nor inside one, whatever path leads there (by device and inode); nor /home."""
    parents, found = _trees(HOME_PARENTS), _identity(resolved)
    if found is not None and found in parents:
        raise VmsandboxError(f"refusing to sandbox {resolved}: it is {parents[found]}, where accounts' homes are made",
                             hint=HINT)  # fmt: skip
    for at in (resolved, *resolved.parents):
        found = _identity(at)
        if found in open_:
            return
        if found in system:
            where = "it is" if at == resolved else "it is inside"
            raise VmsandboxError(
                f"refusing to sandbox {resolved}: {where} the system's {system[found]}",
                hint=f"{HINT} (copy what you need of {system[found]} into one)",
            )


def _all_the_persons(top: beneath.Root, system: dict[Identity, str]) -> None:
    """The top and every directory in it owned by the person and closed to other accounts' writes, none of them a
    system tree (a bind mount of one): walked from the top's descriptor, each directory checked before it is listed,
    one descriptor held per level. Links are not followed; a directory the person cannot list is not looked into
    (their copy fails there)."""
    me, who = person_uid(), rights.person()
    levels: list[tuple[Path, int, Iterator[str]]] = []
    known: rights.Groups = {}

    def enter(here: Path, fd: int) -> None:
        try:
            st = _check_dir(top.path, here, fd, me, system, known)
            names: list[str] = []
            if who is None or rights.may(fd, who, rights.READ | rights.PASS, st):
                with contextlib.suppress(PermissionError), os.scandir(fd) as entries:
                    names = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
        except BaseException:
            os.close(fd)
            raise
        levels.append((here, fd, iter(names)))

    try:
        enter(top.path, os.dup(top.fd))
        while levels:
            here, fd, todo = levels[-1]
            name = next(todo, None)
            if name is None:
                os.close(levels.pop()[1])
                continue
            try:
                inner = os.open(name, beneath.DIR_FLAGS, dir_fd=fd)
            except OSError as exc:  # gone, a link or a file now (the person's doing), or not theirs to list
                if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EACCES):
                    continue
                raise
            enter(here / name, inner)
    except OSError as exc:
        many = exc.errno in (errno.EMFILE, errno.ENFILE)
        raise VmsandboxError(
            f"refusing to sandbox {top.path}: it could not be read through ({exc.strerror})",
            hint="flatten its deepest directories, or raise the limit of open files (`ulimit -n`)"
            if many
            else "try again once nothing else changes it",
        ) from None
    finally:
        for _here, fd, _todo in levels:
            os.close(fd)


def _check_dir(
    top: Path, here: Path, fd: int, me: int, system: dict[Identity, str], known: rights.Groups | None = None
) -> os.stat_result:
    """One directory of the project (`here`, open as fd): the person's, no system tree, and no other account may
    write in it. Its stat."""
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) in system and here != top:
        raise VmsandboxError(f"refusing to sandbox {top}: it holds the system's {system[(st.st_dev, st.st_ino)]} "
                             f"(at {here})", hint=HINT)  # fmt: skip
    if st.st_uid != me and not _roots_left_to_the_kernel(st.st_uid, me):
        _not_yours(top, here, st.st_uid, me)
    which = "it" if here == top else str(here)
    if st.st_mode & stat.S_IWOTH:
        shared = st.st_mode & stat.S_ISVTX and here == top  # (a place for everyone's files by design: /tmp)
        raise VmsandboxError(
            f"refusing to sandbox {top}: {which} is writable by every account (mode "
            f"{stat.S_IMODE(st.st_mode):04o}): what is in it is not only yours",
            hint=f"make a directory of your own in it (`mkdir -m 700 {here}/NAME`) and run there"
            if shared
            else f"{HINT}, or take the write away from others if it is yours (`chmod o-w {here}`)",
        )
    whom = rights.others(fd, me, st, known)
    if whom:
        raise VmsandboxError(
            f"refusing to sandbox {top}: {which} can be changed by {', '.join(whom)}: what is in it is not only yours",
            hint=f"take their write away if it is yours (`chmod g-w {here}`, or `chmod -R g-w {top}` for the whole "
            f"tree; an ACL entry: `setfacl -x u:NAME {here}`), or work in a copy of your own",
        )
    return st


def _roots_left_to_the_kernel(uid: int, me: int) -> bool:
    """A directory root owns in the tree of a person who runs vmsandbox as themselves (`sudo make install`'s
    `build/`, a container's output): the capture runs as the person, so the kernel lets it read there only what the
    person may read already. Under sudo or as root the capture could read root's own: refused, as any owner's."""
    return uid == 0 and os.geteuid() == me != 0


def _not_yours(top: Path, here: Path, uid: int, me: int) -> None:
    try:
        owner = f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        owner = f"uid {uid}"
    who = person()
    mine = who.pw_name if who is not None and who.pw_uid == me else str(me)
    which = "it is" if here == top else f"{here} is"
    raise VmsandboxError(
        f"refusing to sandbox {top}: {which} owned by {owner}, not by you ({mine}): a project holds only what is yours",
        hint=f"run vmsandbox as that account, or, if the directory is yours, take it over "
        f"(`sudo chown -R {mine} {here}`)",
    )


def _vmsandbox_own(resolved: Path) -> str | None:
    """How `resolved` holds or sits in vmsandbox's own state, config or data, if it does. The empty project an
    API sandbox of its own is made on (paths.sandbox_projects) is the one directory there a session may have."""
    if resolved.parent == paths.sandbox_projects().resolve():
        return None
    for own in (paths.state_dir(), paths.config_dir(), paths.data_dir()):
        mine = own.resolve()
        if resolved == mine or resolved in mine.parents:
            return f"holds vmsandbox's own {mine}"
        if mine in resolved.parents:
            return f"is inside vmsandbox's own {mine}"
    return None
