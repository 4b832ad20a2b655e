"""Each session's QEMU under an account of its own, on real VMs: two sessions' QEMUs run as two accounts of the
pool; a process of one's account opens nothing of the other's — not its disks, its fw_cfg files, its identity
socket, libvirt's monitor socket of its domain, the memory file its QEMU maps, its QEMU's memory, nor the keeper
of their template's memory — while it opens its own (the probe can tell); no shared image is given to any account,
and what the account left (System V IPC objects here) goes with the session, its keyrings emptied at its next
lease.
A fork runs as a third account and shares its source's saved memory by default: a write in one reaches neither the
other nor the sealed copy nor the template's. Each QEMU's cgroup is bounded to its guest's RAM and QEMU's
overhead (a bound that throttles, never kills), and every idle session woken at once stays within it: none
is killed. Its account is free again once
the session is removed."""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import Cli, VmFactory, guest_sh, unique_name
from tests.integration.test_shared_memory import digest, qemu_fd_of_ram
from vmsandbox import paths
from vmsandbox.confine import pool
from vmsandbox.session.end import lifecycle
from vmsandbox.session.moments import checkpoint, fork
from vmsandbox.session.place.local import owned
from vmsandbox.session.record import Record
from vmsandbox.vm.memory import bound, sealed, usage

pytestmark = pytest.mark.root("only root's sessions run under accounts of their own")
MiB = 1 << 20

PROBE = """
import json, os, socket, sys
said = {}
for what in sys.argv[1:]:
    kind, _, path = what.partition("=")
    try:
        if kind == "connect":
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(5)
            s.connect(path)
        elif kind == "signal":
            os.kill(int(path), 0)
        else:
            os.close(os.open(path, os.O_RDONLY))
        said[what] = "ok"
    except OSError as exc:
        said[what] = type(exc).__name__
print(json.dumps(said))
"""


def python_as(uid: int, code: str, *args: str) -> str:
    """What `code` (Python) prints, run as a process of account `uid` (no groups but its own)."""
    argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "/usr/bin/python3", "-c", code, *args]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    return r.stdout


def as_account(uid: int, *targets: str) -> dict[str, str]:
    """What a process of account `uid` (no groups but its own) may do to each target: `open=PATH`,
    `connect=SOCKET`, `signal=PID` — "ok" or the error."""
    found: dict[str, str] = json.loads(python_as(uid, PROBE, *targets))
    return found


MAKE_IPC = """
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
IPC_PRIVATE, IPC_CREAT = 0, 0o1000
made = {
    "shm": libc.shmget(IPC_PRIVATE, 1 << 20, IPC_CREAT | 0o600),
    "msg": libc.msgget(IPC_PRIVATE, IPC_CREAT | 0o666),
    "sem": libc.semget(IPC_PRIVATE, 1, IPC_CREAT | 0o600),
}
assert min(made.values()) >= 0, ctypes.get_errno()
print(json.dumps(made))
"""


def ipc_made_as(uid: int) -> dict[str, int]:
    """System V IPC objects made by a process of account `uid` (as a QEMU its guest took over could): a
    shared memory segment, a message queue every account may use, a semaphore set; their ids."""
    made: dict[str, int] = json.loads(python_as(uid, MAKE_IPC))
    return made


KEYS = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
ADD_KEY, KEYCTL, KEYCTL_SEARCH, USER_KEYRING = 248, 250, 10, -4  # x86_64
if sys.argv[1] == "add":
    made = libc.syscall(ADD_KEY, b"user", b"left-by-a-session", b"a message", 9, USER_KEYRING)
    assert made > 0, ctypes.get_errno()
