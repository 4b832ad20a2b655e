"""The command line's rules: where `--` belongs, several names and --all, exit codes, completion and help."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.conftest import saved_record
from tests.unit.test_cli import run_cli
from vmsandbox import paths
from vmsandbox.cli import base, main
from vmsandbox.errors import UsageError, VmsandboxError


def test_only_commands_that_run_a_command_take_one_after_the_separator(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["ls", "-q", "--", "rm", "-rf", "/"]) == base.EXIT_USAGE
    err = capsys.readouterr().err
    assert "unexpected extra argument" in err and "after `--`" not in err
    assert run_cli(["logs", "exp1", "console", "extra"]) == base.EXIT_USAGE
    assert "after `--`" not in capsys.readouterr().err
    assert run_cli(["run", "/nonexistent", "make", "test"]) == base.EXIT_USAGE
    assert "vmsandbox run /nonexistent -- make test" in capsys.readouterr().err
    assert main.missing_separator("Got unexpected extra argument (b)", ["rm", "a", "b"]) is None
    assert base.command_word(["-v", "run", "."]) == "run"
    assert base.command_word(["--", "run"]) is None


@pytest.mark.usefixtures("isolated_dirs")
@pytest.mark.parametrize(
    ("argv", "command", "workdir", "env", "tty"),
    [
        (["shell", "exp1", "uname", "-a"], ["uname", "-a"], "/p", {}, False),
        (["shell", "exp1", "ls", "-l", "--color", "-v"], ["ls", "-l", "--color", "-v"], "/p", {}, False),
        (["shell", "exp1", "--", "ls"], ["ls"], "/p", {}, False),
        (["shell", "exp1"], None, "/p", {}, None),
        (["shell", "-it", "exp1"], None, "/p", {}, None),  # docker's habit: a shell is interactive already
        (["shell", "-t", "exp1", "top"], ["top"], "/p", {}, True),
        (
            ["shell", "-w", "src", "-e", "A=1", "-e", "B=x y", "exp1", "env"],
            ["env"],
            "/p/src",
            {"A": "1", "B": "x y"},
            False,
        ),
        (["shell", "-w", "src", "exp1", "env", "-v"], ["env", "-v"], "/p/src", {}, False),
        (["exec", "-e", "K=", "exp1", "-w", "/tmp", "--", "pwd"], ["pwd"], "/tmp", {"K": ""}, False),
        (["-v", "exec", "exp1", "--", "true", "-v"], ["true", "-v"], "/p", {}, False),
        (["exec", "exp1", "ls", "-l"], ["ls", "-l"], "/p", {}, False),  # without `--`, as docker's
        (["exec", "exp1", "git", "log", "-v", "-w", "x"], ["git", "log", "-v", "-w", "x"], "/p", {}, False),
        (["exec", "-it", "exp1", "--", "bash"], ["bash"], "/p", {}, True),
        (["exec", "-it", "exp1", "bash"], ["bash"], "/p", {}, True),
        (["exec", "-i", "exp1", "cat"], ["cat"], "/p", {}, False),
        (["exec", "-t", "-w", "src", "exp1", "make", "-t"], ["make", "-t"], "/p/src", {}, True),
    ],
)
def test_shell_and_exec_run_what_follows_where_and_with_what_they_are_told(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], command: Any, workdir: str, env: dict[str, str], tty: Any
) -> None:
    from vmsandbox.core import sessions
    from vmsandbox.guest import commands

    saved_record("exp1")
    seen: list[Any] = []
    monkeypatch.setattr(sessions, "ready", sessions.record)

    def attached(
        endpoint: Any, where: str, cmd: Any, tty: bool | None = None, env: Any = None, step: str | None = None
    ) -> int:
        assert step is not None and step.isalnum()  # every command is a step of the session (its provenance)
        seen.append((cmd, where, dict(env or {}), tty))
        return 7

    monkeypatch.setattr(commands, "attach", attached)
    assert run_cli(argv) == 7  # the command's own code
    assert seen == [(command, workdir, env, tty)]


def test_a_variable_and_a_directory_reach_the_guest_quoted() -> None:
    from vmsandbox.guest.commands import remote_command

    line = remote_command("/p/my dir", ["make", "test"], {"A": "x y", "B": "$(id)"})
    assert line == "cd -- '/p/my dir' && export A='x y' && export B='$(id)' && exec make test"


@pytest.mark.usefixtures("isolated_dirs")
@pytest.mark.parametrize("bad", [["-e", "NOEQUALS"], ["-e", "1X=a"], ["-e", "A B=1"]])
def test_a_variable_that_is_not_key_value_is_a_usage_error(bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    saved_record("exp1")
    assert run_cli(["exec", *bad, "exp1", "--", "true"]) == base.EXIT_USAGE
    assert "expected KEY=VALUE" in capsys.readouterr().err


@pytest.mark.usefixtures("isolated_dirs")
def test_several_names_each_tried_and_the_failures_named(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from vmsandbox.session.moments import suspend

    stopped: list[str] = []

    def stop(name: str) -> Path:
        if name == "bad":
            raise VmsandboxError("session bad is not running", hint="`vmsandbox start bad`")
        stopped.append(name)
        return Path("/x")

    monkeypatch.setattr(suspend, "stop", stop)
    monkeypatch.setattr(suspend, "where_saved", lambda path: "saved")
    for name in ("a", "bad", "b"):
        saved_record(name)  # (no run drives them: the core's rule lets each through)
    assert run_cli(["stop", "a", "bad", "b", "a"]) == base.EXIT_FAILED
    err = capsys.readouterr().err
    assert stopped == ["a", "b"]  # each once, the failure did not stop the rest
    assert "session bad is not running" in err and "could not stop 1 of 3 sessions: bad" in err
    assert run_cli(["stop", "a", "--all"]) == base.EXIT_USAGE
    assert run_cli(["stop"]) == base.EXIT_USAGE
    assert "--all" in capsys.readouterr().err
    assert run_cli(["rm", "--all", "--group"]) == base.EXIT_USAGE
    assert run_cli(["rm", "--stale", "exp1"]) == base.EXIT_USAGE
    assert run_cli(["rm", "--dry-run", "exp1"]) == base.EXIT_USAGE


@pytest.mark.usefixtures("isolated_dirs")
def test_rm_all_without_a_terminal_needs_yes(capsys: pytest.CaptureFixture[str]) -> None:
    saved_record("one")
    saved_record("two")
    assert run_cli(["rm", "--all"]) == base.EXIT_USAGE
    err = capsys.readouterr().err
    assert "would remove 2 session(s): one, two" in err and "--yes" in err
    assert (paths.session_paths("one").record).exists()


@pytest.mark.usefixtures("isolated_dirs")
@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["run", ".", "--cpus", "0", "--", "true"], base.EXIT_USAGE),
        (["run", ".", "--accel", "xen", "--", "true"], base.EXIT_USAGE),
        (["run", ".", "--name", "Bad Name", "--", "true"], base.EXIT_USAGE),
        (["run", ".", "--review", "paper", "--", "true"], base.EXIT_USAGE),
        (["run", ".", "--cpus", "abc"], base.EXIT_USAGE),
        (["run", ".", "--blueprint", "nosuch", "--", "true"], base.EXIT_USAGE),  # a name that is none: usage
        (["run", ".", "--host", "nosuch", "--", "true"], base.EXIT_USAGE),
        (["run", ".", "--fanout", "0", "--", "true"], base.EXIT_USAGE),
        (["run", ".", "--fanout", "2", "--yes", "--", "true"], base.EXIT_USAGE),
        (["create", ".", "--blueprint", "nosuch"], base.EXIT_USAGE),
        (["create", ".", "--from", "exp1"], base.EXIT_USAGE),  # a copy needs its name
        (["create", ".", "--from", "exp1", "--name", "b"], base.EXIT_USAGE),  # and takes no PATH
        (["image", "build", "--blueprint", "nosuch"], base.EXIT_USAGE),
        (["host", "prepare", "nosuch"], base.EXIT_USAGE),
        (["login", "add", "nosuch"], base.EXIT_USAGE),
        (["login", "add", "base"], base.EXIT_USAGE),
        (["exec", "nosuch", "--", "true"], base.EXIT_RUN_FAILED),
        (["exec", "nosuch", "true"], base.EXIT_RUN_FAILED),
        (["shell", "nosuch", "true"], base.EXIT_RUN_FAILED),
        (["shell", "-it", "nosuch"], base.EXIT_RUN_FAILED),
        (["exec", "No_Such", "true"], base.EXIT_USAGE),  # an invalid name: usage, as everywhere
        (["shell", "No_Such"], base.EXIT_USAGE),
        (["inspect", "No_Such"], base.EXIT_USAGE),
        (["rm", "No_Such"], base.EXIT_USAGE),
        (["diff", "nosuch", "--against", "No_Such"], base.EXIT_USAGE),  # a name given by an option too
        (["cp", "/etc/hostname", "No_Such:/tmp"], base.EXIT_USAGE),
        (["create", "--from", "No_Such", "--name", "ok"], base.EXIT_USAGE),
        (["ui", "--port", "99999"], base.EXIT_USAGE),
        (["checkpoint", "exp1"], base.EXIT_USAGE),
        (["checkpoint", "help"], 0),
        (["-v"], 0),
        (["ps", "-a"], 0),
        (["secret", "list"], 0),
        (["create", "/nonexistent"], base.EXIT_FAILED),
        (["rm", "nosuch"], base.EXIT_FAILED),
        (["secret", "rm", "nosuch"], base.EXIT_FAILED),
        (["policy", "log", "nosuch", "--since", "10m"], base.EXIT_FAILED),
        (["policy", "log", "nosuch", "--since", "yesterday"], base.EXIT_USAGE),
        (["logs", "nosuch", "--tail", "-1"], base.EXIT_USAGE),
        (["host", "ls", "--timeout", "0"], base.EXIT_USAGE),
        (["ls", "--filter", "state=bogus"], base.EXIT_USAGE),
        (["ls", "--format", "{{.Bogus}}"], base.EXIT_USAGE),
        (["nosuchcommand"], base.EXIT_USAGE),
        (["help", "nosuchcommand"], base.EXIT_USAGE),
        ([], 0),
        (["checkpoint"], 0),
        (["help"], 0),
        (["help", "checkpoint", "restore"], 0),
        (["version"], 0),
    ],
)
def test_exit_codes(argv: list[str], code: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert run_cli(argv) == code


@pytest.mark.usefixtures("isolated_dirs")
def test_config_validate_fails_with_one(tmp_path: Path) -> None:
    bad = tmp_path / "c.yaml"
    bad.write_text("memroy: 2G\n")
    assert run_cli(["config", "validate", str(bad)]) == base.EXIT_FAILED


@pytest.mark.usefixtures("isolated_dirs")
def test_a_misspelt_key_gets_a_suggestion(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "config.yaml"
    bad.write_text("cpus: 2\nmemroy: 2G\n")
    assert run_cli(["config", "validate", str(bad)]) == base.EXIT_FAILED
    err = capsys.readouterr().err
    assert "line 2" in err and "unknown key `memroy`" in err and "did you mean `memory`?" in err


@pytest.mark.usefixtures("isolated_dirs")
def test_config_validate_looks_up_what_a_blueprint_extends(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    found = tmp_path / "proj" / ".vmsandbox" / "blueprints"
    found.mkdir(parents=True)
    (found / "mine.yaml").write_text("description: mine\napt: [jq]\nextends: nosuch\n")
    (found / "ok.yaml").write_text("extends: claude\n")
    (found / "claude.yaml").write_text("extends: claude\napt: [jq]\n")  # the shipped one, extended by itself
    assert run_cli(["config", "validate", str(found / "mine.yaml")]) == base.EXIT_FAILED
    err = capsys.readouterr().err
    assert "line 3" in err and "`extends`: no blueprint named 'nosuch'" in err and "claude" in err
    assert run_cli(["config", "validate", str(found / "ok.yaml"), str(found / "claude.yaml")]) == 0


def test_cp_puts_a_relative_guest_path_under_the_project() -> None:
    from vmsandbox.sync.inward import cp
    from vmsandbox.sync.target import Target

    target = Target("s", Path("/work/my project"), paths.session_paths("s"), 1000, 1000)
    assert cp.guest_path(target, "tests/") == "/work/my project/tests/"
    assert cp.guest_path(target, "a.txt") == "/work/my project/a.txt"
    assert cp.guest_path(target, "/tmp/x") == "/tmp/x"
    assert cp.guest_path(target, "") == "/work/my project/"
    with pytest.raises(UsageError):
        cp.guest_path(target, "a\nb")


@pytest.mark.usefixtures("isolated_dirs")
def test_config_show_marks_an_untrusted_project_files_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / ".vmsandbox.yaml").write_text("memory: 1G\nnetwork: open\nallow: [evil.example]\n")
    assert run_cli(["config", "show", str(tmp_path), "--json"]) == 0
    captured = capsys.readouterr()
    rows = [json.loads(line) for line in captured.out.splitlines()]
    assert "is not trusted" in captured.err and "vmsandbox config trust add" in captured.err
    untrusted = {r["key"]: r["value"] for r in rows if "untrusted" in r["from"]}
    assert untrusted == {"memory": '"1G"', "network": '"open"', "allow": '["evil.example"]'}
    used = {r["key"]: r for r in rows if "untrusted" not in r["from"]}
    assert used["network"]["value"] == "allowlist" and used["memory"]["from"] == "default"


@pytest.mark.usefixtures("isolated_dirs")
def test_a_record_is_checked_field_by_field() -> None:
    from vmsandbox.session.record import Phase, Record

    good = saved_record("exp1", status="ready")
    data = json.loads(good.files.record.read_text())
    good.files.record.write_text(json.dumps({**data, "from_a_newer_vmsandbox": 1}))
    assert Record.load("exp1").status is Phase.READY  # a key it does not know is left out
    bad = {**data, "cpus": "many", "status": "nonsense", "publish": [{"guest": "web"}]}
    for f in (good.files.record, good.files.record.with_name(good.files.record.name + ".copy")):
        f.write_text(json.dumps(bad))
    with pytest.raises(VmsandboxError) as exc:
        Record.load("exp1")
    said = exc.value.message
    assert "cpus: Input should be a valid integer" in said and "status:" in said and "publish.0.guest" in said
    assert exc.value.hint is not None and "rm exp1 --discard" in exc.value.hint


@pytest.mark.usefixtures("isolated_dirs")
def test_every_problem_of_a_file_at_once_with_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "config.yaml"
    bad.write_text("memroy: 2G\ncpus: four\nsecrets:\n  - {secret: k, host: a.com, hedaer: x}\nallow: [a.com, 5]\n")
    assert run_cli(["config", "validate", str(bad)]) == base.EXIT_FAILED
    err = capsys.readouterr().err
    assert f"{bad}: 5 problems:" in err
    for said in (
        "line 1: unknown key `memroy` (did you mean `memory`?)",
        "line 2: `cpus` must be an integer, not str 'four'",
        "line 4: `secrets[0]`: missing key `header`",  # its entry's line (issue 46: it said `secrets:`'s, 3)
        "line 4: `secrets[0]`: unknown key `hedaer` (did you mean `header`?)",
        "line 5: `allow[1]` must be a string, not int 5",
    ):
        assert said in err, said


def test_the_schema_and_the_runtime_agree() -> None:
    from vmsandbox.core.settings import json_schema
    from vmsandbox.egress.rules.netpolicy import Mode
    from vmsandbox.session import settingrows, settings
    from vmsandbox.vm.accel import Accel

    props = json_schema()["properties"]
    for key, least in ((k, settingrows.BY_KEY[k].least_mib or 0) for k in ("memory", "disk")):
        (as_int,) = [b for b in props[key]["oneOf"] if b["type"] == "integer"]
        assert as_int["minimum"] == least
        settings.Settings().merged({key: least}, "test")  # the schema's least is taken by the runtime…
        with pytest.raises(VmsandboxError, match="too small"):  # …and one less is not
            settings.Settings().merged({key: least - 1}, "test")
    low, high = props["boot_timeout"]["minimum"], props["boot_timeout"]["maximum"]
    for ok in (low, high):
        assert settings.Settings().merged({"boot_timeout": ok}, "test").boot_timeout == ok
    for refused in (low - 1, high + 1):
        with pytest.raises(VmsandboxError, match="between"):
            settings.Settings().merged({"boot_timeout": refused}, "test")
    assert props["accel"]["enum"] == [a.value for a in Accel]
    assert props["network"]["enum"] == [m.value for m in Mode]
    defaults = settings.Settings().merged(
        {k: f.default for k, f in settingrows.ConfigFile.model_fields.items() if isinstance(f.default, str | int)},
        "the model's defaults",
    )
    assert defaults == settings.Settings()  # the defaults the schema shows are the ones a session gets


@pytest.mark.usefixtures("isolated_dirs")
def test_a_kept_login_goes_into_the_boot_bundle_and_nothing_else(capsys: pytest.CaptureFixture[str]) -> None:
    import io
    import tarfile

    from vmsandbox.guest.bootfiles import GuestUser, build
    from vmsandbox.image import blueprint
    from vmsandbox.session.running import logins

    claude = blueprint.load("claude")
    assert claude.login_files == (".claude/.credentials.json", ".claude.json")
    assert blueprint.load("codex").login_command == ("codex", "login")
    assert logins.keep(claude, {".claude/.credentials.json": b'{"t": 1}'}) == [".claude/.credentials.json"]
    kept = logins.store("claude") / ".claude" / ".credentials.json"
    assert oct(kept.stat().st_mode & 0o777) == "0o600"
    assert oct(kept.parent.stat().st_mode & 0o777) == oct(logins.store("claude").stat().st_mode & 0o777) == "0o700"
    user = GuestUser("u", 1000, 1000)
    data, notes = build(user, (), git=False, more=lambda b: logins.add_to(b, claude))
    assert data is not None and any("claude's login" in n for n in notes)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        member = tar.getmember("home/u/.claude/.credentials.json")
        assert (member.uid, member.mode) == (1000, 0o600)
        assert tar.extractfile(member).read() == b'{"t": 1}'  # type: ignore[union-attr]
    assert build(user, (), git=False, more=lambda b: logins.add_to(b, blueprint.load("codex")))[0] is None
    assert logins.forget(claude) == [".claude/.credentials.json"] and not kept.exists()
    assert run_cli(["login", "add", "base"]) == base.EXIT_USAGE  # no login files: nothing to keep
    assert "names no login files" in capsys.readouterr().err


def test_a_login_is_offered_only_when_its_credential_is_new() -> None:
    """Claude Code writes `.claude.json` at every start: alone it is no login (a newcomer who never signed in
    was asked to keep one); with a new `.credentials.json` both are kept."""
    from vmsandbox.image import blueprint
    from vmsandbox.session.running import logins

    claude, codex = blueprint.load("claude"), blueprint.load("codex")
    started = {".claude.json": b'{"numStartups": 1}'}
    assert logins.fresh_login(claude, started, {}) == {}
    signed = {**started, ".claude/.credentials.json": b'{"t": 1}'}
    assert logins.fresh_login(claude, signed, {}) == signed
    assert logins.fresh_login(claude, signed, {".claude/.credentials.json": b'{"t": 1}'}) == {}  # (kept already)
    refreshed = {**signed, ".claude/.credentials.json": b'{"t": 2}'}
    assert logins.fresh_login(claude, refreshed, signed) == {".claude/.credentials.json": b'{"t": 2}'}
    assert logins.fresh_login(codex, {".codex/auth.json": b"{}"}, {}) == {".codex/auth.json": b"{}"}


def test_a_blueprint_login_must_stay_in_the_home(tmp_path: Path) -> None:
    from vmsandbox.image import blueprint

    for bad in ("/etc/shadow", "../x", ""):
        f = tmp_path / "blueprints" / "x.yaml"
        f.parent.mkdir(exist_ok=True)
        f.write_text(f"login: {{files: [{json.dumps(bad)}]}}\n")
        with pytest.raises(VmsandboxError, match="`login`"):
            blueprint.check_file(f)


@pytest.mark.usefixtures("isolated_dirs")
def test_values_refused_are_said_all_at_once_beside_the_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "config.yaml"
    bad.write_text("cpus: 0\nmemory: 2\naccel: xen\nboot_timeout: 0\nmemroy: 2G\nnetwork: wide\n")
    assert run_cli(["config", "validate", str(bad)]) == base.EXIT_FAILED
    err = capsys.readouterr().err
    assert f"{bad}: 6 problems:" in err
    for said in (
        "line 5: unknown key `memroy` (did you mean `memory`?)",
        "line 1: `cpus` must be between 1 and 16",
        "line 2: `memory`: 2 is too small",
        "line 3: `accel`: unknown accelerator 'xen'",
        "line 4: `boot_timeout` must be between 1 and 3600 seconds",
        "line 6: ",
    ):
        assert said in err, said
    assert "use auto, kvm or tcg" in err  # the hints of each, together


def test_claude_keeps_a_subscription_token_out_of_the_guest_like_an_api_key() -> None:
    from vmsandbox.image import blueprint
    from vmsandbox.session import settings

    merged = settings.Settings().merged(blueprint.load("claude").settings_data(), "claude")
    for_api = {m.secret: (m.header, m.value, m.env) for m in merged.secrets if m.host == "api.anthropic.com"}
    assert for_api == {
        "anthropic-api-key": ("x-api-key", "{secret}", "ANTHROPIC_API_KEY"),
        "claude-oauth-token": ("Authorization", "Bearer {secret}", "CLAUDE_CODE_OAUTH_TOKEN"),
    }


@pytest.mark.usefixtures("isolated_dirs")
def test_a_blueprints_refused_values_are_said_all_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bp = tmp_path / "blueprints" / "mine.yaml"
    bp.parent.mkdir()
    bp.write_text("apt: [Bad_Name]\nnode: 12\ncopy: [/etc/passwd]\nenv: {1X: a}\n")
    assert run_cli(["config", "validate", str(bp)]) == base.EXIT_FAILED
    err = capsys.readouterr().err
    assert f"{bp}: 4 problems:" in err
    for said in ("line 1: `apt`: 'Bad_Name'", "line 2: `node`", "line 3: `copy`: '/etc/passwd'", "line 4: `env`: '1X'"):
        assert said in err, said
