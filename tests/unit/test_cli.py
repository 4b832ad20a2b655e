from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import typer.main

from vmsandbox.cli import base, main


def run_cli(args: list[str]) -> int:
    with pytest.raises(SystemExit) as exc:
        main.main(args)
    return int(exc.value.code or 0)


def test_refuses_root_with_a_hint(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["run", "/", "--", "true"]) == base.EXIT_RUN_FAILED
    err = capsys.readouterr().err
    assert "too broad" in err and "hint:" in err


def test_missing_path(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert run_cli(["run", str(tmp_path / "missing")]) == base.EXIT_RUN_FAILED
    assert "does not exist" in capsys.readouterr().err


def test_exec_needs_a_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["exec", "s1"]) == base.EXIT_USAGE
    assert "`vmsandbox exec s1 make test`" in capsys.readouterr().err
    assert run_cli(["exec", "s1", "--"]) == base.EXIT_USAGE
    assert "no command given" in capsys.readouterr().err
    assert run_cli(["exec", "s1", "ls", "--", "-l"]) == base.EXIT_USAGE  # after NAME or after `--`: once
    assert "give it once: `vmsandbox exec s1 -- ls -l`" in capsys.readouterr().err


def test_bad_flag_value_names_it(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert run_cli(["run", str(tmp_path), "--memory", "lots", "--", "true"]) == base.EXIT_USAGE
    assert "--memory" in capsys.readouterr().err


def test_unknown_session(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["logs", "ghost"]) == base.EXIT_FAILED
    err = capsys.readouterr().err
    assert "no session named 'ghost'" in err and "vmsandbox ls" in err


def test_usage_error_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["run", "--cpus", "many"]) == 2
    assert "--cpus" in capsys.readouterr().err


