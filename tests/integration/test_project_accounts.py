"""`sudo vmsandbox` on a project another account can reach (audit round 1, F1): a member of the project's team
swaps it, or what is in it, for a link to root's files between the check and the copy. With two real accounts:
the check refuses a way another account can change (and says the fix), and the capture copies as the person from
the descriptor the check walked, so it takes nothing of root's whatever is swapped, and fails where the person could
not read. Boots no VM; root makes the accounts and plays `sudo`."""

from __future__ import annotations

import grp
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from vmsandbox.confine import beneath
from vmsandbox.errors import VmsandboxError
from vmsandbox.paths import SessionPaths
from vmsandbox.session.start import project
from vmsandbox.sync.inward import capture

pytestmark = [pytest.mark.no_vm, pytest.mark.root("it makes two accounts and a group, and plays sudo")]

KEY = "ROOT-ONLY PRIVATE KEY MATERIAL"


@dataclass(frozen=True)
class Team:
    alice: pwd.struct_passwd  # the person who runs `sudo vmsandbox`
    bob: pwd.struct_passwd  # another member of the team
    team: Path  # root:TEAM 2775, the team's shared directory
    secret: Path  # a directory of root's only, holding KEY
    base: Path

    def as_bob(self, script: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["runuser", "-u", self.bob.pw_name, "--", "sh", "-c", script],
                              capture_output=True, text=True, check=False)  # fmt: skip

    def alices(self, name: str) -> Path:
        """A fresh project of alice's in the team directory, holding README."""
        mine = self.team / name
        mine.mkdir()
        (mine / "README").write_text("hello\n")
        for p in (mine, mine / "README"):
            os.chown(p, self.alice.pw_uid, self.alice.pw_gid)
        return mine


@pytest.fixture
def team(monkeypatch: pytest.MonkeyPatch) -> Iterator[Team]:
    tag = secrets.token_hex(3)
    group, names = f"vmsf1t{tag}", (f"vmsf1a{tag}", f"vmsf1b{tag}")
    base = Path(tempfile.mkdtemp(prefix="vmsandbox-f1-", dir="/var/tmp"))  # (alice must pass it)
    try:
        subprocess.run(["groupadd", group], check=True)
        for name in names:
            subprocess.run(["useradd", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/bin/sh",
                            "-G", group, name], check=True)  # fmt: skip
        base.chmod(0o755)
        shared = base / "team"
        shared.mkdir()
        os.chown(shared, 0, grp.getgrnam(group).gr_gid)
        shared.chmod(0o2775)
        secret = base / "secret"
        secret.mkdir(mode=0o700)
        (secret / "ssh_host_ed25519_key").write_text(KEY + "\n")
        alice, bob = (pwd.getpwnam(n) for n in names)
        monkeypatch.setenv("SUDO_USER", alice.pw_name)  # root runs as `sudo vmsandbox` would, for alice
        monkeypatch.setenv("SUDO_UID", str(alice.pw_uid))
        monkeypatch.setenv("SUDO_GID", str(alice.pw_gid))
        yield Team(alice, bob, shared, secret, base)
    finally:
        for name in names:
            subprocess.run(["userdel", name], check=False, capture_output=True)
        subprocess.run(["groupdel", group], check=False, capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def test_a_team_directory_is_no_way_to_a_project_unless_it_is_sticky(team: Team) -> None:
    mine = team.alices("alice")
    with pytest.raises(VmsandboxError, match=rf"{team.team} can be changed by the group .*{team.bob.pw_name}") as no:
        project.validate_project(mine)
    assert no.value.hint is not None and f"chmod +t {team.team}" in no.value.hint
    team.team.chmod(0o3775)
    with project.opened(mine) as tree:
        swap = team.as_bob(f"cd {team.team} && mv alice alice.old && ln -s {team.secret} alice")
        assert swap.returncode != 0 and "Operation not permitted" in swap.stderr  # (sticky: alice's entry stays)
        files = SessionPaths(team.base / "session")
        files.root.mkdir(mode=0o700)
        (mine / ".vmsandboxignore").write_text("notes/\n")
        (mine / "notes").mkdir()
        manifest = capture.capture(tree, files)
    assert sorted(manifest) == [".vmsandboxignore", "README"]
    assert (files.baseline / "README").stat().st_uid == team.alice.pw_uid  # (copied by alice's own process)


def test_the_capture_copies_as_the_person_from_the_checked_descriptor(team: Team) -> None:
    """Were the check to miss a way (skipped here), the copy still takes nothing of root's: it reads the directory
    that was opened, whatever its path holds by then, as alice, who may not read root's files."""
    mine = team.alices("alice")
    dest = team.base / "copy"
    with beneath.Root.open(mine) as tree:
        swap = team.as_bob(f"cd {team.team} && mv alice alice.old && ln -s {team.secret} alice")
        assert swap.returncode == 0, swap.stderr
        dest.mkdir(mode=0o700)
        capture.copy_tree(tree, dest)
    assert sorted(p.name for p in dest.iterdir()) == ["README"]
    mine = team.alices("alice2")
    (mine / "roots").write_text(KEY + "\n")  # in alice's tree, but hers to read no more than root's other files
    (mine / "roots").chmod(0o600)
    shutil.rmtree(dest)
    dest.mkdir(mode=0o700)
    with beneath.Root.open(mine) as tree, pytest.raises(VmsandboxError, match=r"roots.*Permission denied") as failed:
        capture.copy_tree(tree, dest)
    assert failed.value.hint is not None and f"readable by you ({team.alice.pw_name})" in failed.value.hint
    assert not any(KEY in p.read_text() for p in dest.rglob("*") if p.is_file())
