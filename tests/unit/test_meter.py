"""The budget held while rsync receives (sync.meter) and the jail's view of the host (jail.py), on a fake
/proc and as argument lists: no process is started or killed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from vmsandbox.confine.jail import SYSTEM, Jail
from vmsandbox.sync.fetch import meter


def _process(proc: Path, pid: int, ppid: int, name: str, wchar: int) -> None:
    task = proc / str(pid) / "task" / str(pid)
    task.mkdir(parents=True)
    (proc / str(pid) / "comm").write_text(f"{name}\n")
    (task / "io").write_text(f"rchar: 7\nwchar: {wchar}\nsyscr: 1\n")
    (task / "children").write_text("")
    parent = proc / str(ppid) / "task" / str(ppid) / "children"
    if parent.exists():
        parent.write_text(f"{parent.read_text()}{pid} ")


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    """bwrap (100) → bwrap (101) → rsync (102) → its receiver (103) and the relay (104 bash, 105 cat); an
    unrelated rsync (200) elsewhere."""
    p = tmp_path / "proc"
    _process(p, 100, 1, "bwrap", 5)
    _process(p, 101, 100, "bwrap", 5)
    _process(p, 102, 101, "rsync", 1000)
    _process(p, 103, 102, "rsync", 4000)
    _process(p, 104, 102, "bash", 9)
    _process(p, 105, 104, "cat", 10**9)  # the wire passing through: not what was written
    _process(p, 200, 1, "rsync", 10**9)
    return p


def test_the_bytes_counted_are_the_transfers_rsyncs_own(proc: Path) -> None:
    killed: list[int] = []
    m = meter.Meter(100, meter.Budget(bytes=10_000, entries=10), proc=proc, kill=killed.append)
    m.sample()
    assert m.written == 5000 and m.passed is None and killed == []


def test_passing_the_bytes_stops_the_transfer_once(proc: Path) -> None:
    killed: list[int] = []
    (proc / "103" / "task" / "103" / "io").write_text(f"wchar: {4 * 1024**2 + meter.SLACK}\n")
    m = meter.Meter(100, meter.Budget(bytes=4 * 1024**2, entries=10), proc=proc, kill=killed.append)
    m.sample()
    assert killed == [100] and m.passed == "more than 4 MiB in one pull"  # (rsync's own 1000 bytes over the slack)
    m.sample()
    assert killed == [100, 100] and m.passed == "more than 4 MiB in one pull"  # killed again, said once


def test_a_count_never_goes_down_and_a_gone_process_keeps_its_bytes(proc: Path) -> None:
    m = meter.Meter(100, meter.Budget(bytes=10**6, entries=10), proc=proc, kill=lambda _: None)
    m.sample()
    (proc / "103" / "task" / "103" / "io").write_text("wchar: 3\n")  # (a reused pid reads lower)
    m.sample()
    assert m.written == 5000
    shutil.rmtree(proc / "103")
    m.sample()
    assert m.written == 5000


def test_entries_are_itemized_lines_and_deletions_do_not_count() -> None:
    killed: list[int] = []
    m = meter.Meter(7, meter.Budget(bytes=10**9, entries=2), proc=Path("/nonexistent"), kill=killed.append)
    for line in ("*deleting   a", ">f+++++++++", "cd+++++++++", "rsync: [sender] failed", "hf+++++++++"):
        m.line(line)
    assert m.entries == 3 and killed == [7] and m.passed == "more than 2 files and directories in one pull"


def test_the_receiver_is_told_to_itemize_without_names() -> None:
    assert meter.OPTIONS == ("--out-format=%i %l",)


def test_the_jail_shows_the_system_and_what_it_is_given_and_nothing_else(tmp_path: Path) -> None:
    project, gitdir, incoming = tmp_path / "p", tmp_path / "p" / ".git", tmp_path / "in"
    argv = Jail(writable=(gitdir,), readable=(project, incoming)).argv(["git", "fetch"], project)
    joined = " ".join(argv)
    assert "--ro-bind / /" not in joined and "--bind / /" not in joined
    mounts = [(a, argv[i + 2]) for i, a in enumerate(argv) if a in ("--ro-bind", "--bind", "--symlink")]
    assert [m for m in mounts if m[0] == "--bind"] == [("--bind", str(gitdir))]  # the one place it writes
    assert {dest for _, dest in mounts} == {str(gitdir), str(project), str(incoming)} | {
        t for t in SYSTEM if Path(t).exists()
    }
    assert mounts.index(("--ro-bind", str(project))) < mounts.index(("--bind", str(gitdir)))  # nested: rw on top
    assert argv[argv.index("--tmpfs") - 2 : argv.index("--tmpfs") + 2] == [
        "--size",
        str(64 * 1024**2),
        "--tmpfs",
        "/tmp",
    ]
    assert argv.index("--remount-ro") > max(i for i, a in enumerate(argv) if a in ("--bind", "--ro-bind"))
    assert argv[-4:] == [str(project), "--", "git", "fetch"] and "--unshare-all" in argv


def test_a_path_under_a_link_is_there_both_ways(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    argv = Jail(readable=(tmp_path / "link",)).argv(["true"], None)
    link, real = str(tmp_path / "link"), str((tmp_path / "real").resolve())
    assert ["--ro-bind", link, link, "--ro-bind", real, real] == argv[argv.index(link) - 1 : argv.index(link) + 5]


def test_an_entry_is_charged_what_the_file_system_spends_on_it(proc: Path) -> None:
    """8,000 directories wrote 1.1 MB and took 33 MB in the mirror (issue 43): each entry is charged a block
    besides its bytes, and passing the budget that way stops the transfer as the line comes."""
    killed: list[int] = []
    tally = meter.Tally()
    with meter.Meter(100, meter.Budget(bytes=10 * meter.BLOCK, entries=10**6), proc=proc, kill=killed.append,
                     tally=tally) as m:  # fmt: skip
        for _ in range(10):
            m.line("cd+++++++++")
        assert killed == [] and m.spent == 10 * meter.BLOCK + m.written
        for _ in range(300):
            m.line("cL+++++++++")
    assert killed and m.passed == "more than 40 KiB in one pull"  # (not "0 MiB")
    assert tally.entries == 310 and tally.spent == 310 * meter.BLOCK + 5000
    # a file's length counts as written when the kernel's count read so far says less (a receiver that ended
    # between two samples)
    later = meter.Meter(100, meter.Budget(bytes=10**9, entries=10**6), proc=proc, kill=killed.append)
    later.line(">f+++++++++ 7000000")
    later.line(">f+++++++++ 7,000")  # not a plain length: not counted
    assert later.spent == 7_000_000 + 2 * meter.BLOCK


def test_a_session_s_mirror_is_bounded_over_its_pulls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The budget is per session, not per transfer: what each transfer spent adds up; a walk of the mirror sets
    the ledger to the truth; the host's free blocks and inodes bound it too."""
    import os

    from vmsandbox.errors import VmsandboxError
    from vmsandbox.paths import SessionPaths
    from vmsandbox.sync.fetch import spend

    files = SessionPaths(tmp_path / "s")
    files.guest_tree.mkdir(parents=True)
    mib = 1024**2
    first = spend.room(files, mib, max_entries=1000)
    assert (first.bytes, first.entries) == (mib, 1000) and "in one pull" in first.why
    (files.guest_tree / "kept").write_bytes(b"k" * (3 * mib + mib // 2))  # what the pulls really left there
    spend.add(files.root, meter.Tally(spent=3 * mib + mib // 2, entries=1))
    second = spend.room(files, mib, max_entries=1000)
    assert second.bytes <= mib // 2 and second.entries == 999 and "past its bound" in second.why
    (files.guest_tree / "kept").unlink()  # a stopped transfer's partial file, removed: the ledger counts it still
    spend.add(files.root, meter.Tally(spent=mib, entries=10))
    (files.guest_tree / "d").mkdir()  # what the mirror really holds: one directory
    third = spend.room(files, mib, max_entries=1000)  # the ledger would bound it: the truth decides
    assert spend.load(files.root).entries == 1 and third.bytes == mib and "in one pull" in third.why
    spend.add(files.root, meter.Tally(spent=3 * mib, entries=1))  # (a later pull's spend, not on the disk)
    fourth = spend.room(files, mib, max_entries=1000)
    assert fourth.bytes == mib and "in one pull" in fourth.why
    for _ in range(3):
        spend.add(files.root, meter.Tally(spent=2 * mib, entries=1))
    for name in range(2000):
        (files.guest_tree / "d" / str(name)).mkdir()
    with pytest.raises(VmsandboxError, match=r"2,001 entries .* the most a session's may"):
        spend.room(files, mib, max_entries=1000)

    class Full:
        f_bavail, f_frsize, f_favail, f_files = 100, 4096, 10**6, 10**6

    monkeypatch.setattr(os, "statvfs", lambda _: Full())
    with pytest.raises(VmsandboxError, match="no room left for the mirror"):
        spend.room(SessionPaths(tmp_path / "empty"), 10 * mib, max_entries=1000)


def test_a_tree_too_deep_to_walk_is_refused_with_the_fix(tmp_path: Path) -> None:
    """A chain of a thousand nested directories (within rsync's path limit) made the walks raise RecursionError:
    every pull crashed with a traceback. One line with the fix instead."""
    import os

    from vmsandbox.errors import VmsandboxError
    from vmsandbox.sync.fetch import spend
    from vmsandbox.sync.tree import manifest

    deep = tmp_path / "deep"
    deep.mkdir()
    fd = os.open(deep, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1500):
        os.mkdir("a", dir_fd=fd)
        inner = os.open("a", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(fd)
    for walk in (lambda: manifest.scan(deep), lambda: spend.measure(deep)):
        with pytest.raises(VmsandboxError, match="nested deeper than a walk goes") as err:
            walk()
        assert err.value.hint and "vmsandbox shell" in err.value.hint
    path = deep / "/".join(["a"] * 1500)  # taken down from the bottom (rmtree recurses too)
    while path != deep:
        path.rmdir()
        path = path.parent
