from __future__ import annotations

import os
import pwd
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

import vmsandbox.session.start.create
from vmsandbox import paths, pids, sudo
from vmsandbox.confine import rights
from vmsandbox.core import sessions
from vmsandbox.egress import control, policy
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest.bootfiles import GuestUser
from vmsandbox.guest.commands import remote_command
from vmsandbox.session import lock, record, state
from vmsandbox.session.running import reach
from vmsandbox.session.start import project

from .conftest import saved_record


def test_project_must_exist_and_be_a_directory(tmp_path: Path) -> None:
    with pytest.raises(VmsandboxError, match="does not exist"):
        project.validate_project(tmp_path / "nope")
    (tmp_path / "f").write_text("")
    with pytest.raises(VmsandboxError, match="not a directory"):
        project.validate_project(tmp_path / "f")
    assert project.validate_project(tmp_path) == tmp_path.resolve()


def test_vmsandbox_own_state_config_and_data_are_never_a_project(isolated_dirs: Path) -> None:
    """A project inside, or holding, vmsandbox's own state, config or data (every session's keys, mirrors,
    outboxes and the host's secrets) is refused; an API sandbox's own empty project is the one exception."""
    for own in ("state", "config", "data"):
        inside = isolated_dirs / own / "sessions" / "x"
        inside.mkdir(parents=True)
        with pytest.raises(VmsandboxError, match="is inside vmsandbox's own"):
            project.validate_project(inside)
    with pytest.raises(VmsandboxError, match="holds vmsandbox's own"):
        project.validate_project(isolated_dirs)
    mine = paths.sandbox_projects() / "base-1234abcd"
    mine.mkdir(parents=True)
    assert project.validate_project(mine) == mine.resolve()


