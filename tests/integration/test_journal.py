"""The guest's change journal on a real VM: after every kind of change a pull that fetches only what the
journal names sees exactly what a walk of the whole tree sees; when the journal cannot be sure (a hard link,
a file mapped for writing, the daemon killed or stopped, a guest that answers in its place with nonsense), the
pull walks instead and nothing is missed.

The steps run in order on one session of this module (each leaves the journal's cursor where the next starts).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from vmsandbox import proc
from vmsandbox.errors import VmsandboxError
from vmsandbox.image import store
from vmsandbox.session.end import lifecycle
from vmsandbox.session.options import Options
from vmsandbox.session.record import Record
from vmsandbox.session.start import create
from vmsandbox.sync.fetch import delta, journal, mirror
from vmsandbox.sync.inward import capture
from vmsandbox.sync.tree import manifest

from .conftest import suite_settings, unique_name

LIMIT = 1024**3
# (byte 4096, which a step overwrites with "X", is never "X" already: one run in 256 it would be)
BIG = os.urandom(4096) + b"\0" + os.urandom(8 * 1024**2 - 4097)


@pytest.fixture(scope="module")
def session(base_image: store.Image, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Record]:
    project = tmp_path_factory.mktemp("journal") / "project"
    for d in ("src/lib", "docs", "old/deep/er", "build"):
        (project / d).mkdir(parents=True)
    for i in range(30):
        (project / "src/lib" / f"m{i}.py").write_text(f"value = {i}\n")
    (project / "docs/readme.md").write_text("read me\n")
    (project / "old/deep/er/file").write_text("old\n")
    (project / "build/out.o").write_bytes(b"\x7fELF" * 100)
    (project / "data").mkdir()
    (project / "data/big.bin").write_bytes(BIG)
    (project / "data/run.sh").write_text("#!/bin/sh\necho run\n")
    record = create.create(Options(project=project, name=unique_name(), settings=suite_settings(), keep=True))
    yield record
    lifecycle.remove(record)


def guest(record: Record, script: str) -> None:
    """Run `script` as root in the guest's project directory."""
    command = f"cd {shlex.quote(record.project)} && {script}"
    proc.run([*record.endpoint().ssh_argv("-T", user="root"), "--", command], timeout=120)


def fetch(record: Record) -> mirror.Fetched:
    return mirror.fetch_live(
        record.endpoint("root"), record.project, record.files, capture.baseline(record.files), max_file_bytes=LIMIT
    )


def walked(record: Record) -> mirror.Fetched:
    """What a fetch of the whole tree finds (the journal's answer is not used)."""
    delta.forget(record.files.root)
    found = fetch(record)
    assert "whole tree" in found.how
    return found


def step(record: Record, script: str, *, expect: str) -> mirror.Fetched:
    guest(record, script)
    named = fetch(record)
    assert expect in named.how, named.how
    whole = walked(record)
    assert named.view == whole.view
    assert named.differs == whole.differs
    return named


def test_the_first_pull_asks_from_the_workspace_as_it_was_made(session: Record) -> None:
    first = fetch(session)
    assert first.how == "the journal named 0 path(s)"
    assert first.differs == frozenset()
    assert journal.load(session.files.root).instance != journal.ORIGIN.instance


def allocated(root: Path) -> int:
    """Bytes the regular files under root take on disk."""
    return sum(p.lstat().st_blocks * 512 for p in root.rglob("*") if p.is_file() and not p.is_symlink())


@pytest.mark.root("placeholders are marked with `trusted.*` attributes, which only root can set")
def test_the_mirror_holds_no_second_copy_of_the_project(session: Record) -> None:
    """The mirror starts with placeholders (sync.placeholders): the baseline holds the project's data, the
    mirror none of it, and yet a walk of it finds the baseline. The workspace disk is sparse."""
    files = session.files
    assert allocated(files.baseline) > len(BIG)
    assert allocated(files.guest_tree) < 64 * 1024
    # the workspace disk holds the data and ext4's metadata, not the ~300 MiB of zeros mkfs allocated
    assert files.workspace_disk.stat().st_blocks * 512 < len(BIG) + 48 * 1024**2
    assert walked(session).differs == frozenset()
    assert allocated(files.guest_tree) < 64 * 1024  # a whole fetch sends nothing the guest did not change


def test_a_byte_changed_in_a_big_file_and_a_mode_changed(session: Record) -> None:
    """A placeholder named by the journal gets the baseline's data first (rsync sends only the difference);
    a mode-only change leaves rsync nothing to send, and the review still reads the file's real content."""
    named = step(
        session,
        "printf X | dd of=data/big.bin bs=1 seek=4096 conv=notrunc status=none && chmod 755 data/run.sh",
        expect="the journal named 2 path(s)",
    )
    changed = BIG[:4096] + b"X" + BIG[4097:]
    assert named.view["data/big.bin"].digest == hashlib.sha256(changed).hexdigest()
    assert (session.files.guest_tree / "data/big.bin").read_bytes() == changed
    base = capture.baseline(session.files)["data/run.sh"]
    assert named.view["data/run.sh"].mode == 0o755 and named.view["data/run.sh"].digest == base.digest
    assert (session.files.guest_tree / "data/run.sh").read_text() == "#!/bin/sh\necho run\n"
    assert {"data/big.bin", "data/run.sh"} <= named.differs


