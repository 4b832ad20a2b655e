"""Without sudo: QEMU's way through a user's directories (ACL entries), the shared store, pins of other
accounts, per-account domain names, and libvirtd's group configuration."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from vmsandbox.confine import access
from vmsandbox.errors import VmsandboxError
from vmsandbox.session import record
from vmsandbox.session.place import pins
from vmsandbox.vm import hostsetup

QEMU = 64055  # an account that is not us
OTHER = 64056


def test_a_private_directory_lets_qemu_through_after_a_grant_and_nobody_else(tmp_path: Path) -> None:
    d = tmp_path / "home"
    d.mkdir(mode=0o750)
    d.chmod(0o750)
    assert not access.may(d, QEMU, set(), 1)
    access.grant(d, QEMU, 1)
    assert access.may(d, QEMU, set(), 1)
    assert not access.may(d, QEMU, set(), 4)  # traverse, never list
    assert not access.may(d, OTHER, set(), 1)
    assert stat.S_IMODE(d.stat().st_mode) & 0o707 == 0o700  # the owner's and others' bits are as they were
    assert access.may(d, OTHER, {d.stat().st_gid}, 1)  # the group keeps its r-x: the mask grew, never shrank
    access.grant(d, QEMU, 4)  # a second grant adds to the entry
    assert access.may(d, QEMU, set(), 5)


@pytest.fixture
def only_under_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Directories above tmp_path count as passable: the test never changes pytest's own."""
    real = access.may
    monkeypatch.setattr(access, "may", lambda p, *a: real(p, *a) if p.is_relative_to(tmp_path) else True)


@pytest.mark.usefixtures("only_under_tmp")
def test_let_traverse_changes_only_what_blocks(tmp_path: Path) -> None:
    top = tmp_path / "a"
    (top / "b" / "c").mkdir(parents=True)
    for p in (tmp_path, top, top / "b", top / "b" / "c"):
        p.chmod(0o755)
    (top / "b").chmod(0o700)
    changed = access.let_traverse(top / "b" / "c", QEMU, set(), "QEMU")
    assert changed == [top / "b"]
    assert access.let_traverse(top / "b" / "c", QEMU, set(), "QEMU") == []  # once is enough


@pytest.mark.usefixtures("only_under_tmp")
def test_a_directory_of_someone_else_that_blocks_is_an_error_that_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "theirs"
    (blocked / "mine").mkdir(parents=True)
    tmp_path.chmod(0o755)
    blocked.chmod(0o700)
    real = Path.stat

    def owned_by_another(self: Path, **kw: bool) -> os.stat_result:
        st = real(self, **kw)
        if self == blocked:
            return os.stat_result((st.st_mode, *tuple(st)[1:4], OTHER, *tuple(st)[5:]))
        return st

    monkeypatch.setattr(Path, "stat", owned_by_another)
    with pytest.raises(VmsandboxError) as err:
        access.let_traverse(blocked / "mine", QEMU, set(), "libvirt's QEMU")
    assert str(blocked) in err.value.message and "VMSANDBOX_STATE_DIR" in (err.value.hint or "")


def test_the_traverse_only_acl_is_what_the_kernel_takes(tmp_path: Path) -> None:
    d = tmp_path / "s"
    d.mkdir()
    os.setxattr(d, access.ACL_XATTR, access.traverse_only_acl([QEMU, OTHER]))
    assert access.may(d, QEMU, set(), 1) and access.may(d, OTHER, set(), 1)
    assert not access.may(d, QEMU, set(), 4)
    assert stat.S_IMODE(d.stat().st_mode) == 0o710  # owner rwx, the mask (x) in the group bits, others none


def test_shared_store_directories_and_their_locks(tmp_path: Path, isolated_dirs: Path) -> None:
    images = isolated_dirs / "data" / "images"
    access.store_root(images)
    assert stat.S_IMODE(images.parent.stat().st_mode) == 0o755
    with access.flocked(images / ".lock") as held:
        assert held
        assert stat.S_IMODE((images / ".lock").stat().st_mode) == 0o664  # every member takes it
        with access.flocked(images / ".lock") as again:
            assert not again  # another open file description: the lock is held