def test_an_api_sandboxs_own_project_is_one_in_a_plain_accounts_local_state(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A plain account's state directory is ~/.local/state/vmsandbox: the empty project of an API sandbox of its own
    is made there (E2B's `Sandbox.create`), and is a project; nothing else under ~/.local is."""
    home = tmp_path / "alice"
    state = home / ".local" / "state" / "vmsandbox"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("VMSANDBOX_STATE_DIR", str(state))
    mine = paths.sandbox_projects() / "base-1234abcd"
    mine.mkdir(parents=True)
    assert project.validate_project(mine) == mine.resolve()
    for not_one in (state / "sessions" / "x", home / ".local" / "share" / "app"):
        not_one.mkdir(parents=True)
        with pytest.raises(VmsandboxError, match="refusing to sandbox"):
            project.validate_project(not_one)


def test_too_broad_projects_are_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(VmsandboxError, match="too broad"):
        project.validate_project(Path("/"))
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(VmsandboxError, match="too broad"):
        project.validate_project(tmp_path)


def test_a_home_above_or_around_the_project_is_refused_under_sudo_too(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`sudo vmsandbox run ~` names the invoking user's home, not root's; directories above a home, inside its key
    and config directories, and ones holding `.ssh` (a home by another name) are refused as well."""
    home = tmp_path / "home" / "alice"
    (home / ".ssh").mkdir(parents=True)
    (home / ".config" / "app").mkdir(parents=True)
    (home / "src" / "app" / ".config").mkdir(parents=True)  # a project's own .config (.NET tools): fine
    invoker = pwd.struct_passwd(("alice", "x", 1234, 1234, "", str(home), "/bin/sh"))
    monkeypatch.setattr(sudo, "invoker", lambda: invoker)
    monkeypatch.setattr(project, "person_uid", os.geteuid)  # (alice's tree is made by this account: homes here)
    monkeypatch.setattr(rights, "person", lambda: None)  # (and the kernel judges as this account: no way to check)
    for broad in (home, tmp_path / "home"):
        with pytest.raises(VmsandboxError, match="too broad"):
            project.validate_project(broad)
    for inside in (home / ".ssh", home / ".config" / "app"):
        with pytest.raises(VmsandboxError, match="holds your keys or config"):
            project.validate_project(inside)
    copy = tmp_path / "backup"
    (copy / ".gnupg").mkdir(parents=True)
    with pytest.raises(VmsandboxError, match=r"it holds \.gnupg, like a home directory") as err:
        project.validate_project(copy)
    assert err.value.hint is not None and "move" in err.value.hint
    assert project.validate_project(home / "src" / "app") == (home / "src" / "app").resolve()


@pytest.mark.parametrize("bad", ["", "UPPER", "-lead", "a b", "x" * 40, "../etc", "x\n", "x\r", "a/b", ".capture-x"])
def test_bad_names(bad: str) -> None:
    with pytest.raises(VmsandboxError, match="invalid session name"):
        record.validate_name(bad)


def test_a_session_is_opened_by_its_name_only(tmp_path: Path) -> None:
    """One way to open a session by name (issue 43): a name with a separator, a dot or a newline never reaches
    the file system; a directory that is a symlink (to a session elsewhere, or to one of this account's under
    another name) or whose record names another session is refused with one clear line."""
    saved_record("real")
    outside = tmp_path / "elsewhere" / "x"
    outside.mkdir(parents=True)
    (outside / paths.SESSION_RECORD).write_text((paths.session_paths("real").record).read_text())
    for name in ("../../elsewhere/x", "../x", "x\n", "real/", "real\n"):
        with pytest.raises(VmsandboxError, match="invalid session name"):
            record.Record.load(name)
    paths.session_paths("alias").root.symlink_to(paths.session_paths("real").root)
    with pytest.raises(VmsandboxError, match="no session named 'alias'"):
        record.Record.load("alias")
    paths.session_paths("other").root.mkdir()
    (paths.session_paths("other").record).write_text((paths.session_paths("real").record).read_text())
    with pytest.raises(VmsandboxError, match=r"names another session \('real'\)"):
        record.Record.load("other")
    assert record.names() == ["other", "real"]  # the symlink is no session; the damaged one is listed
    assert record.Record.load("real").name == "real"


def test_default_name_is_valid() -> None:
    name = record.default_name(Path("/home/u/My Project_2"))
    assert record.validate_name(name) == name and name.startswith("my-project-2-")


def test_record_roundtrip_and_owner() -> None:
    r = saved_record("s1", owner_pid=os.getpid(), owner_start=pids.process_start(os.getpid()))
    loaded = record.Record.load("s1")
    assert loaded == r and loaded.owner_alive()
    loaded.owner_start = "0"  # a reused pid is not the owner
    assert not loaded.owner_alive()


def test_missing_and_damaged_records() -> None:
    with pytest.raises(VmsandboxError, match="no session named"):
        record.Record.load("ghost")
    files = paths.session_paths("broken")
    files.root.mkdir(parents=True)
    files.record.write_text("{not json")
    with pytest.raises(VmsandboxError, match="damaged"):
        record.Record.load("broken")


def test_remote_command_quotes_argv() -> None:
    assert remote_command("/w/my proj", ["echo", "a b", "$HOME"]) == "cd -- '/w/my proj' && exec echo 'a b' '$HOME'"
    assert remote_command("/w", None).endswith('exec "${SHELL:-/bin/bash}" -l')


def test_guest_user_under_sudo_is_the_invoking_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    user = GuestUser.of_host({"SUDO_USER": "alice", "SUDO_UID": "1001", "SUDO_GID": "1002"})
    assert user == GuestUser("alice", 1001, 1002)
    # sudo from root itself, or no sudo: the real user
    assert GuestUser.of_host({"SUDO_USER": "root", "SUDO_UID": "0"}).uid == os.getuid()


def test_a_dead_proxy_is_restarted_under_the_lock_and_not_for_a_vm_stopped_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`exec` found the egress daemon dead because a `stop` (which holds the session's lock) had just stopped it:
    once it has the lock, it looks again, finds the VM stopped, and starts no daemon for it."""
    r = saved_record("proxied")
    first_look, stopped = threading.Event(), threading.Event()

    def usable(found: record.Record) -> str | None:
        if stopped.is_set():
            raise VmsandboxError(f"session {found.name} is stopped")
        first_look.set()
        return "died"

    started: list[str] = []
    monkeypatch.setattr(state, "usable", usable)
    monkeypatch.setattr(vmsandbox.session.start.create, "open_egress", lambda found: started.append(found.name))
    said: list[BaseException] = []

    def exec_() -> None:
        try:
            sessions.ready("proxied")
        except VmsandboxError as exc:
            said.append(exc)

    with lock.held(r.files, r.name, "stopping"):
        command = threading.Thread(target=exec_)
        command.start()
        assert first_look.wait(10)
        stopped.set()  # what the `stop` holding the lock did
    command.join(30)
    assert not command.is_alive() and started == []
    assert len(said) == 1 and "is stopped" in str(said[0])


def test_a_secret_handed_anew_waits_for_a_stop_and_starts_no_daemon_after_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """`secret set` restarts the egress daemon of each running session that injects the secret: under the
    session's lock, and only if the daemon still runs once it has it (a `stop` holding the lock stopped it)."""
    r = saved_record("injecting")
    r.files.egress_config.write_text("{}")
    first_look, stopped = threading.Event(), threading.Event()

    def daemon_state(files: object) -> SimpleNamespace:
        first_look.set()
        return SimpleNamespace(alive=not stopped.is_set())

    monkeypatch.setattr(reach, "names", lambda: ["injecting"])
    monkeypatch.setattr(control, "daemon_state", daemon_state)
    monkeypatch.setattr(policy, "read_config", lambda files: {})
    rules = SimpleNamespace(secrets=[SimpleNamespace(secret="gh-token")])
    monkeypatch.setattr(policy, "proxy_config", lambda config: rules)
    started: list[str] = []
    monkeypatch.setattr(vmsandbox.session.start.create, "open_egress", lambda found: started.append(found.name))
    done: list[dict[str, str | None]] = []
    with lock.held(r.files, r.name, "stopping"):
        handing = threading.Thread(target=lambda: done.append(reach.secret_changed("gh-token")))
        handing.start()
        assert first_look.wait(10)
        stopped.set()  # what the `stop` holding the lock did
    handing.join(30)
    assert not handing.is_alive() and started == [] and done == [{}]
    stopped.clear()
    assert reach.secret_changed("gh-token") == {"injecting": None} and started == ["injecting"]
