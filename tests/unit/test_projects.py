"""What may be a project (session/start/project.py), checked where every front end's session is made: the
system's trees (by device and inode, whatever path leads there), /home, any account's home, a tree with a
directory another account owns or every account can write — for root too, whose account owns the system."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from vmsandbox import sudo
from vmsandbox.confine import access, beneath, rights
from vmsandbox.errors import VmsandboxError
from vmsandbox.session.start import project

AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another account")


@pytest.mark.parametrize(
    ("where", "said"),
    [
        ("/etc", "it is the system's /etc"),
        ("/etc/ssh", "it is inside the system's /etc"),  # `POST /vmsandbox/v1/sessions {"project": "/etc/ssh"}`
        ("/usr", "it is the system's /usr"),
        ("/boot", "the system's /boot"),
        ("/run", "the system's /run"),
        ("/var/lib", "it is inside the system's /var"),
        ("/proc/self", "inside the system's /proc"),
        ("/sys", "the system's /sys"),
        ("/dev", "the system's /dev"),
        ("/home", "where accounts' homes are made"),
        ("/", "too broad"),
    ],
)
def test_the_systems_trees_are_nobodys_project_not_even_roots(where: str, said: str) -> None:
    """The audit's list for a root `serve` (issue 57): each was a project before."""
    if not Path(where).is_dir():
        pytest.skip(f"no {where} here")
    with pytest.raises(VmsandboxError, match="refusing to sandbox") as refused:
        project.validate_project(Path(where))
    assert said in refused.value.message and refused.value.hint


