"""Workspace in, reviewed three-way sync-back out, nothing lost — on one real VM, in stages.

The tests of this module run in order against one session (started with `run --keep`), each stage building
on the previous one, so one boot covers the whole life of a session's changes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pty
import select
import subprocess
import time
from pathlib import Path

import pytest

from vmsandbox import paths
from vmsandbox.session import core as session
from vmsandbox.sync import tree
from vmsandbox.vm.virt import Hypervisor

from .conftest import Cli, assert_gone

GUEST_SCRIPT = r"""
set -e
git -c safe.directory='*' -c user.email=agent@vm -c user.name=agent commit -q -m 'guest work' --allow-empty
echo guest >> modify.txt
rm delete.txt
mv rename_src.txt renamed.txt
chmod 600 chmod.txt
echo g >> 'name with spaces.txt'
echo g >> 'ünïcödé.txt'
head -c 4000000 /dev/urandom > big.bin
rmdir emptydir
mkdir newempty
echo guest > conflict.txt
ln -s keep.txt link_inside
ln -s /etc/passwd link_abs
ln -s ../../../etc/passwd link_up
echo hl > hard1
ln hard1 hard2
mkfifo fifo
echo s > setuid.sh
chmod 4755 setuid.sh
printf '#!/bin/sh\necho pwned\n' > .git/hooks/pre-commit
chmod +x .git/hooks/pre-commit
git config core.fsmonitor 'touch /tmp/pwned'
"""


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def git(project: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(project), *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("ws") / "project"
    p.mkdir()
    for name, text in {
        "keep.txt": "keep\n",
        "modify.txt": "base\n",
        "delete.txt": "x\n",
        "rename_src.txt": "r\n",
        "chmod.txt": "c\n",
        "name with spaces.txt": "s\n",
        "ünïcödé.txt": "u\n",
        "conflict.txt": "base\n",
        ".gitignore": "*.log\n",
    }.items():
        (p / name).write_text(text)
    (p / "big.bin").write_bytes(os.urandom(3_000_000))
    (p / "emptydir").mkdir()
    git(p, "init", "-q", "-b", "main")
    git(p, "add", "-A")
    git(p, "-c", "user.email=me@host", "-c", "user.name=me", "commit", "-q", "-m", "base")
    (p / "ignored.log").write_text("ignored but captured\n")
    (p / "untracked.txt").write_text("untracked but captured\n")
    return p


@pytest.fixture(scope="module")
def name(kept_session: str) -> str:
    return kept_session


def test_workspace_appears_at_the_same_path(cli: Cli, name: str, project: Path) -> None:
    probe = (
        "pwd; stat -c %u:%g modify.txt; sha256sum big.bin | cut -d' ' -f1; cat ignored.log untracked.txt; "
        "git -c safe.directory='*' log --format=%s"
    )
    r = cli.run("exec", name, "--", "sh", "-c", probe)
    assert r.returncode == 0, r.stderr.decode()
    rec = session.Record.load(name)
    for copy in (rec.files.workspace_disk, rec.files.overlay, rec.files.baseline, rec.files.guest_tree):
        assert copy.stat().st_mode & 0o077 == 0, f"{copy} is readable by other host users"
    assert r.stdout.decode().splitlines() == [
        str(project),
        f"{rec.uid}:{rec.gid}",
        sha(project / "big.bin"),
        "ignored but captured",
        "untracked but captured",
        "base",
    ]


def test_without_terminal_or_yes_nothing_is_applied(cli: Cli, name: str, project: Path) -> None:
    r = cli.run("exec", name, "--", "sh", "-c", GUEST_SCRIPT)
    assert r.returncode == 0, r.stderr.decode()
    (project / "conflict.txt").write_text("host\n")  # a host edit during the session
    before = tree.scan(project)
    p = cli.run("pull", name)
    assert p.returncode == 3, p.stderr.decode()
    assert b"nothing applied" in p.stderr
    assert tree.scan(project) == before


def test_diff_lists_the_changes(cli: Cli, name: str) -> None:
    r = cli.run("diff", name, "--stat")
    out = r.stdout.decode()
    for path in ("modify.txt", "delete.txt", "renamed.txt", "big.bin", ".git/hooks/pre-commit", ".git/config"):
        assert path in out
    text = cli.run("diff", name, "modify.txt").stdout.decode()
    assert "+guest" in text and " base" in text
    assert "Binary file big.bin" in cli.run("diff", name, "big.bin").stdout.decode()


def test_pull_yes_applies_what_is_safe(cli: Cli, name: str, project: Path) -> None:
    hooks_before = sorted(p.name for p in (project / ".git/hooks").iterdir())
    head_before = git(project, "rev-parse", "HEAD")
    r = cli.run("pull", name, "--yes")
    err = r.stderr.decode()
    assert r.returncode == 3, err  # quarantined changes remain
    guest_big = cli.run("exec", name, "--", "sha256sum", "big.bin").stdout.decode().split()[0]
    assert (project / "modify.txt").read_text() == "base\nguest\n"
    assert not (project / "delete.txt").exists()
    assert not (project / "rename_src.txt").exists() and (project / "renamed.txt").read_text() == "r\n"
    assert (project / "chmod.txt").stat().st_mode & 0o777 == 0o600
    assert (project / "name with spaces.txt").read_text() == "s\ng\n"
    assert (project / "ünïcödé.txt").read_text() == "u\ng\n"
    assert sha(project / "big.bin") == guest_big
    assert not (project / "emptydir").exists() and (project / "newempty").is_dir()
    # the conflict: host untouched, guest version beside it
    assert (project / "conflict.txt").read_text() == "host\n"
    assert (project / f"conflict.txt.vmsandbox-{name}").read_text() == "guest\n"
    # symlinks: inside kept, escaping ones never created
    assert (project / "link_inside").readlink() == Path("keep.txt")
    assert not (project / "link_abs").is_symlink() and not (project / "link_up").is_symlink()
    assert "link_abs" in err and "link_up" in err
    # hard links come back as files; FIFOs never
    assert (project / "hard1").read_text() == (project / "hard2").read_text() == "hl\n"
    assert not (project / "fifo").exists()
    # quarantined: new executable, hooks, git config
    assert not (project / "setuid.sh").exists()
    assert sorted(p.name for p in (project / ".git/hooks").iterdir()) == hooks_before
    assert "fsmonitor" not in (project / ".git/config").read_text()
    assert "quarantined" in err
    # the guest's commit arrives as a ref, HEAD untouched
    assert git(project, "rev-parse", "HEAD") == head_before
    assert git(project, "log", "--format=%s", "-1", f"refs/remotes/vmsandbox-{name}/main").strip() == "guest work"
    # everything written belongs to the invoking user
    rec = session.Record.load(name)
    assert (project / "renamed.txt").stat().st_uid == rec.uid


def test_second_pull_is_idempotent(cli: Cli, name: str, project: Path) -> None:
    before = tree.scan(project)
    r = cli.run("pull", name, "--yes")
    assert r.returncode == 3
    assert b"0 applied" in r.stderr
    assert tree.scan(project) == before


def test_risky_file_applied_only_when_asked_and_without_setuid(cli: Cli, name: str, project: Path) -> None:
    r = cli.run("pull", name, "--yes", "--include-risky", "setuid.sh")
    assert r.returncode == 3, r.stderr.decode()  # the hook and the config are still pending
    assert (project / "setuid.sh").stat().st_mode & 0o7777 == 0o755
    assert not (project / ".git/hooks/pre-commit").exists()


def test_pull_killed_midway_then_rerun(cli: Cli, name: str, project: Path) -> None:
    make = "mkdir many && for i in $(seq 1 40); do head -c 100000 /dev/urandom > many/f$i; done"
    assert cli.run("exec", name, "--", "sh", "-c", make).returncode == 0
    hashes = cli.run("exec", name, "--", "sh", "-c", "cd many && sha256sum *").stdout.decode()
    want = {line.split()[1]: line.split()[0] for line in hashes.splitlines()}
    killed = cli.run("pull", name, "--yes", "many", env=cli.env(VMSANDBOX_TEST_KILL_PULL_AFTER="15"))
    assert killed.returncode == -9
    present = {p.name: sha(p) for p in (project / "many").iterdir()}
    assert 0 < len(present) < 40
    assert all(want[n] == h for n, h in present.items())  # every file old (absent) or new, never partial
    again = cli.run("pull", name, "--yes", "many")
    assert again.returncode == 3  # the quarantined hook is still pending elsewhere
    assert {p.name: sha(p) for p in (project / "many").iterdir()} == want


def test_push_sends_host_edits_without_clobbering(cli: Cli, name: str, project: Path) -> None:
    (project / "keep.txt").write_text("edited on the host\n")
    (project / "modify.txt").write_text("host wins here\n")
    assert cli.run("exec", name, "--", "sh", "-c", "echo guest-again >> modify.txt").returncode == 0
    r = cli.run("push", name)
    assert r.returncode == 3  # modify.txt changed on both sides
    assert b"conflict" in r.stderr and b"modify.txt" in r.stderr
    out = cli.run("exec", name, "--", "cat", "keep.txt", "modify.txt").stdout.decode()
    assert out == "edited on the host\nbase\nguest\nguest-again\n"


class Terminal:
    """Drive a command on a real pseudo-terminal, as a person at a keyboard would."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: exec the command on the terminal
            os.execve(argv[0], argv, {**env, "COLUMNS": "200", "TERM": "xterm"})  # noqa: S606
        self.seen = b""

    def expect(self, text: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while text.encode() not in self.seen:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"never saw {text!r}; the terminal showed:\n{self.seen.decode(errors='replace')}")
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                try:
                    chunk = os.read(self.fd, 65536)
                except OSError:  # the child closed the terminal
                    chunk = b""
                if not chunk:
                    raise AssertionError(f"ended before {text!r}:\n{self.seen.decode(errors='replace')}")
                self.seen += chunk

    def send(self, keys: str) -> None:
        self.seen = b""
        os.write(self.fd, keys.encode())

    def wait(self) -> int:
        with contextlib.suppress(OSError):
            while os.read(self.fd, 65536):
                pass
        _, status = os.waitpid(self.pid, 0)
        return os.waitstatus_to_exitcode(status)


