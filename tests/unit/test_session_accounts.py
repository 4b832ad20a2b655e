"""An account of its own for each session's QEMU (confine.pool), its domain XML (vm.domain) and its memory bound
(vm.memory.bound), without a VM: a pool in a temporary directory, fake /proc and cgroup trees."""

from __future__ import annotations

import json
import os
import unittest.mock
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from vmsandbox.confine import pool
from vmsandbox.errors import VmsandboxError
from vmsandbox.vm import domain
from vmsandbox.vm.accel import Accel
from vmsandbox.vm.memory import bound

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="only root leases session accounts")


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(pool, "taken_ids", lambda: {0, 1000, pool.FIRST + 3})
    monkeypatch.setattr(pool, "LIBVIRT_STATE", tmp_path / "no-libvirt")  # (never the host's)
    monkeypatch.setattr(pool, "_runs_as", lambda uid: False)
    monkeypatch.setattr(pool, "clear", CLEARED.append)
    CLEARED.clear()
    return tmp_path / "accounts"


CLEARED: list[int] = []


def test_the_pool_skips_ranges_an_account_uses_and_refuses_one_taken_since(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made, new = pool.make(root, count=8)
    assert new and made.first == pool.FIRST + pool.SEARCH_STEP  # FIRST+3 is a group's: the next range
    assert pool.make(root, count=8) == (made, False)
    assert pool.load(root) == made
    monkeypatch.setattr(pool, "taken_ids", lambda: {made.first + 5})
    with pytest.raises(VmsandboxError, match="used by an account or group"):
        pool.make(root, count=8)


def test_a_pool_file_others_may_write_is_not_trusted(root: Path) -> None:
    made, _ = pool.make(root, count=4)
    (root / pool.POOL_FILE).chmod(0o666)
    assert pool.load(root) is None
    (root / pool.POOL_FILE).chmod(0o644)
    assert pool.load(root) == made
    (root / pool.POOL_FILE).write_text(json.dumps({"first": made.first, "count": 10**6}))
    assert pool.load(root) is None


@needs_root
def test_each_session_leases_its_own_id_until_it_is_gone(root: Path, tmp_path: Path) -> None:
    made, _ = pool.make(root, count=3)
    dirs = [tmp_path / f"s{i}" for i in range(4)]
    for d in dirs:
        d.mkdir()
    ids = [pool.lease(d, root) for d in dirs[:3]]
    assert sorted(i for i in ids if i is not None) == list(made.ids())
    with pytest.raises(VmsandboxError, match="all 3 session accounts are in use"):
        pool.lease(dirs[3], root)  # (held by this process, which runs: none is stale)
    assert pool.leased(root) == {uid: str(d) for uid, d in zip(ids, dirs, strict=False) if uid is not None}
    pool.release(ids[0] or 0, dirs[1], root)  # another session's directory: not released
    assert ids[0] in pool.leased(root)
    assert CLEARED == []
    pool.release(ids[0] or 0, dirs[0], root)
    assert ids[0] not in pool.leased(root) and [ids[0]] == CLEARED  # what it left goes with its lease
    assert pool.lease(dirs[3], root) == ids[0]


def _lease_of_ended_process(root: Path, uid: int, session: Path) -> None:
    """A lease whose taker ended: this pid with another start time (a pid reused since is not that process)."""
    (root / pool.LEASES).mkdir(parents=True, exist_ok=True)
    said = {"session": str(session), "pid": os.getpid(), "start": "0"}
    (root / pool.LEASES / str(uid)).write_text(json.dumps(said))


@needs_root
def test_the_next_lease_takes_back_one_whose_session_is_gone_or_names_another_account(
    root: Path, tmp_path: Path
) -> None:
    made, _ = pool.make(root, count=3)
    a, b, c = made.ids()
    gone, mine, other = tmp_path / "gone", tmp_path / "mine", tmp_path / "other"
    for d, named in ((mine, b), (other, c + 1)):
        d.mkdir()
        (d / "session.json").write_text(json.dumps({"account": named}))
    _lease_of_ended_process(root, a, gone)
    _lease_of_ended_process(root, b, mine)
    _lease_of_ended_process(root, c, other)
    first, second = tmp_path / "first", tmp_path / "second"
    assert pool.lease(first, root) == a and pool.lease(second, root) == c  # (mine's record names b: kept)
    assert [a, c] == CLEARED  # what each left went with its lease
    assert pool.leased(root) == {a: str(first), b: str(mine), c: str(second)}


@needs_root
def test_a_lease_taken_by_a_process_that_still_runs_is_never_taken_back(root: Path, tmp_path: Path) -> None:
    made, _ = pool.make(root, count=1)
    (root / pool.LEASES).mkdir(parents=True, exist_ok=True)
    from vmsandbox import pids

    said = {"session": str(tmp_path / "not-yet-saved"), "pid": os.getpid(), "start": pids.process_start(os.getpid())}
    (root / pool.LEASES / str(made.first)).write_text(json.dumps(said))
    with pytest.raises(VmsandboxError, match="all 1 session accounts are in use"):
        pool.lease(tmp_path / "another", root)


def _spec(tmp_path: Path, **more: object) -> domain.DomainSpec:
    return domain.DomainSpec(
        name="vmsandbox-s",
        session="s",
        session_dir=tmp_path,
        accel=Accel.TCG,
        cpus=1,
        memory_mib=512,
        disk=tmp_path / "overlay.qcow2",
        kernel=tmp_path / "vmlinuz",
        initrd=tmp_path / "initrd.img",
        cmdline="console=ttyS0",
        console_log=tmp_path / "console.log",
        forwards=(),
        **more,  # type: ignore[arg-type]
    )


def test_a_session_of_its_own_account_names_it_and_never_lets_libvirt_label_a_shared_image(tmp_path: Path) -> None:
    chain = ((tmp_path / "overlay-1.qcow2", "qcow2", True), (Path("/images/t/disk.qcow2"), "qcow2", False))
    root = ET.fromstring(domain.build_xml(_spec(tmp_path, account=1900000007, chain=chain)))  # noqa: S314
    (label,) = root.findall("seclabel")
    assert label.attrib == {"type": "static", "model": "dac", "relabel": "yes"}
    assert label.findtext("label") == "+1900000007:+1900000007"
    below = root.find("devices/disk/backingStore")
    assert below is not None and below.find("source/seclabel") is None  # its own overlay: labelled for it
    shared = below.find("backingStore")
    assert shared is not None and shared.find("source").get("file") == "/images/t/disk.qcow2"  # type: ignore[union-attr]
    assert shared.find("source/seclabel").attrib == {"model": "dac", "relabel": "no"}  # type: ignore[union-attr]
    assert shared.find("backingStore") is not None and len(shared.find("backingStore")) == 0  # type: ignore[arg-type]
    plain = ET.fromstring(domain.build_xml(_spec(tmp_path)))  # noqa: S314
    assert plain.findall("seclabel") == [] and plain.find("devices/disk/backingStore") is None


def test_a_restore_takes_the_sessions_label_kernel_and_chain_never_the_saved_ones(tmp_path: Path) -> None:
    template = _spec(tmp_path / "template", account=None)
    saved = ET.fromstring(domain.build_xml(template))  # noqa: S314
    old = ET.SubElement(saved, "seclabel", {"type": "dynamic", "model": "dac", "relabel": "yes"})
    ET.SubElement(old, "label").text = "+64055:+64055"
    chain = ((Path("/images/t/disk.qcow2"), "qcow2", False),)
    mine = _spec(tmp_path, account=1900000001, chain=chain)
    root = ET.fromstring(domain.for_restore(ET.tostring(saved, encoding="unicode"), mine))  # noqa: S314
    assert [x.findtext("label") for x in root.findall("seclabel")] == ["+1900000001:+1900000001"]
    assert root.findtext("os/kernel") == str(tmp_path / "vmlinuz")
    assert root.find("devices/disk/backingStore/source/seclabel") is not None
    again = domain.with_disks(ET.tostring(root, encoding="unicode"), tmp_path / "overlay-2.qcow2", 2222, chain)
    disk = ET.fromstring(again).find("devices/disk")  # noqa: S314
    assert disk is not None and len(disk.findall("backingStore")) == 1


def _cgroups(tmp_path: Path, line: str, *, v2: bool = False) -> tuple[Path, Path]:
    proc, cg = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "42").mkdir(parents=True)
    (proc / "42" / "cgroup").write_text(f"{line}\n")
    where = cg / ("" if v2 else "memory") / "machine" / "qemu-1-vmsandbox-s.libvirt-qemu"
    where.mkdir(parents=True)
    (where / ("memory.high" if v2 else "memory.soft_limit_in_bytes")).write_text("max\n" if v2 else f"{1 << 63}\n")
    return proc, cg