def test_pins_of_other_accounts_are_read_and_ours_are_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VMSANDBOX_DATA_DIR", str(tmp_path))
    (tmp_path / "images").mkdir()
    pins.pin("mine", "base-1", "/t/1")
    pin_dir = tmp_path / "images" / pins.DIR
    assert stat.S_IMODE((pin_dir / f"{os.geteuid()}.mine").stat().st_mode) == 0o644
    assert pins.of_others() == []
    (pin_dir / f"{OTHER}.exp1").write_text(json.dumps({"image": "base-1", "template": "/t/1"}))
    (pin_dir / f"{OTHER}.broken").write_text("{")
    (pin_dir / "nonsense").write_text("{}")
    assert pins.of_others() == [pins.Pin(OTHER, "exp1", "base-1", "/t/1")]
    pins.unpin("mine")
    assert not (pin_dir / f"{os.geteuid()}.mine").exists()


def test_gc_drops_only_our_pins_whose_session_directory_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VMSANDBOX_DATA_DIR", str(tmp_path))
    from vmsandbox import paths

    (tmp_path / "images").mkdir()
    paths.session_paths("alive").root.mkdir(parents=True)
    pins.pin("alive", "base-1", None)
    pins.pin("gone", "base-1", None)
    pin_dir = tmp_path / "images" / pins.DIR
    (pin_dir / f"{OTHER}.theirs").write_text(json.dumps({"image": "base-1", "template": None, "dir": "/nonexistent"}))
    assert pins.collect() == ["gone"]
    assert sorted(p.name for p in pin_dir.iterdir()) == sorted([f"{os.geteuid()}.alive", f"{OTHER}.theirs"])