def test_interactive_review_on_a_terminal(cli: Cli, name: str, project: Path) -> None:
    script = (
        "echo one > ia.txt; echo two > ib.txt; "
        "git -c safe.directory='*' -c user.email=a@vm -c user.name=a commit -q --allow-empty -m interactive"
    )
    assert cli.run("exec", name, "--", "sh", "-c", script).returncode == 0
    term = Terminal(cli.argv("pull", name, "ia.txt", "ib.txt"), cli.env())
    term.expect("added ia.txt")
    term.expect("[y/n/d/a/q]")
    term.send("d\n")  # show the diff first
    term.expect("+one")
    term.expect("[y/n/d/a/q]")
    term.send("y\n")
    term.expect("added ib.txt")
    term.expect("[y/n/d/a/q]")
    term.send("n\n")
    term.expect("commits")  # the guest's commits: fetch them?
    term.send("y\n")
    term.expect("interactive")  # the review lists the new commit
    assert term.wait() == 3  # ib.txt was skipped: still unsynced
    assert (project / "ia.txt").read_text() == "one\n"
    assert not (project / "ib.txt").exists()
    assert git(project, "log", "--format=%s", "-1", f"refs/remotes/vmsandbox-{name}/main").strip() == "interactive"


def test_destroy_refuses_then_force_exports_and_recover_restores(cli: Cli, name: str, project: Path) -> None:
    assert cli.run("exec", name, "--", "sh", "-c", "echo late > late.txt").returncode == 0
    refused = cli.run("destroy", name)
    assert refused.returncode == 125
    assert b"unsynced change" in refused.stderr and b"destroy --force" in refused.stderr
    assert "late.txt" in cli.run("diff", name, "--stat").stdout.decode()
    forced = cli.run("destroy", name, "--force")
    assert forced.returncode == 0, forced.stderr.decode()
    rows = [row for row in cli.ls() if row["name"] == name]
    assert rows and rows[0]["state"] == "exported"
    box = paths.session_paths(name).outbox
    assert box.stat().st_mode & 0o077 == 0
    assert "late.txt" in (box / "changes.patch").read_text()
    assert json.loads((box / "manifest.json").read_text())["late.txt"]["kind"] == "file"
    with Hypervisor(session.Record.load(name).libvirt_uri) as hv:
        assert hv.info(session.DOMAIN_PREFIX + name) is None
    rec = cli.run("recover", name, "--yes")
    assert rec.returncode == 3, rec.stderr.decode()  # the quarantined ones remain
    assert (project / "late.txt").read_text() == "late\n"
    gone = cli.run("destroy", name, "--discard")
    assert gone.returncode == 0
    assert_gone(name)
