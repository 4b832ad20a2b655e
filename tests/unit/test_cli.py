from __future__ import annotations

from pathlib import Path

import pytest

from vmsandbox import cli


def run_cli(args: list[str]) -> int:
    with pytest.raises(SystemExit) as exc:
        cli.main(args)
    return int(exc.value.code or 0)


def test_refuses_root_with_a_hint(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["run", "/", "--", "true"]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert "too broad" in err and "hint:" in err


def test_missing_path(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert run_cli(["run", str(tmp_path / "missing")]) == cli.EXIT_ERROR
    assert "does not exist" in capsys.readouterr().err


def test_exec_needs_a_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["exec", "s1"]) == cli.EXIT_ERROR
    assert "after `--`" in capsys.readouterr().err


def test_bad_flag_value_names_it(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert run_cli(["run", str(tmp_path), "--memory", "lots", "--", "true"]) == cli.EXIT_ERROR
    assert "--memory" in capsys.readouterr().err


def test_unknown_session(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["logs", "ghost"]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert "no session named 'ghost'" in err and "vmsandbox ls" in err


def test_usage_error_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["run", "--cpus", "many"]) == 2
    assert "--cpus" in capsys.readouterr().err


def test_command_after_double_dash_is_not_the_path(capsys: pytest.CaptureFixture[str]) -> None:
    # `vmsandbox run -- ls /` must not take `ls` as PATH: PATH defaults to the current directory.
    assert run_cli(["image", "ls", "--json"]) == 0
    assert capsys.readouterr().out.strip() == "[]"