def test_a_file_rewritten_with_its_size_and_time_kept_is_fetched(session: Record) -> None:
    """`cp -p`, `tar x` and rsync in the guest keep a file's size and time: the journal names it, and the
    fetch compares its bytes (rsync's quick check by size and time alone would keep the mirror's old copy,
    and the review would miss the change)."""
    named = step(
        session,
        "cp -p src/lib/m20.py /tmp/m20 && printf 'value = 99\\n' > src/lib/m20.py && touch -r /tmp/m20 src/lib/m20.py",
        expect="the journal named 1 path(s)",
    )
    assert named.view["src/lib/m20.py"].digest == hashlib.sha256(b"value = 99\n").hexdigest()
    assert "src/lib/m20.py" in named.differs


def test_a_guest_that_forges_placeholders_gets_its_real_bytes_seen(session: Record) -> None:
    """The guest's root sets the placeholder attribute itself, with the baseline's hash, on a file it rewrote
    and on a new one: rsync never carries attributes, so the mirror and the pull see what the files hold."""
    files = session.files
    claimed = capture.baseline(files)["data/run.sh"].digest
    assert claimed is not None
    script = (
        "python3 -c \"import os; d = bytes.fromhex('" + claimed + "'); "
        "open('data/run.sh', 'w').write('#!/bin/sh\\necho forged\\n'); "
        "open('data/forged.bin', 'wb').write(b'junk'); "
        "[os.setxattr(p, 'trusted.vmsandbox.digest', d) for p in ('data/run.sh', 'data/forged.bin')]\""
    )
    named = step(session, script, expect="the journal named")
    assert named.view["data/run.sh"].digest == hashlib.sha256(b"#!/bin/sh\necho forged\n").hexdigest()
    assert named.view["data/forged.bin"].digest == hashlib.sha256(b"junk").hexdigest()
    for rel in ("data/run.sh", "data/forged.bin"):
        fd = os.open(files.guest_tree / rel, os.O_RDONLY)
        try:
            assert manifest.placeholder_digest(fd) is None
        finally:
            os.close(fd)


def test_every_kind_of_change_is_named(session: Record) -> None:
    script = r"""
set -e
echo changed >> src/lib/m1.py
: > src/lib/m2.py
chmod +x src/lib/m3.py
mkdir -p new/tree/deep && echo leaf > new/tree/deep/leaf && ln -s ../tree new/link
printf 'x' > "$(printf 'line\nbreak')" && printf 'y' > "$(printf 'bad\377utf8')"
mv src/lib/m4.py src/lib/m4-renamed.py
mv docs manual
rm -rf old
rm -rf build && echo now-a-file > build
rm src/lib/m5.py && mkdir src/lib/m5.py && echo in > src/lib/m5.py/inner
echo edited > src/lib/.m6.py.swp && mv src/lib/.m6.py.swp src/lib/m6.py
chmod 700 src/lib
"""
    named = step(session, script, expect="the journal named")
    assert "old/deep/er/file" in named.differs and named.view.get("old") is None
    assert named.view["build"].kind == "file" and named.view["src/lib/m5.py/inner"].kind == "file"
    assert named.view["line\nbreak"].size == 1 and named.view["bad\udcffutf8"].size == 1


def test_a_quiet_guest_names_nothing(session: Record) -> None:
    assert fetch(session).how == "the journal named 0 path(s)"


def test_the_relay_takes_any_fd_number(session: Record) -> None:
    """rsync's relay once ran under dash, which takes one-digit fds only: with many files open here the
    relay's socket got fd 13 and every fetch of named paths failed."""
    spare = [os.open("/dev/null", os.O_RDONLY) for _ in range(12)]
    try:
        step(session, "echo fd > high-fd", expect="the journal named 1 path(s)")
    finally:
        for fd in spare:
            os.close(fd)


def test_many_files_in_a_new_tree(session: Record) -> None:
    step(session, "mkdir -p gen && for i in $(seq 1 500); do echo $i > gen/f$i; done", expect="the journal named")


