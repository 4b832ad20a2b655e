from __future__ import annotations

from pathlib import Path

import pytest

from vmsandbox.cli import base
from vmsandbox.cli import main as cli


def run_cli(args: list[str]) -> int:
    with pytest.raises(SystemExit) as exc:
        cli.main(args)
    return int(exc.value.code or 0)


def test_refuses_root_with_a_hint(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["run", "/", "--", "true"]) == base.EXIT_ERROR
    err = capsys.readouterr().err
    assert "too broad" in err and "hint:" in err


def test_missing_path(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert run_cli(["run", str(tmp_path / "missing")]) == base.EXIT_ERROR
    assert "does not exist" in capsys.readouterr().err


def test_exec_needs_a_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["exec", "s1"]) == base.EXIT_ERROR
    assert "after `--`" in capsys.readouterr().err


def test_bad_flag_value_names_it(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert run_cli(["run", str(tmp_path), "--memory", "lots", "--", "true"]) == base.EXIT_ERROR
    assert "--memory" in capsys.readouterr().err


def test_unknown_session(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["logs", "ghost"]) == base.EXIT_ERROR
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
    assert run_cli(["run", "--", "ls", "/"]) == base.EXIT_ERROR
    assert Invocation.command == ["ls", "/"]
    err = capsys.readouterr().err
    assert ".vmsandbox.yaml is not trusted" in err and "`vmsandbox trust .`" in err  # PATH was "."


def test_missing_secret_stops_run_before_anything_is_made(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / ".vmsandbox.yaml").write_text(
        "secrets:\n  - {secret: my-key, host: api.example.com, header: x-api-key, env: MY_KEY}\n"
    )
    assert run_cli(["run", str(tmp_path), "--", "true"]) == base.EXIT_ERROR
    assert "not trusted" in capsys.readouterr().err
    assert run_cli(["trust", "--yes", str(tmp_path)]) == 0
    assert "your secret my-key goes to api.example.com" in capsys.readouterr().err
    assert run_cli(["run", str(tmp_path), "--", "true"]) == base.EXIT_ERROR
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
    assert run_cli(["secret", "rm", "api"]) == base.EXIT_ERROR
    assert run_cli(["secret", "set", "../escape"]) == base.EXIT_ERROR


def test_bad_network_flags_name_them(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert run_cli(["run", str(tmp_path), "--network", "wide", "--", "true"]) == base.EXIT_ERROR
    assert "--network" in capsys.readouterr().err
    assert run_cli(["run", str(tmp_path), "--allow", "10.0.0.1", "--", "true"]) == base.EXIT_ERROR
    assert "--allow" in capsys.readouterr().err


def test_bad_publish_specs_are_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for spec, extra in (("web", []), ("70000", []), ("8080:0", []), ("3000", ["--publish-address", "nowhere"])):
        assert run_cli(["run", str(tmp_path), "--publish", spec, *extra, "--", "true"]) == base.EXIT_ERROR
        assert "--publish" in capsys.readouterr().err


def test_agent_shorthands_exist_with_runs_options(capsys: pytest.CaptureFixture[str]) -> None:
    from vmsandbox.cli.run import AGENTS

    for agent in AGENTS:
        assert run_cli([agent, "--help"]) == 0
        out = capsys.readouterr().out
        assert "--publish" in out and "--blueprint" not in out and agent in out


def test_trust_shows_and_refuses_without_a_terminal_or_yes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from vmsandbox import trust

    (tmp_path / ".vmsandbox.yaml").write_text("network: open\nallow: [evil.example]\n")
    assert run_cli(["trust", str(tmp_path)]) == base.EXIT_ERROR
    err = capsys.readouterr().err
    assert "network" in err and "--yes" in err
    assert not trust.records()


def test_trust_shows_what_a_config_changes_escaped(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / ".vmsandbox.yaml").write_text("cpus: 2\nnetwork: open\nallow: [evil.example]\n")
    assert run_cli(["trust", "--yes", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert 'network: "open"   (now: "allowlist")' in err
    assert "cpus: 2   (sizes the VM: needs no trust)" in err
    assert run_cli(["trust", str(tmp_path)]) == 0  # trusted already: nothing to ask
    assert "trusted already" in capsys.readouterr().err