def test_command_after_double_dash_is_not_the_path(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`vmsandbox run -- ls /` must not take `ls` as PATH: PATH is the current directory, and `ls /` is the
    command. Seen from the first check that reads PATH (an untrusted project config there)."""
    from vmsandbox.cli.base import Invocation

    (tmp_path / ".vmsandbox.yaml").write_text("network: open\n")
    monkeypatch.chdir(tmp_path)
    assert run_cli(["run", "--", "ls", "/"]) == base.EXIT_RUN_FAILED
    assert Invocation.command == ["ls", "/"]
    err = capsys.readouterr().err
    assert ".vmsandbox.yaml is not trusted" in err and "`vmsandbox config trust add .`" in err  # PATH was "."


def test_missing_secret_stops_run_before_anything_is_made(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / ".vmsandbox.yaml").write_text(
        "secrets:\n  - {secret: my-key, host: api.example.com, header: x-api-key, env: MY_KEY}\n"
    )
    assert run_cli(["run", str(tmp_path), "--", "true"]) == base.EXIT_RUN_FAILED
    assert "not trusted" in capsys.readouterr().err
    assert run_cli(["config", "trust", "add", "--yes", str(tmp_path)]) == 0
    assert "your secret my-key goes to api.example.com" in capsys.readouterr().err
    assert run_cli(["run", str(tmp_path), "--", "true"]) == base.EXIT_RUN_FAILED
    err = capsys.readouterr().err
    assert "secret my-key" in err and "vmsandbox secret set my-key" in err


def test_secret_set_ls_rm(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, isolated_dirs: Path
) -> None:
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("v4lue\n"))
    assert run_cli(["secret", "set", "api"]) == 0
    stored = isolated_dirs / "config" / "secrets" / "api"
    assert stored.read_text() == "v4lue"
    assert oct(stored.stat().st_mode & 0o777) == "0o600"
    assert oct(stored.parent.stat().st_mode & 0o777) == "0o700"
    capsys.readouterr()
    assert run_cli(["secret", "ls", "--json"]) == 0
    out = capsys.readouterr().out
    assert '"api"' in out and "v4lue" not in out
    assert run_cli(["secret", "rm", "api"]) == 0
    assert not stored.exists()
    assert run_cli(["secret", "rm", "api"]) == base.EXIT_FAILED  # no such secret: as docker's `rm` of none
    assert run_cli(["secret", "set", "../escape"]) == base.EXIT_USAGE  # no name a secret can have


def test_bad_network_flags_name_them(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert run_cli(["run", str(tmp_path), "--network", "wide", "--", "true"]) == base.EXIT_USAGE
    assert "--network" in capsys.readouterr().err
    assert run_cli(["run", str(tmp_path), "--allow", "10.0.0.1", "--", "true"]) == base.EXIT_USAGE
    assert "--allow" in capsys.readouterr().err


def test_bad_publish_specs_are_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for spec, extra in (("web", []), ("70000", []), ("8080:0", []), ("3000", ["--publish-address", "nowhere"])):
        assert run_cli(["run", str(tmp_path), "--publish", spec, *extra, "--", "true"]) == base.EXIT_USAGE
        assert "--publish" in capsys.readouterr().err


def test_a_bad_port_given_to_port_is_named_as_such(capsys: pytest.CaptureFixture[str]) -> None:
    """`port rm`/`port publish` have no `--publish` flag: their error and its example are of the command given."""
    for command in ("publish", "rm"):
        assert run_cli(["port", command, "exp1", "80x"]) == base.EXIT_USAGE
        err = capsys.readouterr().err
        assert "port '80x': ports are numbers" in err and "--publish" not in err and " -p " not in err
        assert f"`vmsandbox port {command} exp1 8080:3000`" in err


def test_agent_shorthands_exist_with_runs_options(capsys: pytest.CaptureFixture[str]) -> None:
    for agent in base.AGENTS:
        assert run_cli([agent, "--help"]) == 0
        out = capsys.readouterr().out
        assert "--publish" in out and "--blueprint" not in out and agent in out


def test_trust_shows_and_refuses_without_a_terminal_or_yes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from vmsandbox import trust

    (tmp_path / ".vmsandbox.yaml").write_text("network: open\nallow: [evil.example]\n")
    assert run_cli(["config", "trust", "add", str(tmp_path)]) == base.EXIT_FAILED
    err = capsys.readouterr().err
    assert "network" in err and "--yes" in err
    assert not trust.records()


def test_trust_shows_what_a_config_changes_escaped(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / ".vmsandbox.yaml").write_text("cpus: 2\nnetwork: open\nallow: [evil.example]\n")
    assert run_cli(["config", "trust", "add", "--yes", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert 'network: "open"   (now: "allowlist")' in err
    assert "cpus: 2   (sizes the VM: needs no trust)" in err
    assert run_cli(["config", "trust", "add", str(tmp_path)]) == 0  # trusted already: nothing to ask
    assert "trusted already" in capsys.readouterr().err


def test_the_trust_of_a_project_that_is_gone_can_be_taken_back(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import shutil

    from vmsandbox import trust

    project = tmp_path / "app"
    project.mkdir()
    (project / ".vmsandbox.yaml").write_text("network: open\n")
    assert run_cli(["config", "trust", "add", "--yes", str(project)]) == 0
    shutil.rmtree(project)  # `config trust ls` says "missing"; `rm` with the directory's path still finds it
    assert run_cli(["config", "trust", "rm", str(project)]) == 0
    assert "No longer trusted" in capsys.readouterr().err
    assert not trust.records()


@pytest.mark.parametrize(
    "args", [["-h"], ["ls", "-h"], ["image", "-h"], ["image", "ls", "-h"], ["secret", "set", "-h"]]
)
def test_dash_h_is_help_everywhere(capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    assert run_cli(args) == 0
    assert "Usage: vmsandbox" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("old", "now"),
    [
        (["destroy", "exp1"], "`vmsandbox rm NAME`"),
        (["ssh", "exp1"], "`vmsandbox shell NAME`"),
        (["checkpoints", "exp1"], "`vmsandbox checkpoint ls NAME`"),
        (["rollback", "exp1", "before"], "`vmsandbox checkpoint restore NAME LABEL`"),
        (["recover", "exp1"], "`vmsandbox pull NAME`"),
        (["gc"], "`vmsandbox rm --stale`"),
        (["clean", "exp1"], "`vmsandbox secret wipe NAME`"),
        (["hosts"], "`vmsandbox host ls`"),
        (["allow", "exp1", "pypi.org"], "`vmsandbox policy allow NAME HOST...`"),
        (["deny", "exp1", "pypi.org"], "`vmsandbox policy deny NAME HOST...`"),
        (["fanout", "3", "."], "`vmsandbox run --fanout N PATH -- COMMAND`"),
        (["fork", "exp1", "exp2"], "`vmsandbox create --from NAME[:LABEL] --name NEW`"),
        (["compare", "a", "b"], "`vmsandbox diff NAME --against OTHER --stat`"),
        (["ssh-config", "exp1"], "`vmsandbox inspect --format ssh-config NAME`"),
        (["trust", "."], "`vmsandbox config trust add PATH`"),
        (["blueprint", "ls"], "`vmsandbox image ls --blueprints`"),
        (["destroy", "-h"], "`vmsandbox rm NAME`"),  # not even its help: no such command
    ],
)
def test_an_old_name_is_no_command_its_hint_names_what_does_it(
    capsys: pytest.CaptureFixture[str], old: list[str], now: str
) -> None:
    """0.1.0 keeps no old names: each is a usage error whose hint names the command (never run for it)."""
    assert run_cli(old) == base.EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.out == "" and "is now" not in captured.err
    assert captured.err.splitlines() == [f"error: no command {old[0]!r}", captured.err.splitlines()[1]]
    assert captured.err.splitlines()[1].startswith(f"hint: {now}")


def test_usage_lines_show_the_command_after_the_separator(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["run", "-h"]) == 0
    assert "[-- COMMAND...]" in capsys.readouterr().out
    assert run_cli(["exec", "-h"]) == 0
    out = capsys.readouterr().out
    assert "Usage: vmsandbox exec [OPTIONS] NAME [--] COMMAND...\n" in out  # `--` optional, as docker's


def test_a_command_without_the_separator_gets_the_right_command_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert run_cli(["run", str(tmp_path), "make", "test"]) == 2
    assert f"hint: put the command to run after `--`: vmsandbox run {tmp_path} -- make test" in capsys.readouterr().err
    assert main.missing_separator("Got unexpected extra argument (x)", ["claude", ".", "-y", "x"]) == (
        "put the command to run after `--`: vmsandbox claude . -y -- x"
    )
    assert main.missing_separator("No such option: --frob", ["run"]) is None


def test_a_secret_nothing_reads_gets_a_warning_naming_the_close_one(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, isolated_dirs: Path
) -> None:
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("k\n"))
    assert run_cli(["secret", "set", "anthropic_api_key"]) == 0
    err = capsys.readouterr().err
    assert "warning:" in err and "nothing reads a secret named 'anthropic_api_key'" in err
    assert "vmsandbox secret set anthropic-api-key" in err
    monkeypatch.setattr("sys.stdin", io.StringIO("k\n"))
    assert run_cli(["secret", "set", "anthropic-api-key"]) == 0
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("word", "offered"),
    [
        ("destory", "`vmsandbox rm NAME` removes a session"),  # an old name's typo: what does it now
        ("rollbak", "`vmsandbox checkpoint restore NAME LABEL`"),
        ("ps2", "did you mean `vmsandbox ls`?"),  # docker's ps, mistyped
        ("top", "did you mean `vmsandbox stop`?"),  # a hint only: nothing is stopped
        ("frobnicate", None),
        ("pushh", "did you mean `vmsandbox push`?"),
        ("trsut", "`vmsandbox config trust add PATH`"),
        ("blueprnt", "`vmsandbox image ls --blueprints`"),
        ("lss", "did you mean `vmsandbox ls`?"),
        ("rn", "did you mean `vmsandbox rm`?"),
    ],
)
def test_did_you_mean_only_for_a_near_typo(capsys: pytest.CaptureFixture[str], word: str, offered: str | None) -> None:
    assert run_cli([word]) == 2
    error, hint = capsys.readouterr().err.splitlines()
    assert error == f"error: no command {word!r}"
    if offered is None:
        assert hint == "hint: `vmsandbox -h` lists the commands"
    else:
        assert hint.startswith(f"hint: {offered}")


def test_blueprints_are_listed_and_shown_merged(
    capsys: pytest.CaptureFixture[str], isolated_dirs: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    mine = isolated_dirs / "config" / "blueprints" / "mine.yaml"
    mine.parent.mkdir(parents=True)
    mine.write_text("extends: claude\ndescription: mine\napt: [ripgrep]\n")
    monkeypatch.chdir(tmp_path)
    assert run_cli(["image", "ls", "--blueprints", "-q"]) == 0
    assert {"base", "claude", "codex", "gemini", "opencode", "mine"} <= set(capsys.readouterr().out.split())
    assert run_cli(["image", "ls", "--blueprints"]) == 0
    captured = capsys.readouterr()
    assert "mine      yours" in captured.out and "built in" in captured.out
    assert all(len(line) <= 80 for line in captured.out.splitlines())  # the descriptions, whole, do not fit:
    assert "DESCRIPTION left out" in captured.err  # said, never cut
    assert run_cli(["image", "ls", "--blueprints", "-o", "wide"]) == 0
    assert "mine      yours     mine" in capsys.readouterr().out
    assert run_cli(["image", "ls", "--blueprints", "--format", "{{.Name}}:{{.From}}"]) == 0
    assert "mine:yours" in capsys.readouterr().out.splitlines()
    assert run_cli(["image", "ls", "--blueprints", "--format", "{{.Kernel}}"]) == base.EXIT_USAGE  # an image's
    assert ".Name, .From, .File, .Description" in capsys.readouterr().err
    assert run_cli(["image", "show", "mine"]) == 0
    shown = capsys.readouterr().out
    assert "- ripgrep" in shown and "- claude" in shown and "anthropic-api-key" in shown and str(mine) in shown
    assert run_cli(["image", "show", "nope"]) == base.EXIT_USAGE  # a name on the command line that is none
    assert "known blueprints" in capsys.readouterr().err
    assert run_cli(["blueprint", "show", "mine"]) == base.EXIT_USAGE  # the old form: no command, its hint says
    assert "`vmsandbox image show NAME` shows one" in capsys.readouterr().err


def test_config_show_names_where_each_setting_comes_from(
    capsys: pytest.CaptureFixture[str], isolated_dirs: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (isolated_dirs / "config" / "config.yaml").write_text("cpus: 4\nmemory: 3G\n")
    project = tmp_path / "proj"
    project.mkdir()
    (project / ".vmsandbox.yaml").write_text("memory: 2048\n")  # the default value, but set here
    monkeypatch.setenv("VMSANDBOX_ACCEL", "tcg")
    assert run_cli(["config", "show", str(project), "--json"]) == 0
    rows = {r["key"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert rows["cpus"]["from"].endswith("config.yaml") and rows["cpus"]["value"] == "4"
    assert rows["memory"]["from"] == str(project / ".vmsandbox.yaml") and rows["memory"]["value"] == "2048 MiB"
    assert rows["accel"]["from"] == "VMSANDBOX_ACCEL" and rows["disk"]["from"] == "default"


def test_config_validate_names_file_line_and_key(
    capsys: pytest.CaptureFixture[str], isolated_dirs: Path, tmp_path: Path
) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("memory: 4G\nnetwork: open\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("cpus: 1\n\nboot_timeout: 0\n")
    bp = tmp_path / "blueprints" / "b.yaml"
    bp.parent.mkdir()
    bp.write_text("description: x\napt: ['no such; rm -rf /']\n")
    assert run_cli(["config", "validate", str(good)]) == 0
    assert f"ok  {good}" in capsys.readouterr().out
    assert run_cli(["config", "validate", str(bad)]) == base.EXIT_FAILED
    assert f"{bad}, line 3: `boot_timeout` must be between" in capsys.readouterr().err
    assert run_cli(["config", "validate", str(bp)]) == base.EXIT_FAILED
    assert f"{bp}, line 2: `apt`" in capsys.readouterr().err


def test_config_schema_describes_every_key(capsys: pytest.CaptureFixture[str]) -> None:
    from vmsandbox.image import blueprint
    from vmsandbox.session import settingrows

    assert run_cli(["config", "schema"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["properties"]) == set(settingrows.FIELDS) and doc["additionalProperties"] is False
    from vmsandbox.egress.rules.netpolicy import Mode
    from vmsandbox.vm.accel import Accel

    assert doc["properties"]["accel"]["enum"] == [a.value for a in Accel]  # the schema keeps up with the code
    assert doc["properties"]["network"]["enum"] == [m.value for m in Mode]
    timeout = doc["properties"]["boot_timeout"]
    row = settingrows.BY_KEY["boot_timeout"]
    assert (timeout["minimum"], timeout["maximum"]) == (row.low, row.high)
    secret = doc["$defs"][doc["properties"]["secrets"]["items"]["$ref"].rsplit("/", 1)[1]]
    assert secret["required"] == ["secret", "host", "header"] and secret["additionalProperties"] is False
    assert all(p.get("description") for p in doc["properties"].values())  # every key says what it is for
    assert run_cli(["config", "schema", "--blueprint"]) == 0
    assert set(json.loads(capsys.readouterr().out)["properties"]) == set(blueprint.FIELDS)


def test_every_command_has_an_example_in_its_help() -> None:

    def commands(group: object, prefix: str = "") -> list[tuple[str, object]]:
        found = []
        for name, cmd in getattr(group, "commands", {}).items():
            if hasattr(cmd, "commands"):
                found += commands(cmd, f"{prefix}{name} ")
            else:
                found.append((prefix + name, cmd))
        return found

    missing = [
        name
        for name, cmd in commands(typer.main.get_command(base.app))
        if not (getattr(cmd, "help", "") or "").startswith("Same as")
        and "Example" not in (getattr(cmd, "help", "") or "")
    ]
    assert missing == []


def test_experiment_commands_refuse_what_they_cannot_do(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert run_cli(["run", str(tmp_path), "--check", "make test", "--", "true"]) == base.EXIT_USAGE
    assert "--check goes with --fanout" in capsys.readouterr().err
    assert run_cli(["diff", "a", "--against", "a"]) == base.EXIT_USAGE
    assert "another session" in capsys.readouterr().err
    assert run_cli(["diff", "a", "--against", "b", "src/"]) == base.EXIT_USAGE
    assert "--against" in capsys.readouterr().err
    assert run_cli(["diff", "a", "--against", "b", "--json"]) == base.EXIT_USAGE
    assert "--json with --against goes with --stat" in capsys.readouterr().err
    assert run_cli(["diff", "a", "--by", "step", "--against", "b"]) == base.EXIT_USAGE
    assert "not with --stat or --against" in capsys.readouterr().err
    assert run_cli(["rm", "--group", "nothing-here"]) == base.EXIT_FAILED
    assert "no fan-out named 'nothing-here'" in capsys.readouterr().err
    assert run_cli(["checkpoint", "create", "ghost", "Bad Label"]) == base.EXIT_FAILED
    assert "invalid checkpoint label" in capsys.readouterr().err
    assert run_cli(["checkpoint", "rm", "exp1"]) == base.EXIT_USAGE
    assert "missing argument 'LABEL'" in capsys.readouterr().err
    assert run_cli(["claude", "--help"]) == 0
    assert "--fanout" in capsys.readouterr().out  # the agent shorthands fan out too
    assert run_cli(["run", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--check" in out and "VMSANDBOX_INDEX" in out


def test_a_name_with_a_newline_is_refused_before_anything_is_made(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`run --name $'x\\n'` passed the name check (its `$`), then failed to restore a path with a newline, and
    the product marked the shared warm-start template failed for it. Refused now, as a usage error, with
    nothing made."""
    from vmsandbox import paths

    assert run_cli(["run", "--name", "x\n", str(tmp_path), "--", "true"]) == base.EXIT_USAGE
    assert "invalid session name 'x\\n'" in capsys.readouterr().err
    assert not paths.sessions_dir().exists() or list(paths.sessions_dir().iterdir()) == []


# Issue 46: diagnostics never block.


def test_config_validate_checks_every_file_named(
    capsys: pytest.CaptureFixture[str], isolated_dirs: Path, tmp_path: Path
) -> None:
    a = tmp_path / "a.yaml"
    a.write_text("cpus: 0\nmemroy: 2G\n")
    b = tmp_path / "b.yaml"
    b.write_text("memory: 4G\n")
    c = tmp_path / "blueprints" / "c.yaml"
    c.parent.mkdir()
    c.write_text("extends: nosuch\n")
    assert run_cli(["config", "validate", str(a), str(b), str(c)]) == base.EXIT_FAILED
    captured = capsys.readouterr()
    assert f"ok  {b}" in captured.out  # after a bad one
    assert f"{a}: 2 problems:" in captured.err and f"{c}, line 1: `extends`: no blueprint named" in captured.err
    assert f"2 of 3 files have problems: {a}, {c}" in captured.err


def test_config_validate_without_files_checks_yours_and_the_projects(
    capsys: pytest.CaptureFixture[str], isolated_dirs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Your config, your blueprints, this directory's .vmsandbox.yaml and its blueprints (checked as a
    project's: `hosts` refused)."""
    (isolated_dirs / "config" / "config.yaml").write_text("cpus: 2\n")
    mine = isolated_dirs / "config" / "blueprints" / "mine.yaml"
    mine.parent.mkdir()
    mine.write_text("extends: claude\napt: ['Bad Name']\n")
    project = tmp_path / "proj"
    (project / ".vmsandbox" / "blueprints").mkdir(parents=True)
    (project / ".vmsandbox.yaml").write_text("hosts: []\n")
    (project / ".vmsandbox" / "blueprints" / "dev.yaml").write_text("extends: base\n")
    monkeypatch.chdir(project)
    assert run_cli(["config", "validate"]) == base.EXIT_FAILED
    captured = capsys.readouterr()
    assert f"ok  {isolated_dirs / 'config' / 'config.yaml'}" in captured.out
    assert "ok  .vmsandbox/blueprints/dev.yaml" in captured.out
    assert f"{mine}, line 2: `apt`: 'Bad Name'" in captured.err
    assert ".vmsandbox.yaml, line 1: `hosts` is never taken from a project file" in captured.err
    assert "2 of 4 files have problems" in captured.err


def test_ls_says_a_broken_config_in_a_line_and_lists_the_sessions(
    capsys: pytest.CaptureFixture[str], isolated_dirs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vmsandbox.session import state

    user = isolated_dirs / "config" / "config.yaml"
    user.write_text("libvirt_uri: qemu+ssh://me@lab/system\ncpus: many\nmemroy: 2G\n")
    asked: list[str] = []

    def listing(uri: str) -> tuple[list[state.Status], list[state.Damaged]]:
        asked.append(uri)
        return [], [state.Damaged("exp1", "its record is damaged", None)]

    monkeypatch.setattr(state, "listing", listing)
    assert run_cli(["ls"]) == 0
    captured = capsys.readouterr()
    assert asked == ["qemu+ssh://me@lab/system"]  # what of the file passes is used
    (warning,) = captured.err.strip().splitlines()
    assert warning.startswith(f"warning: {user}: 2 problems, the first at line 2: `cpus` must be an integer")
    assert warning.endswith("`vmsandbox config validate` lists them")
    assert "exp1" in captured.out and "NAME" in captured.out


def test_config_show_says_what_is_broken_and_shows_the_rest(
    capsys: pytest.CaptureFixture[str], isolated_dirs: Path, tmp_path: Path
) -> None:
    (isolated_dirs / "config" / "config.yaml").write_text("memory: 3G\nmass_change_size: 2G\ncpus: 0\naccel: xen\n")
    assert run_cli(["config", "show", str(tmp_path), "--json"]) == 0
    captured = capsys.readouterr()
    rows = {r["key"]: r for r in map(json.loads, captured.out.splitlines())}
    assert rows["memory"]["value"] == "3072 MiB" and rows["cpus"]["from"] == "default"
    assert rows["mass_change_size"]["value"] == "2048 MiB"  # named as the key is written
    assert "mass_change_size_mib" not in rows
    assert "2 problems:" in captured.err and "line 3: `cpus`" in captured.err and "line 4: `accel`" in captured.err
    assert "left out of the settings shown" in captured.err


def test_doctor_counts_a_broken_config_as_one_failed_check(isolated_dirs: Path, tmp_path: Path) -> None:
    from vmsandbox.session.host import doctor

    (isolated_dirs / "config" / "config.yaml").write_text("memory: 3G\ncpus: 0\nnetwork: opne\n")
    (tmp_path / ".vmsandbox.yaml").write_text("disk: [\n")
    check, settings = doctor.config_check(tmp_path)
    assert (check.name, check.level) == ("config", "fail")
    assert "line 2: `cpus` must be between 1 and 16" in check.detail
    assert "line 3: `network`: unknown network mode 'opne' (did you mean `open`?)" in check.detail
    assert "hint: use allowlist, open or none" in check.detail
    assert ".vmsandbox.yaml, line 1, column" in check.detail and check.fix is not None
    assert settings.memory_mib == 3072  # the other checks run with what passes
    (tmp_path / ".vmsandbox.yaml").write_text("network: open\n")
    (isolated_dirs / "config" / "config.yaml").write_text("memory: 3G\n")
    check, settings = doctor.config_check(tmp_path)
    assert (check.level, settings.network.value) == ("warn", "allowlist")  # untrusted: your own settings
    assert "not trusted" in check.detail
    check, _ = doctor.config_check(None)
    assert check.level == "ok"


def test_inspect_says_when_a_session_was_created_as_a_local_time(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from vmsandbox.core import listing

    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        row = {"name": "exp1", "created": 1796518680.21, "age_seconds": 3, "memory": {"pss_mib": 240}, "publish": []}
        monkeypatch.setattr(listing, "inspect", lambda name: row)
        assert run_cli(["inspect", "exp1"]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[:5] == ["name: exp1", "created: 2026-12-06 00:58:00 UTC", "age_seconds: 3", "memory.pss_mib: 240",
                           "publish: -"]  # fmt: skip
        assert run_cli(["inspect", "exp1", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)[0]["created"] == 1796518680.21  # the seconds, for programs
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_uis_consoles_are_made_at_first_use_once_for_every_thread() -> None:
    """ui.err/ui.out are made when first used (a daemon that only logs never imports rich): until then nothing is
    made; threads that print at once share one console; what is set on it reaches the console."""
    import threading

    from vmsandbox import ui

    later = ui._AtFirstUse(stderr=True)
    assert object.__getattribute__(later, "_made") is None
    made: list[object] = []
    threads = [threading.Thread(target=lambda: made.append(later._console())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 8 and all(m is made[0] for m in made)
    later.quiet = True  # (bench/sync.py silences ui.err so)
    assert made[0].quiet is True  # type: ignore[attr-defined]
    assert later.stderr is True