found = libc.syscall(KEYCTL, KEYCTL_SEARCH, USER_KEYRING, b"user", b"left-by-a-session", 0)
print("found" if found > 0 else "none")
"""


def key_as(uid: int, what: str) -> str:
    """As a process of account `uid`: `add` a key to its user keyring, then (or with `look` only) whether one is
    there."""
    return python_as(uid, KEYS, what).strip()


def ipc_ids(table: str) -> set[int]:
    """The ids in /proc/sysvipc/TABLE (shm, msg, sem: the id is its second column)."""
    rows = Path(f"/proc/sysvipc/{table}").read_text().splitlines()[1:]
    return {int(row.split()[1]) for row in rows}


def qemu(record: Record) -> int:
    pid = usage.qemu_pid(record.domain)
    assert pid is not None, f"no QEMU runs for {record.domain}"
    return pid


def uid_of(pid: int) -> int:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("Uid:"))
    return int(line.split()[1])


def domain_dir(record: Record) -> Path:
    (found,) = Path("/var/lib/libvirt/qemu").glob(f"domain-*-{record.domain}")
    return found


def keeper_of(record: Record) -> tuple[int, int, Path]:
    """The pid, descriptor number and socket of the keeper of the session's template's memory (root's)."""
    for entry in paths.memory_holders_dir().glob("*.json"):
        said = json.loads(entry.read_text())
        if said.get("template") == record.template:
            return int(said["pid"]), int(said["fd"]), Path(said["socket"])
    raise AssertionError(f"no keeper holds the memory of {record.template}")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("accounts") / "accounts project"
    p.mkdir()
    (p / "README").write_text("accounts\n")
    return p


@pytest.fixture(scope="module")
def pair(module_vms: VmFactory, project: Path) -> tuple[Record, Record]:
    return module_vms.make(project), module_vms.make(project)


def test_two_sessions_run_as_two_accounts_and_neither_reaches_the_other(pair: tuple[Record, Record]) -> None:
    one, two = pair
    made = pool.load()
    assert made is not None, "no pool of session accounts here: `vmsandbox host setup` makes it"
    assert one.account in made.ids() and two.account in made.ids() and one.account != two.account
    assert (uid_of(qemu(one)), uid_of(qemu(two))) == (one.account, two.account)
    assert one.memory is not None and one.memory == two.memory, (one.memory_note, two.memory_note)

    def things(r: Record) -> list[str]:
        files, pid = r.files, qemu(r)
        return [
            f"open={r.system_disk}",
            f"open={files.workspace_disk}",
            f"open={files.fwcfg_dir / 'authorized_keys'}",
            f"connect={files.identity_socket}",
            f"connect={domain_dir(r) / 'monitor.sock'}",
            f"open={qemu_fd_of_ram(pid)}",
            f"signal={pid}",
        ]

    assert one.account is not None
    mine, theirs = as_account(one.account, *things(one)), as_account(one.account, *things(two))
    # the probe opens what is its own (it can tell), but libvirt's monitor socket: libvirt's own, made by root
    assert [k for k, v in mine.items() if v != "ok"] == [f"connect={domain_dir(one) / 'monitor.sock'}"], mine
    assert "ok" not in theirs.values(), theirs
    keeper, number, socket = keeper_of(one)
    kept = as_account(one.account, f"open=/proc/{keeper}/fd/{number}", f"connect={socket}", f"signal={keeper}")
    assert "ok" not in kept.values(), kept
    assert uid_of(keeper) == 0
    ids = set(made.ids())
    assert one.template is not None
    shared = [Path(one.template) / "disk.qcow2", *Path(one.template).parent.parent.glob("*")]
    given = [f for f in shared if f.is_file() and f.stat().st_uid in ids]
    assert given == [], f"shared images given to a session's account: {given}"


def test_a_fork_runs_as_its_own_account_and_shares_its_source_memory(
    module_vms: VmFactory, pair: tuple[Record, Record], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(checkpoint.LIVE_SWITCH, "0")  # the source restored on the fork's copy (live: its own memory)
    source = Record.load(pair[0].name)
    guest_sh(source, "echo before > /dev/shm/mark", root=True)
    new = unique_name()
    module_vms.made.append(new)
    made = fork.fork(source.name, new)
    forked, source = Record.load(made.name), Record.load(source.name)
    assert forked.account not in (None, source.account, pair[1].account)
    assert uid_of(qemu(forked)) == forked.account
    assert forked.memory is not None and forked.memory == source.memory, (forked.memory_note, source.memory_note)
    copy = qemu_fd_of_ram(qemu(forked))
    assert copy.stat().st_ino == qemu_fd_of_ram(qemu(source)).stat().st_ino  # one sealed copy, mapped by both
    before = digest(copy)
    keeper, number, _socket = keeper_of(source)
    template_before = digest(f"/proc/{keeper}/fd/{number}")
    guest_sh(forked, "echo fork > /dev/shm/mark; head -c 32M /dev/zero > /dev/shm/fill", root=True)
    guest_sh(source, "echo source > /dev/shm/only-source", root=True)
    assert guest_sh(source, "cat /dev/shm/mark", root=True).strip() == "before"
    assert guest_sh(forked, "ls /dev/shm", root=True).split() == ["fill", "mark"]
    assert digest(copy) == before and digest(f"/proc/{keeper}/fd/{number}") == template_before
    other = Record.load(pair[1].name)  # another session of the template sees none of it
    assert "mark" not in guest_sh(other, "ls /dev/shm", root=True).split()
    seen = as_account(forked.account or 0, f"open={qemu_fd_of_ram(qemu(other))}", f"open={source.system_disk}")
    assert "ok" not in seen.values(), seen
    account = forked.account
    assert account is not None
    left = ipc_made_as(account)
    assert all(left[table] in ipc_ids(table) for table in left)
    assert key_as(account, "add") == "found"  # (the kernel keeps it past the account's last process)
    owned.forget_keys(account)  # what the account's next lease does
    assert key_as(account, "look") == "none"
    lifecycle.remove(forked)
    assert account not in pool.leased()  # free again for another session
    assert not any(left[table] in ipc_ids(table) for table in left), "its account's IPC objects outlived it"


def test_every_idle_session_woken_at_once_stays_within_its_bound(module_vms: VmFactory, project: Path) -> None:
    sessions = [Record.load(n) for n in module_vms.made if paths.session_paths(n).root.exists()]
    sessions += [module_vms.make(project) for _ in range(max(0, 4 - len(sessions)))]
    pids = {}
    for r in sessions:
        pid = qemu(r)
        pids[r.name] = pid
        limit = bound.limit_of(pid)
        assert r.memory_limit_mib == bound.limit_mib(r.memory_mib), r.memory_limit_note
        assert limit == bound.limit_mib(r.memory_mib) * MiB

    def wake(r: Record) -> str:  # each writes 256 MiB of its memory it never wrote, at the same moment
        return guest_sh(r, "python3 -c 'b = bytearray(256 << 20); b[::4096] = b\"x\" * len(b[::4096])'; echo ok")

    with concurrent.futures.ThreadPoolExecutor(len(sessions)) as woken:
        said = list(woken.map(wake, sessions))
    assert [s.strip() for s in said] == ["ok"] * len(sessions)
    for r in sessions:
        assert qemu(r) == pids[r.name]  # the same QEMU: none was killed
        found = bound.cgroup_of(pids[r.name])
        assert found is not None
        control = found[0] / "memory.oom_control"
        if control.exists():  # cgroup v1
            lines = dict(line.split() for line in control.read_text().splitlines())
            assert lines.get("oom_kill", "0") == "0" and lines["under_oom"] == "0", lines
        else:
            events = dict(line.split() for line in (found[0] / "memory.events").read_text().splitlines())
            assert events["oom_kill"] == "0", events


def test_the_template_keeper_outlives_the_command_that_started_it(cli: Cli, project: Path, tmp_path: Path) -> None:
    """A `vmsandbox create` starts the keeper of its template's memory (a runtime directory of this test's own: a
    keeper of its own) and ends; the next command's session maps the file that same keeper holds."""
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    env = cli.env(VMSANDBOX_RUNTIME_DIR=str(runtime))
    names = [unique_name(), unique_name()]
    keepers = []
    try:
        for name in names:
            made = cli.run("create", "--name", name, str(project), env=env)
            assert made.returncode == 0, made.stderr.decode()
            (entry,) = (runtime / "memory").glob("*.json")
            keepers.append(json.loads(entry.read_text())["pid"])
            assert Path(f"/proc/{keepers[-1]}").exists(), "the keeper ended with the command that started it"
        assert keepers[0] == keepers[1]
        first, second = (Record.load(n) for n in names)
        assert qemu_fd_of_ram(qemu(first)).stat().st_ino == qemu_fd_of_ram(qemu(second)).stat().st_ino
    finally:
        for name in names:
            cli.run("rm", "-f", name, env=env)
        for entry in (runtime / "memory").glob("*.json"):
            sealed.Held.of(json.loads(entry.read_text())).stop(wait=10)


def test_a_forged_backing_file_in_its_overlay_gives_the_session_nothing_of_roots(
    module_vms: VmFactory, project: Path, cli: Cli
) -> None:
    """Its QEMU rewrites its own overlay's header (here root does it for it, while it is stopped) to name a file of
    root's in its directory as its backing file — libvirt, probing that chain at the next start, would give that
    file to the session's account: the host names the chain from what it recorded, the file stays root's, and the
    session starts and works as before."""
    record = module_vms.make(project)
    files = record.files
    assert record.account is not None and files.fwcfg_dir.stat().st_uid == 0  # its fw_cfg directory stays root's
    planted = as_account(record.account, f"open={files.fwcfg_dir / 'authorized_keys'}")
    assert set(planted.values()) == {"ok"}, planted  # (read, through its ACL entry)
    stopped = cli.run("stop", record.name)
    assert stopped.returncode == 0, stopped.stderr.decode()
    ssh_config = str(files.ssh_config)
    subprocess.run(["qemu-img", "rebase", "-u", "-F", "raw", "-b", ssh_config, str(record.system_disk)], check=True)
    started = cli.run("start", record.name)
    assert started.returncode == 0, started.stderr.decode()
    assert files.ssh_config.stat().st_uid == 0
    assert guest_sh(Record.load(record.name), "cat README") == "accounts\n"