@pytest.mark.parametrize("v2", [False, True])
def test_a_qemu_is_bounded_to_its_ram_and_overhead(tmp_path: Path, v2: bool) -> None:
    line = "0::/machine/qemu-1-vmsandbox-s.libvirt-qemu" if v2 else "5:memory:/machine/qemu-1-vmsandbox-s.libvirt-qemu"
    proc, cg = _cgroups(tmp_path, line, v2=v2)
    assert bound.limit_of(42, proc, cg) is None
    assert bound.limit(42, 2048, proc, cg) is None
    assert bound.limit_of(42, proc, cg) == (2048 + bound.QEMU_OVERHEAD_MIB) << 20


def test_a_qemu_in_no_cgroup_of_its_own_is_left_unbounded_and_said(tmp_path: Path) -> None:
    proc, cg = _cgroups(tmp_path, "5:memory:/")
    assert "no cgroup of its own" in (bound.limit(42, 2048, proc, cg) or "")
    assert "no memory cgroup" in (bound.limit(43, 2048, proc, cg) or "")


def test_what_an_account_left_where_everyone_writes_goes_and_nothing_else(tmp_path: Path) -> None:
    """A setuid copy of a shell the QEMU left in /tmp would make whoever runs it the next session's account."""
    place = tmp_path / "tmp"
    (place / "theirs" / "deep").mkdir(parents=True)
    (place / "roots").mkdir()  # a directory it could not write in: never walked
    (place / "roots" / "planted").write_text("x")
    (place / "open").mkdir(mode=0o777)
    (place / "open").chmod(0o1777)  # one every account may write in: walked
    (place / "open" / "planted").write_text("x")
    (place / "planted").write_text("x")
    (place / "theirs" / "deep" / "sh").write_text("x")
    (place / "someone-elses").write_text("x")
    (place / "link").symlink_to(tmp_path / "outside")
    (tmp_path / "outside").write_text("x")
    (tmp_path / "no-proc").mkdir()
    me = os.getuid()
    owned = {place / "planted", place / "theirs", place / "theirs" / "deep", place / "theirs" / "deep" / "sh"}
    (place / "roots").chmod(0o755)
    real_stat = os.stat

    def as_if(name: object, *args: object, **kw: object) -> os.stat_result:  # what the account owns, by name
        st = real_stat(name, *args, **kw)  # type: ignore[arg-type]
        fake = list(st)
        fake[4] = 4242 if str(name) in {p.name for p in owned} or str(name) == "planted" else me
        return os.stat_result(fake)

    with unittest.mock.patch("os.stat", as_if):
        pool.clear(4242, places=(place,), proc_root=tmp_path / "no-proc")
    assert sorted(p.name for p in place.iterdir()) == ["link", "open", "roots", "someone-elses"]
    assert list((place / "open").iterdir()) == [] and (place / "roots" / "planted").exists()
    assert (tmp_path / "outside").exists()