def test_domain_names_carry_the_uid_of_an_unprivileged_account(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert record.domain_name("exp1") == "vmsandbox-exp1"
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert record.domain_name("exp1") == "vmsandbox-u1000-exp1"


def test_libvirtd_gets_the_group_socket_in_place_of_the_system_settings() -> None:
    system = '# comment\nunix_sock_group = "wheel"\nlisten_tls = 0\nauth_unix_rw="polkit"\n'
    conf = hostsetup.group_access_conf(system)
    lines = conf.splitlines()
    assert "listen_tls = 0" in lines and "# comment" in lines
    assert 'unix_sock_group = "libvirt"' in lines and 'unix_sock_rw_perms = "0770"' in lines
    assert 'auth_unix_rw = "none"' in lines
    assert 'unix_sock_group = "wheel"' not in lines and 'auth_unix_rw="polkit"' not in lines


def test_the_guest_data_account_comment_is_one_useradd_takes() -> None:
    assert ":" not in hostsetup.ACCOUNT_COMMENT and "\n" not in hostsetup.ACCOUNT_COMMENT  # GECOS fields


@pytest.mark.skipif(os.geteuid() != 0, reason="sudo means root")
def test_under_sudo_config_and_secrets_are_the_invoking_users(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pwd
    import shutil
    import tempfile

    from vmsandbox import paths
    from vmsandbox.egress import secrets

    place = Path(tempfile.mkdtemp(prefix="vmsandbox-unit-", dir="/var/tmp"))  # (pytest's is private to root)
    place.chmod(0o755)
    home = place / "home"
    home.mkdir()
    os.chown(home, OTHER, OTHER)  # a home is its user's: under sudo, what is written there is written as them
    fake = pwd.struct_passwd(("dev", "x", OTHER, OTHER, "", str(home), "/bin/sh"))
    real = pwd.getpwnam
    monkeypatch.setattr(pwd, "getpwnam", lambda name: fake if name == "dev" else real(name))
    monkeypatch.delenv("VMSANDBOX_CONFIG_DIR", raising=False)
    monkeypatch.setenv("SUDO_USER", "dev")
    monkeypatch.setenv("SUDO_UID", str(OTHER))
    assert paths.config_dir() == home / ".config" / "vmsandbox"
    secrets.put("anthropic-api-key", "sk-test")
    made = [
        home / ".config",
        home / ".config" / "vmsandbox",
        secrets.directory(),
        secrets.directory() / "anthropic-api-key",
    ]
    assert [(p.stat().st_uid, p.stat().st_gid) for p in made] == [(OTHER, OTHER)] * 4  # theirs, readable without sudo
    assert secrets.get("anthropic-api-key") == "sk-test"
    # a link their account planted (a kept login's directory, a secrets directory) leads nowhere: what root
    # writes there it writes as them, and a kept login is written without following any link
    from vmsandbox.errors import VmsandboxError
    from vmsandbox.image.blueprint import Blueprint
    from vmsandbox.session.running import logins

    victim = place / "root-only"
    victim.mkdir(mode=0o755)
    (paths.config_dir() / logins.LOGINS_DIR).mkdir()
    os.chown(paths.config_dir() / logins.LOGINS_DIR, OTHER, OTHER)
    logins.store("claude").symlink_to(victim)
    bp = Blueprint(name="claude", source="x", login_files=(".claude/.credentials.json",))
    with pytest.raises(VmsandboxError, match="not a directory of your config"):
        logins.keep(bp, {".claude/.credentials.json": b"{}"})
    assert list(victim.iterdir()) == [] and stat.S_IMODE(victim.stat().st_mode) == 0o755
    shutil.rmtree(secrets.directory())
    secrets.directory().symlink_to(victim)
    with pytest.raises(PermissionError):
        secrets.put("openai-api-key", "sk-other")
    assert list(victim.iterdir()) == []
    assert os.geteuid() == 0 and os.getegid() == 0  # root again afterwards
    monkeypatch.setenv("SUDO_UID", "12")  # SUDO_USER and SUDO_UID disagree: not trusted, root's own dir
    assert paths.config_dir() != home / ".config" / "vmsandbox"
    shutil.rmtree(place)


def test_state_directories_made_before_the_guest_data_account_existed_let_it_through_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh host's first command is `host setup`, which makes the state directories before it makes the
    guest-data account: once it exists, the next command must let it through (every root pull failed)."""
    from vmsandbox.confine import accounts

    monkeypatch.setenv("VMSANDBOX_STATE_DIR", str(tmp_path / "new-state"))
    monkeypatch.setattr(accounts, "traversers", lambda: [QEMU])
    accounts.state_dirs()
    sessions = tmp_path / "new-state" / "sessions"
    assert access.may(sessions, QEMU, set(), 1) and not access.may(sessions, OTHER, set(), 1)
    monkeypatch.setattr(accounts, "traversers", lambda: [QEMU, OTHER])  # the account now exists
    accounts.state_dirs()
    for d in (tmp_path / "new-state", sessions):
        assert access.may(d, QEMU, set(), 1) and access.may(d, OTHER, set(), 1), d
        assert not access.may(d, OTHER, set(), 4)


def test_libvirtd_is_reaped_only_as_the_child_of_the_reaper(tmp_path: Path) -> None:
    def process(pid: int, comm: str, parent: int) -> None:
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "comm").write_text(comm + "\n")
        (tmp_path / str(pid) / "status").write_text(f"Name:\t{comm}\nPid:\t{pid}\nPPid:\t{parent}\n")

    process(1, "process_api", 0)  # an init that reaps orphans when it gets to them
    process(10, "tini", 1)
    process(11, "libvirtd", 10)
    process(20, "libvirtd", 1)  # `libvirtd -d`: daemonized, its parent PID 1
    assert hostsetup.reaped([11], tmp_path)
    assert not hostsetup.reaped([20], tmp_path)
    assert not hostsetup.reaped([11, 20], tmp_path)
    assert not hostsetup.reaped([99], tmp_path)  # gone meanwhile: not known to be reaped


def test_libvirtd_runs_in_the_foreground_under_a_subreaper() -> None:
    argv = hostsetup.libvirtd_argv("/usr/bin/tini")
    assert argv[:3] == ["/usr/bin/tini", "-s", "--"]  # -s: the subreaper of what libvirtd's QEMUs leave
    assert Path(argv[3]).name == "libvirtd" and "-d" not in argv
    assert argv[-2:] == ["--config", str(hostsetup.RUNTIME_CONF)]