def test_entries_are_counted_while_received(session: Record, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the budget of entries the receiver is stopped mid-transfer (rsync's itemized lines, counted as they
    come: the tree was never read); the next pull, within it, reads the whole tree and misses nothing."""
    guest(session, "mkdir -p flood && for i in $(seq 1 300); do : > flood/e$i; done")
    monkeypatch.setattr(mirror, "MAX_PULL_ENTRIES", 40)
    with pytest.raises(VmsandboxError, match="more than 40 files and directories in one pull") as caught:
        fetch(session)
    assert "stopped while receiving" in caught.value.message and "sync_limit" in (caught.value.hint or "")
    monkeypatch.undo()
    after = fetch(session)
    assert "whole tree" in after.how  # what the stopped transfer left is not trusted
    assert {f"flood/e{i}" for i in range(1, 301)} <= after.differs
    guest(session, "rm -rf flood")
    fetch(session)


def test_a_changed_hard_linked_file_is_a_walk(session: Record) -> None:
    step(session, "ln src/lib/m7.py linked && echo more >> src/lib/m7.py", expect="hard-linked-file-changed")
    step(session, "rm linked && echo again >> src/lib/m7.py", expect="the journal named")


def test_a_file_mapped_for_writing_is_a_walk(session: Record) -> None:
    hold = (  # (in a subshell of its own, so that ssh does not wait for it)
        '(setsid python3 -c \'import mmap, os, time; fd = os.open("mapped", os.O_RDWR | os.O_CREAT); '
        'os.ftruncate(fd, 4096); m = mmap.mmap(fd, 4096); m[:5] = b"hello"; open("/tmp/mapped-ready", "w"); '
        "time.sleep(600)' &) </dev/null >/dev/null 2>&1; "
        "for i in $(seq 600); do [ -e /tmp/mapped-ready ] && exit 0; sleep 0.1; done; exit 1"
    )
    named = step(session, hold, expect="file-mapped-for-writing")
    assert named.view["mapped"].size == 4096
    step(session, "pkill -f '[i]mport mmap' && sleep 1 && echo after > after", expect="the journal named")


def test_a_restarted_or_stopped_journal_is_a_walk_and_then_trusted_again(session: Record) -> None:
    unit = 'vmsandbox-journal@$(systemd-escape --path "$PWD").service'
    step(session, f"systemctl kill -s KILL {unit} && sleep 2 && echo x > while-restarting", expect="another-journal")
    step(session, "echo y > after-restart", expect="the journal named")
    step(session, f"systemctl stop {unit} && echo z > while-stopped", expect="no-journal")
    step(session, f"systemctl start {unit} && echo w > started-again", expect="another-journal")
    step(session, "echo v > trusted-again", expect="the journal named")


def test_a_guest_that_answers_nonsense_gets_a_walk(session: Record) -> None:
    """A guest (root in it) replaces the journal's program with one that names a path outside the project,
    then with one that floods escape sequences: the host walks, and what it sees is right."""
    real = journal.PROGRAM

    def answer_with(body: str) -> None:
        # (the running daemon keeps the old program: a new file under its name, as a root guest can make)
        guest(session, f"set -e; rm -f {real}; cat > {real} <<'EOF'\n#!/bin/sh\n{body}\nEOF\nchmod 755 {real}")

    guest(session, f"cp {real} /root/journal.real")
    try:
        answer_with("printf 'ok %032x 1 1\\n../../../etc/shadow\\n' 0")
        guest(session, "echo lie > lied-about")
        named = fetch(session)
        assert "invalid path" in named.how, named.how
        assert named.view["lied-about"].size == 4 and "../../../etc/shadow" not in named.view
        answer_with("head -c 30000000 /dev/zero | tr '\\000' '\\033'")
        flood = fetch(session)
        assert "not understood" in flood.how, flood.how
        # a well-formed lie: it names a file below a symlink that leads to a host directory anyone may write
        # (as if the receiver could be made to write through it); nothing may appear there
        trap = Path(tempfile.mkdtemp(prefix="vmsandbox-it-trap-"))
        trap.chmod(0o1777)
        try:
            guest(session, f"mkdir -p {trap} && echo planted > {trap}/planted && ln -sfn {trap} via-link")
            answer_with("printf 'ok %032x 999999 1\\nvia-link/planted\\n' 7")  # only the file below the link
            lied = fetch(session)
            assert "whole tree" in lied.how or lied.how == "the journal named 1 path(s)", lied.how
            assert not (trap / "planted").exists(), "a guest symlink led the mirror's writer out of the mirror"
            # rsync made the link's name a real directory in the mirror and put the guest's own bytes in it: the
            # lie changed only what the guest seems to have, inside the mirror
            inside = session.files.guest_tree / "via-link"
            assert inside.is_dir() and not inside.is_symlink()
            assert lied.view["via-link/planted"].size == len("planted\n")
        finally:
            shutil.rmtree(trap, ignore_errors=True)
    finally:
        guest(session, f"cp /root/journal.real {real}.new && mv {real}.new {real}")
    # the real journal again: the last lie was well formed, so the host holds the liar's cursor, which the real
    # journal does not know: one walk, then its own cursor is trusted again
    step(session, "echo honest > honest-again", expect="another-journal")
    step(session, "echo honest >> honest-again", expect="the journal named 1 path(s)")


def test_a_cold_booted_session_has_its_journal_too(base_image: store.Image, tmp_path: Path) -> None:
    """A cold boot starts the journal as early as a warm start does (it once failed there: no /run/vmsandbox
    yet, so every pull of a cold session silently read the whole tree)."""
    project = tmp_path / "cold"
    project.mkdir()
    (project / "a").write_text("a\n")
    record = create.create(
        Options(project=project, name=unique_name(), settings=suite_settings(), keep=True, cold=True)
    )
    try:
        assert record.start == "cold"
        named = step(record, "echo more >> a", expect="the journal named 1 path(s)")
        assert named.differs == frozenset({"a"})
    finally:
        lifecycle.remove(record)
