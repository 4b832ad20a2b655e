"""Under sudo, root reads a person's files for them only where they could read them (confine.rights): the
project's config files, the credential scan, its blueprints, the ignore file and what a blueprint copies from the
home; none of them through a link on the way (audit round 1, F1). The copy itself runs as the person: the no-VM
integration test (tests/integration/test_workspace.py) sees that with a second account."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from vmsandbox import trust
from vmsandbox.confine import access, rights
from vmsandbox.confine.accounts import Identity
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest.bootfiles import Bundle, GuestUser
from vmsandbox.image import blueprint
from vmsandbox.sync.inward import leftout
from vmsandbox.sync.scan import credentials

ALICE = Identity(4242, 4242, (4242,), "alice", "/nonexistent")  # who ran sudo: not the account running the tests


@pytest.fixture
def under_sudo(monkeypatch: pytest.MonkeyPatch) -> Identity:
    monkeypatch.setattr(rights, "person", lambda: ALICE)
    return ALICE


def _tree(top: Path, files: dict[str, tuple[str, int]]) -> Path:
    """Directories every account may pass and list, and `files` (text, mode)."""
    for rel, (text, mode) in files.items():
        (top / rel).parent.mkdir(parents=True, exist_ok=True)
        (top / rel).write_text(text)
        (top / rel).chmod(mode)
    for d in [top, *(p for p in top.rglob("*") if p.is_dir() and not p.is_symlink())]:
        d.chmod(0o755)
    return top


def test_what_the_person_may_do_is_read_from_the_mode_and_the_acl(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("x")
    f.chmod(0o640)
    fd = os.open(f, os.O_RDONLY)
    try:
        assert not rights.may(fd, ALICE, rights.READ)
        assert rights.may(fd, Identity(4242, f.stat().st_gid, ()), rights.READ)  # (its group may read)
        access.grant(f, ALICE.uid, 4)
        assert rights.may(fd, ALICE, rights.READ) and not rights.may(fd, ALICE, rights.WRITE)
    finally:
        os.close(fd)


@pytest.mark.usefixtures("under_sudo")
def test_a_project_config_the_person_may_not_read_is_refused(tmp_path: Path) -> None:
    """`sudo vmsandbox run`: root would parse (and show the errors of) a file the person cannot read."""
    proj = _tree(tmp_path / "proj", {".vmsandbox.yaml": ("cpus: 2\n", 0o600)})
    with pytest.raises(VmsandboxError, match=r"you \(alice\) may not read it") as refused:
        trust.read_project_file(proj / ".vmsandbox.yaml", proj)
    assert refused.value.hint
    (proj / ".vmsandbox.yaml").chmod(0o644)
    assert trust.read_project_file(proj / ".vmsandbox.yaml", proj) == b"cpus: 2\n"
    (proj / ".vmsandbox").mkdir(mode=0o700)  # a directory on the way they may not pass
    (proj / ".vmsandbox" / "blueprints").mkdir(mode=0o755)
    (proj / ".vmsandbox" / "blueprints" / "b.yaml").write_text("extends: base\n")
    (proj / ".vmsandbox" / "blueprints" / "b.yaml").chmod(0o644)
    with pytest.raises(VmsandboxError, match=r"you \(alice\) may not read it"):
        trust.read_project_file(proj / ".vmsandbox" / "blueprints" / "b.yaml", proj)
    with pytest.raises(VmsandboxError, match=r"you \(alice\) may not read it"):
        blueprint.available(proj)


def test_the_projects_blueprints_are_not_listed_through_a_link(tmp_path: Path) -> None:
    """A `.vmsandbox` that is a link lists nothing where it leads (reading one of its files says why)."""
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "blueprints").mkdir(parents=True)
    (elsewhere / "blueprints" / "theirs.yaml").write_text("extends: base\n")
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / ".vmsandbox").symlink_to(elsewhere)
    assert "theirs" not in blueprint.available(proj)
    (proj / ".vmsandbox").unlink()
    elsewhere.rename(proj / ".vmsandbox")
    assert "theirs" in blueprint.available(proj)


def test_the_credential_scan_reads_only_what_the_person_may(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, under_sudo: Identity
) -> None:
    read: dict[str, bytes] = {}

    def scan(contents: dict[str, bytes], *, jailed: bool) -> dict[str, list[str]]:
        read.update(contents)
        return {}

    monkeypatch.setattr(credentials, "scan", scan)
    proj = _tree(tmp_path / "proj", {"ok.yaml": ("a: 1\n", 0o644), "roots.yaml": ("token: x\n", 0o600),
                                     "closed/in.yaml": ("b: 2\n", 0o644)})  # fmt: skip
    (proj / "closed").chmod(0o711)  # they may pass it, not list it
    (proj / "linked").symlink_to(tmp_path)  # never walked
    assert leftout.credentials_in(proj) == []
    assert sorted(read) == ["ok.yaml"]


def test_the_ignore_file_is_read_from_the_copy_and_a_link_out_of_it_is_refused(tmp_path: Path) -> None:
    """The capture reads `.vmsandboxignore` from its copy of the project (made with the person's rights); a link to
    a file of the project is read there, one that leads out is refused (what it names is not the project's)."""
    outside = tmp_path / "outside"
    outside.write_text("secrets/\n")
    copy = tmp_path / "copy"
    copy.mkdir()
    assert leftout.ignore_spec(copy, Path("/p")) is None
    (copy / ".gitignore").write_text("*.log\n")
    (copy / leftout.IGNORE_FILE).symlink_to(".gitignore")
    spec = leftout.ignore_spec(copy, Path("/p"))
    assert spec is not None and spec.match_file("a.log")
    (copy / leftout.IGNORE_FILE).unlink()
    (copy / leftout.IGNORE_FILE).symlink_to(outside)
    with pytest.raises(VmsandboxError, match=r"/p/\.vmsandboxignore is a link that leads out of the project") as err:
        leftout.ignore_spec(copy, Path("/p"))
    assert err.value.hint is not None and "cp --remove-destination" in err.value.hint


def _copied(home: Path, *items: str) -> set[str]:
    bundle = Bundle(GuestUser("alice", 4242, 4242))
    for item in items:
        bundle.copy_from_home(home, item)
    with tarfile.open(fileobj=io.BytesIO(bundle.close())) as tar:
        return {m.name for m in tar.getmembers() if m.isfile()}


def test_what_a_blueprint_copies_from_the_home_is_never_read_through_a_link(tmp_path: Path) -> None:
    """`copy: [~/.claude/settings.json]` with `~/.claude` a link to root's: nothing is copied."""
    theirs = _tree(tmp_path / "theirs", {"settings.json": ("root's\n", 0o600)})
    home = tmp_path / "home"
    home.mkdir()
    (home / ".claude").symlink_to(theirs)
    assert _copied(home, "~/.claude/settings.json", "~/.claude") == set()
    (home / ".claude").unlink()
    _tree(home / ".claude", {"settings.json": ("{}\n", 0o644)})
    assert _copied(home, "~/.claude/settings.json") == {"home/alice/.claude/settings.json"}


@pytest.mark.usefixtures("under_sudo")
def test_under_sudo_a_blueprint_copies_from_the_home_only_what_the_person_may_read(tmp_path: Path) -> None:
    home = _tree(tmp_path / "home", {".claude/settings.json": ("{}\n", 0o644), ".claude/root.json": ("x\n", 0o600),
                                     ".claude/closed/in.md": ("y\n", 0o644)})  # fmt: skip
    (home / ".claude" / "closed").chmod(0o711)
    assert _copied(home, "~/.claude", "~/.claude/root.json") == {"home/alice/.claude/settings.json"}
