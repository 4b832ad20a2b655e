"""Memory shared between sessions, on real VMs: two sessions of one template map one copy of its memory (their
proportional set size is less than their resident one by the part they share); a write in one reaches neither
the other nor the template; no session's QEMU can change the template's memory, not by writing it, not by
punching holes in it (the balloon's free page reporting asks QEMU 7.2 to), not by truncating it; a copy no
session maps is given back (the memory guard's first relief), and the next warm start seals a fresh one; a holder
that holds a FUSE file instead (a process of QEMU's account traced it) holds no warm start up."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import URI, VmFactory, guest_sh, unique_name, wait_for
from tests.integration.foreign_files import NUMBER, ended, never_closing, qemu_account_process
from vmsandbox.session.end import lifecycle
from vmsandbox.session.moments import checkpoint, fork
from vmsandbox.session.place.local import sharing, template
from vmsandbox.session.record import Record
from vmsandbox.vm.memory import holders, sealed
from vmsandbox.vm.virt import Hypervisor

MiB = 1024 * 1024
DIGEST_CHUNK = 8 * MiB
pytestmark = pytest.mark.root("only root hands QEMU a sealed memory file (and plays QEMU's account here)")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("memory") / "memory project"
    p.mkdir()
    (p / "README").write_text("shared hello\n")
    return p


@pytest.fixture(scope="module")
def pair(module_vms: VmFactory, project: Path) -> tuple[Record, Record]:
    """Two warm sessions of one template."""
    return module_vms.make(project), module_vms.make(project)


def qemu_pid(record: Record) -> int:
    """The pid of the session's QEMU (libvirt's pid file of the domain)."""
    pidfile = Path(f"/run/libvirt/qemu/{record.domain}.pid")
    assert pidfile.is_file(), f"no QEMU runs for {record.domain}"
    return int(pidfile.read_text().strip())


def fields(lines: Iterator[str]) -> dict[str, int]:
    found = {}
    for line in lines:
        key, _, rest = line.partition(":")
        if rest.strip().endswith("kB"):
            found[key] = int(rest.split()[0]) * 1024
    return found


def rollup(pid: int) -> dict[str, int]:
    return fields(iter(Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]))


def ram_mapping(pid: int) -> tuple[int, dict[str, int]]:
    """The inode of the memory file the QEMU maps as the guest's RAM, and its mapping's smaps fields."""
    blocks = Path(f"/proc/{pid}/smaps").read_text().split("\n")
    for i, line in enumerate(blocks):
        if "/memfd:vmsandbox-" in line:
            inode = int(line.split()[4])
            end = next(j for j in range(i + 1, len(blocks)) if not blocks[j].split(":")[0].replace("_", "").isalpha())
            return inode, fields(iter(blocks[i + 1 : end]))
    raise AssertionError(f"QEMU {pid} maps no sealed memory file")


def qemu_fd_of_ram(pid: int) -> Path:
    """The descriptor through which the session's QEMU holds its RAM's file."""
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if str(fd.readlink()).startswith("/memfd:vmsandbox-"):
                return fd
        except OSError:
            continue
    raise AssertionError(f"QEMU {pid} holds no sealed memory file")


def digest(path: Path | str) -> str:
    """The SHA-256 of every byte of a file (a memory file's holes read as zeros, and allocate nothing)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:  # noqa: PTH123 - a /proc path as much as a file
        while chunk := f.read(DIGEST_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def template_of(record: Record) -> template.Template:
    assert record.template is not None
    return template.Template(Path(record.template), {})


def held_digest(record: Record) -> str:
    """The digest of the copy of the session's template's memory its keeper holds (handed to root, as to a
    warm start)."""
    with Hypervisor(URI) as hv:
        shared = sharing.of_template(template_of(record), hv, record.accel)
    fd = shared.give()
    try:
        shared.release()
        return digest(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


def test_two_sessions_of_one_template_map_one_copy_of_its_memory(pair: tuple[Record, Record]) -> None:
    one, two = (Record.load(r.name) for r in pair)
    assert one.start == two.start == "warm", (one.start_note, two.start_note)
    assert one.memory is not None and one.memory == two.memory == str(template_of(one).ram), one.memory_note
    (inode_one, map_one), (inode_two, map_two) = ram_mapping(qemu_pid(one)), ram_mapping(qemu_pid(two))
    assert inode_one == inode_two  # one file, mapped by both
    for mapping, pid in ((map_one, qemu_pid(one)), (map_two, qemu_pid(two))):
        shared = mapping["Shared_Clean"] + mapping["Shared_Dirty"]
        assert shared > 16 * MiB, f"the sessions share only {shared // MiB} MiB of their guest RAM"
        whole = rollup(pid)
        assert whole["Pss"] < whole["Rss"] - shared // 4, whole  # what they share counts half in each


def test_a_write_in_one_session_reaches_neither_the_other_nor_the_template(pair: tuple[Record, Record]) -> None:
    one, two = (Record.load(r.name) for r in pair)
    tmpl = template_of(one)
    before = held_digest(one), digest(tmpl.ram)
    anon = ram_mapping(qemu_pid(one))[1]["Anonymous"]
    marker = os.urandom(16).hex()
    # 64 MiB the guest takes from memory it got from the template (its free pages), and a file the template's
    # page cache held (its warm-up read it) appended to
    guest_sh(
        one,
        f"head -c {64 * MiB} /dev/urandom > /dev/shm/noise; echo {marker} > /dev/shm/marker; "
        f"echo '# {marker}' >> /etc/login.defs",
        root=True,
    )
    grew = ram_mapping(qemu_pid(one))[1]["Anonymous"] - anon
    assert grew >= 16 * MiB, f"the write took {grew // MiB} MiB of the session's own pages"
    seen = guest_sh(two, f"cat /dev/shm/marker 2>/dev/null; grep -c {marker} /etc/login.defs || true", root=True)
    assert marker not in seen
    assert (held_digest(one), digest(tmpl.ram)) == before  # the template's memory, in memory and on disk


def as_qemu(record: Record, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run a Python script as the session's QEMU account (its own: libvirt's static DAC label), as its QEMU would
    act."""
    assert record.account is not None, "the session runs as libvirt's account: was `host setup` run?"
    uid = gid = record.account
    argv = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "/usr/bin/python3", "-c", script, *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


PROBE_WRITES = """
import ctypes, errno, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
said = []
for what, call in (
    ("write", lambda: os.pwrite(fd, b"owned", 4096)),
    ("truncate", lambda: os.ftruncate(fd, 0)),
    ("grow", lambda: os.ftruncate(fd, os.fstat(fd).st_size + 4096)),
):
    try:
        call()
        said.append(what + " ok")
    except OSError as exc:
        said.append(what + " " + errno.errorcode[exc.errno])
libc = ctypes.CDLL(None, use_errno=True)
r = libc.fallocate(fd, 3, ctypes.c_long(0), ctypes.c_long(1 << 20))
said.append("punch " + ("ok" if r == 0 else errno.errorcode[ctypes.get_errno()]))
print(" ".join(said))
"""


def test_no_session_qemu_can_change_the_template_memory(pair: tuple[Record, Record]) -> None:
    one = Record.load(pair[0].name)
    tmpl = template_of(one)
    before = held_digest(one)
    # what the session's own QEMU holds, opened as its account: read-write, and sealed
    probe = as_qemu(one, PROBE_WRITES, str(qemu_fd_of_ram(qemu_pid(one))))
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == ["write", "EPERM", "truncate", "EPERM", "grow", "EPERM", "punch", "EPERM"]
    # the files on disk QEMU's account cannot even open for writing
    for f in (tmpl.ram, tmpl.state, tmpl.memory):
        opened = as_qemu(one, "import os, sys; os.open(sys.argv[1], os.O_RDWR)", str(f))
        assert opened.returncode != 0 and "PermissionError" in opened.stderr, (f, opened.stderr)
    assert held_digest(one) == before


def test_the_balloon_cannot_punch_holes_in_the_template(pair: tuple[Record, Record]) -> None:
    """The guest frees memory it wrote; its balloon reports the free pages; QEMU 7.2 punches holes in the memory
    file for them (a private mapping or not): the seal refuses each (EPERM, in the domain's log), and the
    template's memory stays as it was."""
    one = Record.load(pair[1].name)
    before = held_digest(one)
    log = Path(f"/var/log/libvirt/qemu/{one.domain}.log")
    refused = log.read_text(errors="replace").count("Failed to fallocate")
    guest_sh(one, "python3 -c 'b = bytearray(384 << 20); b[::4096] = b\"x\" * len(b[::4096])'", root=True)
    wait_for(
        lambda: log.read_text(errors="replace").count("Failed to fallocate") > refused,
        60,
        "the balloon's free page report to be refused",
    )
    assert f"({-errno.EPERM})" in log.read_text(errors="replace").rsplit("Failed to fallocate", 1)[1].split("\n")[0]
    assert held_digest(one) == before


def test_a_fork_and_its_source_map_one_copy_of_the_memory_saved_at_the_fork(
    module_vms: VmFactory, pair: tuple[Record, Record], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fork taken the paused way (its source saved and restored: VMSANDBOX_LIVE_FORK=0, or a guest that cannot
    freeze its workspace) and its source, under accounts of their own, map the memory saved at the fork; the fork
    sees its source's state then, not its later writes. (A live fork: test_live_fork.py.)"""
    monkeypatch.delenv(sharing.FORK_SWITCH, raising=False)
    monkeypatch.setenv(checkpoint.LIVE_SWITCH, "0")
    source = Record.load(pair[0].name)
    guest_sh(source, "echo before > /dev/shm/forkmark", root=True)
    new = unique_name()
    module_vms.made.append(new)
    made = fork.fork(source.name, new)
    try:
        forked, source = Record.load(made.name), Record.load(source.name)
        assert forked.memory is not None and forked.memory == source.memory, (forked.memory_note, source.memory_note)
        assert None is not forked.account != source.account is not None
        (inode_fork, in_fork), (inode_source, _) = ram_mapping(qemu_pid(forked)), ram_mapping(qemu_pid(source))
        assert inode_fork == inode_source
        shared = in_fork["Shared_Clean"] + in_fork["Shared_Dirty"]
        assert shared > 16 * MiB, f"the fork shares only {shared // MiB} MiB with its source"
        guest_sh(source, "echo after > /dev/shm/forkmark", root=True)
        assert guest_sh(forked, "cat /dev/shm/forkmark", root=True).strip() == "before"
    finally:
        lifecycle.remove(Record.load(made.name))


def test_a_copy_no_session_maps_is_given_back_and_the_next_warm_start_seals_anew(
    module_vms: VmFactory, project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the memory guard frees before it stops a session: the copy of a template's memory no session maps. Its
    holders here are this test's own (a runtime directory of its own: the other tests' copies are left be)."""
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("VMSANDBOX_RUNTIME_DIR", str(runtime))
    first = module_vms.make(project)
    assert first.memory is not None, first.memory_note
    (entry,) = sorted((runtime / "memory").glob("*.json"))
    held = sealed.Held.of(json.loads(entry.read_text()))
    assert held.alive() and holders.give_back() == []  # a session maps it: it stays
    lifecycle.remove(Record.load(first.name))
    second: Record | None = None
    try:
        (freed,) = holders.give_back()
        assert freed[0] == first.template and freed[1] > 0, freed  # (its pages the warm start read in)
        wait_for(lambda: not held.alive(), timeout=10, what="the holder to end")
        assert not entry.exists()
        second = module_vms.make(project)
        assert second.memory is not None, second.memory_note
        again = sealed.Held.of(json.loads(entry.read_text()))
        assert again.pid != held.pid and again.alive()
        assert guest_sh(second, "cat README") == "shared hello\n"
    finally:
        if second is not None:
            lifecycle.remove(Record.load(second.name))
        for left in (runtime / "memory").glob("*.json"):  # none left running: their directory goes with the test
            sealed.Held.of(json.loads(left.read_text())).stop()


def test_a_warm_start_whose_holder_holds_a_fuse_file_seals_a_fresh_copy_and_says_so(
    module_vms: VmFactory,
    project: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A process of QEMU's account traced the template's holder and put a FUSE file that never answers root's close
    at its number (here a stand-in of that account, named in the holder's record): the warm start is not held up.
    The holder is passed over, said, and stopped; a fresh copy is sealed and mapped; root never closed the file
    (the kernel said it was no memfd before anything was taken)."""
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("VMSANDBOX_RUNTIME_DIR", str(runtime))
    first = module_vms.make(project)  # (its holder's record: where the stand-in is named)
    lifecycle.remove(Record.load(first.name))
    (entry,) = sorted((runtime / "memory").glob("*.json"))
    sealed.Held.of(json.loads(entry.read_text())).stop(wait=10)
    entry_template = json.loads(entry.read_text())["template"]
    made: Record | None = None
    with never_closing(tmp_path) as fuse, qemu_account_process("hold", fuse) as holder:
        entry.write_text(json.dumps(holder.record(entry_template)))
        capfd.readouterr()
        try:
            made = module_vms.make(project)
            assert made.start == "warm" and made.memory is not None, made.memory_note
            said = f"skipped holder pid {holder.pid}: its descriptor {NUMBER} is not a memfd"
            assert said in capfd.readouterr().err
            ended(holder.pid)  # stopped by the warm start
            fresh = sealed.Held.of(json.loads(entry.read_text()))
            assert fresh.pid != holder.pid and fresh.alive()
            assert guest_sh(made, "cat README") == "shared hello\n"
            assert fuse.held_flushes() == []
        finally:
            if made is not None:
                lifecycle.remove(Record.load(made.name))
            for left in (runtime / "memory").glob("*.json"):  # none left running: their directory goes with the test
                sealed.Held.of(json.loads(left.read_text())).stop()