SHM_HEAD = "       key      shmid perms                  size  cpid  lpid nattch   uid   gid  cuid  cgid      atime"
MSG_HEAD = "       key      msqid perms      cbytes       qnum lspid lrpid   uid   gid  cuid  cgid      stime"


def test_the_system_v_ipc_objects_an_account_made_or_owns_go_with_its_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """They outlive their makers: a shared memory segment would hold host memory after its session, and hand
    what it holds to the next session's QEMU of the same id."""
    (tmp_path / "shm").write_text(
        f"{SHM_HEAD}\n"
        "         0         7   600     1048576  100  100      0  4242  4242  4242  4242          0\n"  # its own
        "         0         8   666     1048576  100  100      0  1000  1000  4242  4242          0\n"  # made, given
        "         0         9   600     1048576  100  100      0  4242  4242     0     0          0\n"  # given to it
        "         0        10   600     1048576  100  100      0  1000  1000  1000  1000          0\n"  # another's
    )
    msg_row = "         0        32768   666   0   0   0   0  4242  4242  4242  4242  0"
    (tmp_path / "msg").write_text(f"{MSG_HEAD}\n{msg_row}\n")
    sem_head = "       key      semid perms      nsems   uid   gid  cuid  cgid      otime      ctime"
    (tmp_path / "sem").write_text(
        f"{sem_head}\n         0        65536   600          1  4242  4242  4242  4242  0  0\n"
    )
    ours = [("shmctl", 7), ("shmctl", 8), ("shmctl", 9), ("msgctl", 32768), ("semctl", 65536)]
    assert pool.ipc_of(4242, tmp_path) == ours
    assert pool.ipc_of(1000, tmp_path) == [("shmctl", 8), ("shmctl", 10)]
    assert pool.ipc_of(4242, tmp_path / "none") == []
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "shm").write_text("a table laid out otherwise\n 1 2 3\n")  # (not read)
    assert pool.ipc_of(4242, tmp_path / "odd") == []

    removed: list[tuple[str, int, int]] = []

    class Libc:  # what pool.clear asks of the C library
        def __getattr__(self, call: str) -> Callable[..., int]:
            def removes(ipc_id: int, *args: object) -> int:
                command = (
                    args[1] if call == "semctl" else args[0]
                )  # (semctl(id, semnum, cmd); the others (id, cmd, buf))
                assert isinstance(command, int)
                removed.append((call, ipc_id, command))
                return 0

            return removes

    monkeypatch.setattr("vmsandbox.confine.pool.ctypes.CDLL", lambda *_a, **_kw: Libc())
    (tmp_path / "no-proc").mkdir()
    pool.clear(4242, places=(), proc_root=tmp_path / "no-proc", ipc_root=tmp_path)
    assert removed == [(call, ipc_id, 0) for call, ipc_id in ours]  # 0: IPC_RMID