def test_a_system_tree_is_known_by_what_it_is_not_by_its_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tree is the system's by device and inode: held under another name (as a bind mount would be), inside
    the project or around it, it is refused all the same; the one open tree inside (FHS's /var/tmp) is not."""
    conf = tmp_path / "proj" / "conf"
    (conf / "sub").mkdir(parents=True)
    (tmp_path / "etc").symlink_to(conf)  # the system's /etc, as the kernel would know it
    (tmp_path / "var" / "tmp" / "p").mkdir(parents=True)
    (tmp_path / "var" / "lib" / "p").mkdir(parents=True)
    monkeypatch.setattr(project, "SYSTEM_TREES", (str(tmp_path / "etc"), str(tmp_path / "var")))
    monkeypatch.setattr(project, "OPEN_TREES", (str(tmp_path / "var" / "tmp"),))
    with pytest.raises(VmsandboxError, match=rf"holds the system's {tmp_path / 'etc'} \(at {conf}\)"):
        project.validate_project(tmp_path / "proj")
    with pytest.raises(VmsandboxError, match="it is inside the system's"):
        project.validate_project(conf / "sub")
    with pytest.raises(VmsandboxError, match="it is inside the system's"):
        project.validate_project(tmp_path / "var" / "lib" / "p")
    assert project.validate_project(tmp_path / "var" / "tmp" / "p") == (tmp_path / "var" / "tmp" / "p").resolve()


def test_a_tree_another_account_owns_any_directory_of_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The person's is the top and every directory in it: the error names the first that is not, whose it is,
    and the fix."""
    mine = tmp_path / "proj"
    (mine / "src").mkdir(parents=True)
    assert project.validate_project(mine) == mine.resolve()
    monkeypatch.setattr(project, "person_uid", lambda: os.geteuid() + 4242)  # (as another account sees the tree)
    with pytest.raises(VmsandboxError, match=rf"it is owned by .*uid {os.geteuid()}\), not by you") as refused:
        project.validate_project(mine)
    assert refused.value.hint is not None and f"chown -R {os.geteuid() + 4242} {mine}" in refused.value.hint


@AS_ROOT
def test_another_accounts_ssh_at_any_depth_is_refused(tmp_path: Path) -> None:
    keys = tmp_path / "proj" / "backup" / "alice" / ".ssh"
    keys.mkdir(parents=True)
    os.chown(keys, 4242, 4242)
    with pytest.raises(VmsandboxError, match=rf"{keys} is owned by .*4242.*not by you"):
        project.validate_project(tmp_path / "proj")
    os.chown(keys, os.geteuid(), os.getegid())
    assert project.validate_project(tmp_path / "proj") == (tmp_path / "proj").resolve()


def test_under_sudo_the_tree_must_be_the_invokers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`sudo vmsandbox run DIR` takes DIR for the person who ran sudo: a tree of root's (or anyone else's) is not
    theirs to hand to a guest."""
    invoker = pwd.struct_passwd(("alice", "x", os.geteuid() + 4242, 1234, "", "/nonexistent", "/bin/sh"))
    monkeypatch.setattr(sudo, "invoker", lambda: invoker)
    (tmp_path / "proj").mkdir()
    with pytest.raises(VmsandboxError, match=r"owned by root \(uid 0\), not by you \(alice\)"):
        project.validate_project(tmp_path / "proj")


def test_a_tree_every_account_writes_in_is_refused(tmp_path: Path) -> None:
    """What another account can put in it (a file, a link to its own) is not the person's: /tmp, /var/tmp,
    /dev/shm, and any directory left writable by all."""
    shared = tmp_path / "proj" / "drop"
    shared.mkdir(parents=True)
    shared.chmod(0o1777)
    with pytest.raises(VmsandboxError, match=rf"{shared} is writable by every account \(mode 1777\)") as refused:
        project.validate_project(tmp_path / "proj")
    assert refused.value.hint is not None and f"chmod o-w {shared}" in refused.value.hint
    with pytest.raises(VmsandboxError, match=r"it is writable by every account \(mode 1777\)") as refused:
        project.validate_project(shared)  # (a /tmp of its own: a directory of one's own in it is the fix)
    assert refused.value.hint is not None and f"mkdir -m 700 {shared}/NAME" in refused.value.hint
    shared.chmod(0o777)
    with pytest.raises(VmsandboxError, match="writable by every account") as refused:
        project.validate_project(tmp_path / "proj")
    assert refused.value.hint is not None and f"chmod o-w {shared}" in refused.value.hint
    shared.chmod(0o755)
    assert project.validate_project(tmp_path / "proj") == (tmp_path / "proj").resolve()


def test_a_tree_holding_any_accounts_home_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bob = pwd.struct_passwd(("bob", "x", os.geteuid() + 17, 17, "", str(tmp_path / "homes" / "bob"), "/bin/sh"))
    (tmp_path / "homes" / "bob").mkdir(parents=True)
    monkeypatch.setattr(pwd, "getpwall", lambda: [bob])
    for broad in (tmp_path / "homes", tmp_path / "homes" / "bob"):
        with pytest.raises(VmsandboxError, match=rf"it holds the home of bob \({tmp_path / 'homes' / 'bob'}\)"):
            project.validate_project(broad)


def test_a_plain_account_may_keep_a_directory_root_made_in_its_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`sudo make install` left `build/` root's: a person running as themselves reads there only what the kernel
    lets them, so it is no other account's tree; under sudo (euid 0) the same directory is refused."""
    mine = tmp_path / "proj"
    (mine / "build").mkdir(parents=True)
    me = os.geteuid() + 4242
    monkeypatch.setattr(project, "person_uid", lambda: me)
    monkeypatch.setattr(os, "geteuid", lambda: me)
    monkeypatch.setattr(project, "_identity", lambda path: None)  # (no system tree matched by a stand-in uid)
    owners = {mine.stat().st_ino: me, (mine / "build").stat().st_ino: 0}
    real = os.fstat

    def fstat(fd: int) -> os.stat_result:  # (the check reads each directory's owner from its descriptor)
        st = real(fd)
        fields = list(st)
        fields[4] = owners.get(st.st_ino, me)
        return os.stat_result(fields)

    monkeypatch.setattr(os, "fstat", fstat)
    with beneath.Root.open(mine) as top:
        project._all_the_persons(top, {})
        monkeypatch.setattr(os, "geteuid", lambda: 0)
        with pytest.raises(VmsandboxError, match=r"build is owned by root \(uid 0\)"):
            project._all_the_persons(top, {})


OTHER = 4242  # an account that is not the one running the tests (nor root)


def _group_of_two(monkeypatch: pytest.MonkeyPatch, gid: int) -> None:
    """The group gid has another member than the person (and root): as a team's group has."""
    me = project.person_uid()
    monkeypatch.setattr(rights, "members", lambda g: {me, OTHER} if g == gid else {me})


def test_a_project_whose_parent_another_account_of_its_group_may_write_is_refused_unless_sticky(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """F1: the project in a team directory (`root:team 2775`): a member of the team could put a link to root's files
    in its place between the check and the copy. Refused, and the fix said; sticky, only the entry's owner may rename
    it, so it is the person's project for good."""
    team = tmp_path / "team"
    mine = team / "alice"
    mine.mkdir(parents=True)
    team.chmod(0o2775)
    _group_of_two(monkeypatch, team.stat().st_gid)
    said = rf"{team} can be changed by the group .*uid {OTHER}.*something else at {mine}"
    with pytest.raises(VmsandboxError, match=said) as refused:
        project.validate_project(mine)
    assert refused.value.hint is not None and f"chmod +t {team}" in refused.value.hint
    team.chmod(0o3775)
    assert project.validate_project(mine) == mine.resolve()
    monkeypatch.setattr(rights, "members", lambda g: {project.person_uid()})  # (a group of one's own: theirs alone)
    team.chmod(0o2775)
    assert project.validate_project(mine) == mine.resolve()


def test_a_directory_in_the_project_that_another_account_may_write_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """F1, in the project: a directory of the person's that a group with other members, or an ACL entry, lets another
    account write (rename a subdirectory for a link while the copy runs). A group of the person's own is theirs."""
    mine = tmp_path / "proj"
    shared = mine / "shared"
    (shared / "sub").mkdir(parents=True)
    shared.chmod(0o2775)
    assert project.validate_project(mine) == mine.resolve()  # (the group is the person's own)
    _group_of_two(monkeypatch, shared.stat().st_gid)
    with pytest.raises(VmsandboxError, match=rf"{shared} can be changed by the group .*uid {OTHER}") as refused:
        project.validate_project(mine)
    assert refused.value.hint is not None and f"chmod g-w {shared}" in refused.value.hint
    shared.chmod(0o755)
    assert project.validate_project(mine) == mine.resolve()
    access.grant(shared / "sub", OTHER, 7)  # `setfacl -m u:OTHER:rwx`: the mode bits say nothing of it
    with pytest.raises(VmsandboxError, match=rf"{shared / 'sub'} can be changed by uid {OTHER} \(an ACL entry\)"):
        project.validate_project(mine)


@AS_ROOT
def test_a_project_in_another_accounts_directory_is_refused_sticky_or_not(tmp_path: Path) -> None:
    """Its owner may rename what is in it, sticky or not: no fix but to move the project."""
    theirs = tmp_path / "theirs"
    mine = theirs / "alice"
    mine.mkdir(parents=True)
    os.chown(theirs, OTHER, OTHER)
    for mode in (0o755, 0o1755):
        theirs.chmod(mode)
        with pytest.raises(VmsandboxError, match=rf"{theirs} can be changed by .*{OTHER}.* \(its owner\)") as refused:
            project.validate_project(mine)
        assert refused.value.hint is not None and "chmod +t" not in refused.value.hint


@AS_ROOT
def test_under_sudo_a_project_the_person_cannot_reach_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Root reaches a tree of the person's behind a directory they may not pass; they could not read it themselves,
    so vmsandbox does not read it for them."""
    invoker = pwd.struct_passwd(("vmsf1-alice", "x", OTHER, OTHER, "", "/nonexistent", "/bin/sh"))
    monkeypatch.setattr(sudo, "invoker", lambda: invoker)
    locked = tmp_path / "locked"
    mine = locked / "alice"
    mine.mkdir(parents=True)
    locked.chmod(0o700)
    os.chown(mine, OTHER, OTHER)
    with pytest.raises(VmsandboxError, match=r"you \(vmsf1-alice\) may not pass .*, above it") as refused:
        project.validate_project(mine)
    assert refused.value.hint


def test_the_project_is_checked_from_the_descriptor_it_is_opened_by(tmp_path: Path) -> None:
    """What `opened` hands over (to the capture) is the directory that was checked, whatever its path holds by then:
    the path swapped for a link to another tree changes nothing of it."""
    mine = tmp_path / "proj"
    (mine / "src").mkdir(parents=True)
    other = tmp_path / "other"
    (other / "loot").mkdir(parents=True)
    with project.opened(mine) as tree:
        assert tree.path == mine.resolve()
        mine.rename(tmp_path / "proj.old")
        mine.symlink_to(other)
        with os.scandir(tree.fd) as listed:
            assert [e.name for e in listed] == ["src"]
