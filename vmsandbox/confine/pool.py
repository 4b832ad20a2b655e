"""An account of its own for each session's QEMU, as Firecracker's jailer gives each microVM a uid: a pool of ids
that `host setup` reserves, one leased to each session while it exists, and given to its QEMU by libvirt's
static DAC label (`+UID:+GID`, vm.domain). A session's disks, sockets, memory relay and QEMU are that account's;
a QEMU a guest took over reaches nothing of another session's: not its files (0600, another owner; its
directory passable by its own account alone), not its processes (the kernel lets one trace, or open the
descriptors of, only a process of the same uid and gid), not its monitor (libvirt's per-domain directory is
the account's, group its own too).

The ids are numbers with no name (as the jailer's): `host setup` picks a range no account or group of this
machine uses and writes it down (pool.json); every uid is its own gid. A lease is a file named by the uid,
made with O_EXCL, that names the session directory holding it and the process that took it. It is free again
once that directory is gone, or its record names another account, and the process that took it has ended
(so a session being made is never robbed between the lease and its record's first save).

Only root's sessions on this machine get one (another account cannot have libvirt run QEMU as an id it does
not own; another host has its own accounts): the others run as libvirt's QEMU account, as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import grp
import json
import os
import pwd
import shutil
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from vmsandbox import filewrite, paths, pids
from vmsandbox.confine import access
from vmsandbox.errors import VmsandboxError

ROOT = Path("/var/lib/vmsandbox/accounts")  # host-wide, like the ids themselves: never moved by an environment
POOL_FILE = "pool.json"
LEASES = "leases"
FIRST = 1_900_000_000  # the first id `host setup` tries: far above every distribution's and container ranges
COUNT = 256  # ids in the pool: the most sessions that run under an account of their own at once
LIBVIRT_STATE = Path("/var/lib/libvirt/qemu")  # libvirt's per-domain directories are made in it
SEARCH_STEP = 1 << 20  # where FIRST's range is taken in part, the next candidate range


@dataclass(frozen=True)
class Pool:
    first: int
    count: int

    def ids(self) -> range:
        return range(self.first, self.first + self.count)


def load(root: Path | None = None) -> Pool | None:
    """The pool `host setup` made here, or None (none made, or not root's: then no session gets an account)."""
    root = root or ROOT
    path = root / POOL_FILE
    try:
        st = path.stat()
        data = json.loads(path.read_text())
        pool = Pool(int(data["first"]), int(data["count"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if st.st_uid != 0 or st.st_mode & 0o022 or pool.first <= 0 or not 0 < pool.count <= 65536:
        return None  # written by someone else than root: root trusts nothing there
    return pool


def taken_ids() -> set[int]:
    """The uids and gids this machine's accounts and groups use (the name service's whole lists)."""
    return {p.pw_uid for p in pwd.getpwall()} | {g.gr_gid for g in grp.getgrall()}


def free_range(count: int, taken: set[int], first: int = FIRST) -> int:
    """The first id of `count` consecutive ones, from `first` on, that no account or group uses."""
    start = first
    while start + count < 2**31:
        if not any(i in taken for i in range(start, start + count)):
            return start
        start += SEARCH_STEP
    raise VmsandboxError("no range of unused ids for the session accounts", hint="free ids above 1,900,000,000")


def make(root: Path | None = None, count: int = COUNT) -> tuple[Pool, bool]:
    """The pool (made now if none is: `host setup`), and whether it was made now. An existing pool whose ids an
    account or group took since is an error: two owners of one id would reach each other's files."""
    root = root or ROOT
    pool = load(root)
    if pool is not None:
        clash = sorted(i for i in taken_ids() if i in pool.ids())
        if clash:
            raise VmsandboxError(
                f"ids {clash[0]}… of the session accounts' pool ({pool.first}-{pool.first + pool.count - 1}) are "
                "used by an account or group of this machine",
                hint=f"remove that account, or the pool ({root / POOL_FILE}) with no session running, and run "
                "`sudo vmsandbox host setup` again",
            )
        return pool, False
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    (root / LEASES).mkdir(mode=0o700, exist_ok=True)
    pool = Pool(free_range(count, taken_ids()), count)
    filewrite.write_atomically(
        root / POOL_FILE, json.dumps({"first": pool.first, "count": pool.count}) + "\n", mode=0o644
    )
    return pool, True


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[Path]:
    leases = root / LEASES
    leases.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(leases, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield leases
    finally:
        os.close(fd)


def lease(session_dir: Path, root: Path | None = None) -> int | None:
    """An id of the pool for the session in `session_dir` (its uid and gid), held until that session is gone;
    None where there is no pool (the session's QEMU runs as libvirt's account). Raises when every id is leased."""
    root = root or ROOT
    pool = load(root)
    if pool is None or os.geteuid() != 0:
        return None
    me = {"session": str(session_dir), "pid": os.getpid(), "start": pids.process_start(os.getpid()) or ""}
    with _locked(root) as leases:
        for uid in pool.ids():
            path = leases / str(uid)
            if path.exists() and not _stale(path, uid):
                continue
            if _runs_as(uid):
                continue  # a process of a session gone without its lease still runs as it: never shared
            if path.exists():  # the lease of a session gone without releasing it (a crash): what it left goes
                clear(uid)
            path.unlink(missing_ok=True)
            let_pass(uid)
            filewrite.write_atomically(path, json.dumps(me) + "\n", mode=0o600)
            return uid
    raise VmsandboxError(
        f"all {pool.count} session accounts are in use: {pool.count} sessions exist on this machine",
        hint="remove sessions you no longer need (`vmsandbox ls`, `vmsandbox rm NAME`), or `vmsandbox gc`",
    )


def let_pass(uid: int, where: Path | None = None) -> None:
    """libvirt makes each domain's directory (its master key, monitor socket) in its state directory, its QEMU
    account's and 0750: a QEMU of another account must pass through it (an ACL entry: traverse, never list) to
    reach its own domain's directory, which libvirt gives its account alone."""
    where = where or LIBVIRT_STATE
    if not where.is_dir() or access.may(where, uid, {uid}, 1):
        return
    try:
        access.grant(where, uid, 1)
    except OSError as exc:
        raise VmsandboxError(
            f"could not let session account {uid} pass through {where}: {exc.strerror or exc}",
            hint=f"{where} must be on a file system with POSIX ACLs, or `chmod o+x {where}`",
        ) from exc


def release(uid: int, session_dir: Path, root: Path | None = None) -> None:
    """The session in `session_dir` is gone: what its account left on the host goes (clear), and its id may serve
    another (only if the lease is still its own)."""
    root = root or ROOT
    with contextlib.suppress(OSError), _locked(root) as leases:
        path = leases / str(uid)
        if _holder(path).get("session") == str(session_dir):
            clear(uid)
            path.unlink()


# where every account may write (swept by walking them, never by a name in them): these, and any other directory
# every account may write in found up to SCAN_DEPTH levels below / (shared_places: /run/lock, a distribution's own)
SHARED_PLACES = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"), Path("/dev/mqueue"))  # noqa: S108
SCAN_DEPTH = 2
NOT_SCANNED = ("proc", "sys")  # below /: the kernel's views, no account writes a name there
CLEAR_WAIT = 5.0
SYSV_IPC = Path("/proc/sysvipc")
IPC_RMID = 0
# System V IPC objects: each table of them (/proc/sysvipc), its id column, and the libc call that removes one
IPC_TABLES = (("shm", "shmid", "shmctl"), ("msg", "msqid", "msgctl"), ("sem", "semid", "semctl"))


def clear(
    uid: int, places: tuple[Path, ...] | None = None, proc_root: Path = Path("/proc"), ipc_root: Path = SYSV_IPC
) -> None:
    """Before an id serves another session: no process runs as it any more (a QEMU's child that outlived its
    domain is killed), and nothing of it is left where every account may write — a setuid copy of a program,
    left in /tmp by a QEMU its guest took over, would make whoever runs it the next session's QEMU account — nor
    among the System V IPC objects, which outlive their makers: a shared memory segment holds host memory that
    no process and no session's bound accounts for, one session after another, and the next session's QEMU
    would read what it holds."""
    deadline = time.monotonic() + CLEAR_WAIT
    while (left := _processes_of(uid, proc_root)) and time.monotonic() < deadline:
        for pid in left:
            with contextlib.suppress(OSError):
                pidfd = os.pidfd_open(pid)
                try:
                    if uid in _uids_of(pid, proc_root):  # (checked with the pidfd open: that very process)
                        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                finally:
                    os.close(pidfd)
        time.sleep(0.05)
    for place in shared_places() if places is None else places:
        with contextlib.suppress(OSError):
            _remove_owned(place, uid)
    if left_ipc := ipc_of(uid, ipc_root):
        libc = ctypes.CDLL(None, use_errno=True)
        for call, ipc_id in left_ipc:  # (one gone meanwhile: -1, EINVAL or EIDRM, and the others go)
            if call == "semctl":
                libc.semctl(ipc_id, 0, IPC_RMID)
            else:
                getattr(libc, call)(ipc_id, IPC_RMID, None)


def shared_places(root: Path = Path("/")) -> list[Path]:
    """SHARED_PLACES (those of them that are under `root`), and every other directory (not a link) that every
    account may write in, SCAN_DEPTH levels below `root` at most: a few hundred directories looked at (1.5 ms
    here). One deeper below a directory it may not write in (a /var/lib/php/sessions) is swept only if named."""
    found = [p for p in SHARED_PLACES if root == Path("/") or p.is_relative_to(root)]
    level = [root]
    for depth in range(SCAN_DEPTH):
        below = []
        for directory in level:
            with contextlib.suppress(OSError), os.scandir(directory) as entries:
                for e in entries:
                    if (depth == 0 and e.name in NOT_SCANNED) or not e.is_dir(follow_symlinks=False):
                        continue
                    below.append(Path(e.path))
                    if e.stat(follow_symlinks=False).st_mode & 0o002 and Path(e.path) not in found:
                        found.append(Path(e.path))
        level = below
    return found


def ipc_of(uid: int, ipc_root: Path = SYSV_IPC) -> list[tuple[str, int]]:
    """Each System V IPC object (shared memory segment, message queue, semaphore set) that `uid` owns or made (a
    maker may hand an object to another owner: either way it is the account's doing): the libc call that removes
    it, and its id."""
    found: list[tuple[str, int]] = []
    for table, id_column, call in IPC_TABLES:
        try:
            head, *rows = (ipc_root / table).read_text().splitlines()
            at = [head.split().index(column) for column in (id_column, "uid", "cuid")]
        except (OSError, ValueError):  # no such table (a kernel without it), or one laid out otherwise
            continue
        for row in map(str.split, rows):
            with contextlib.suppress(IndexError, ValueError):
                if uid in (int(row[at[1]]), int(row[at[2]])):
                    found.append((call, int(row[at[0]])))
    return found


def _remove_owned(place: Path, uid: int) -> None:
    """Remove what `uid` owns under `place`, walked by descriptors (no link followed) into the directories it could
    have written in: its own (removed whole) and those every account may write (a sticky /tmp); any other it could
    not have added a name to, and is never walked (a tree of root's there, however big, costs nothing)."""
    for _dirpath, dirnames, filenames, dir_fd in os.fwalk(place, follow_symlinks=False):
        for name in list(dirnames):
            with contextlib.suppress(OSError):
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if st.st_uid == uid:
                    shutil.rmtree(name, dir_fd=dir_fd)
                if st.st_uid == uid or not st.st_mode & 0o002:
                    dirnames.remove(name)
        for name in filenames:
            with contextlib.suppress(OSError):
                if os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_uid == uid:
                    os.unlink(name, dir_fd=dir_fd)


def holds(uid: int, session_dir: Path, root: Path | None = None) -> bool:
    """Whether `uid` is an id of the pool leased to the session in `session_dir`."""
    root = root or ROOT
    made = load(root)
    held = _holder(root / LEASES / str(uid)) if made is not None and uid in made.ids() else {}
    return held.get("session") == str(session_dir)


def leased(root: Path | None = None) -> dict[int, str]:
    """Each leased id and the session directory holding it."""
    root = root or ROOT
    found: dict[int, str] = {}
    with contextlib.suppress(OSError):
        for path in (root / LEASES).iterdir():
            if path.name.isdigit():
                found[int(path.name)] = str(_holder(path).get("session", ""))
    return found


def _holder(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _stale(path: Path, uid: int) -> bool:
    """Whether a lease's session is gone: its directory gone, or its record naming another account — and the
    process that took the lease ended (it may not have saved the record yet)."""
    held = _holder(path)
    pid, start = held.get("pid"), held.get("start")
    if isinstance(pid, int) and isinstance(start, str) and pids.alive(pid, start):
        return False
    session = held.get("session")
    if not isinstance(session, str) or not session:
        return True
    try:
        record = json.loads((Path(session) / paths.SESSION_RECORD).read_text())
    except FileNotFoundError:
        return True
    except (OSError, ValueError):
        return False  # there, unreadable now: kept (a lease is never taken from a session that may exist)
    return not isinstance(record, dict) or record.get("account") != uid


def _runs_as(uid: int, proc_root: Path = Path("/proc")) -> bool:
    """Whether any process runs as `uid` (real, effective or saved)."""
    return bool(_processes_of(uid, proc_root))


def _processes_of(uid: int, proc_root: Path = Path("/proc")) -> list[int]:
    """The processes whose real, effective or saved uid is `uid`."""
    return [int(e.name) for e in proc_root.iterdir() if e.name.isdigit() and uid in _uids_of(int(e.name), proc_root)]


def _uids_of(pid: int, proc_root: Path = Path("/proc")) -> set[int]:
    """A process's real, effective and saved uids (none: it is gone)."""
    with contextlib.suppress(OSError, ValueError):
        for line in (proc_root / str(pid) / "status").read_text().splitlines():
            if line.startswith("Uid:"):
                return {int(x) for x in line.split()[1:4]}
    return set()