def test_the_places_every_account_may_write_are_found_not_named(tmp_path: Path) -> None:
    """/tmp and its kin are named; any other directory every account may write in is found, two levels below /
    (a distribution's /run/lock, a /var/crash), so what a QEMU left there goes too."""
    made = {"crash": 0o1777, "run": 0o755, "run/lock": 0o1777, "run/user": 0o755, "srv": 0o777, "proc": 0o755}
    made |= {"proc/1": 0o777, "var": 0o755, "var/lib": 0o755, "var/lib/deep": 0o777, "aside": 0o1777}
    for name, mode in made.items():
        (tmp_path / name).mkdir()
        (tmp_path / name).chmod(mode)
    (tmp_path / "run" / "link").symlink_to(tmp_path / "aside")
    found = pool.shared_places(tmp_path)
    assert sorted(str(p.relative_to(tmp_path)) for p in found) == ["aside", "crash", "run/lock", "srv"]
    assert pool.shared_places()[: len(pool.SHARED_PLACES)] == list(pool.SHARED_PLACES)  # (the named ones first)


@needs_root
def test_a_session_holds_only_the_id_leased_to_it(root: Path, tmp_path: Path) -> None:
    made, _ = pool.make(root, count=2)
    mine, other = tmp_path / "mine", tmp_path / "other"
    uid = pool.lease(mine, root)
    assert uid is not None and pool.holds(uid, mine, root)
    assert not pool.holds(uid, other, root) and not pool.holds(0, mine, root)
    assert not pool.holds(made.first + 1, mine, root)  # (an id of the pool, leased to nobody)
