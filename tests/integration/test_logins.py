"""Logins that outlive a session, with a stand-in agent (the real sign-in services cannot be reached here): its
sign-in writes a token into the guest's home, as Claude's `/login` or `codex login` write theirs."""

from __future__ import annotations

from pathlib import Path

from .conftest import Cli, assert_gone

STANDIN = """\
description: a stand-in agent whose sign-in writes a token, as a real agent's does
extends: base
command: [sh, -c, "cat ~/.standin/auth.json 2>/dev/null || echo signed-out"]
login:
  files: [.standin/auth.json]
  command: [sh, -c, "mkdir -p ~/.standin && od -An -tx1 -N12 /dev/urandom | tr -dc 0-9a-f > ~/.standin/auth.json"]
"""


def test_a_login_is_kept_and_later_sessions_start_signed_in(cli: Cli, tmp_path: Path, owned_name: str) -> None:
    config = tmp_path / "config"
    (config / "blueprints").mkdir(parents=True)
    (config / "blueprints" / "standin.yaml").write_text(STANDIN)
    env = cli.env(VMSANDBOX_CONFIG_DIR=str(config))
    signed = cli.run("login", "add", "standin", env=env)  # a disposable VM runs the stand-in's sign-in
    assert signed.returncode == 0, signed.stderr.decode()
    kept = config / "logins" / "standin" / ".standin" / "auth.json"
    token = kept.read_text()
    assert len(token) == 24 and token.isalnum(), token
    assert oct(kept.stat().st_mode & 0o777) == "0o600"
    assert all(oct(d.stat().st_mode & 0o777) == "0o700" for d in (kept.parent, kept.parent.parent, config / "logins"))
    assert not any(str(r["project"]).startswith("/tmp/vmsandbox-login-") for r in cli.ls())  # its VM is gone

    project = tmp_path / "project"
    project.mkdir()
    first = cli.run(
        "run", "--blueprint", "standin", str(project), "--", "sh", "-c", "cat ~/.standin/auth.json", env=env
    )
    assert first.returncode == 0, first.stderr.decode()
    assert first.stdout.decode() == token  # started signed in: nobody logged in in this session
    assert b"standin's login" in first.stderr

    # refreshed inside a session without a terminal: nobody was asked, so nothing of the guest's is kept
    script = "echo refreshed > ~/.standin/auth.json"
    kept_run = cli.run(
        "run", "--blueprint", "standin", "--keep", "--name", owned_name, str(project), "--", "sh", "-c", script, env=env
    )
    assert kept_run.returncode == 0, kept_run.stderr.decode()
    assert kept.read_text() == token
    taken = cli.run("login", "add", "standin", "--from", owned_name, env=env)  # the person's word: keep that one
    assert taken.returncode == 0, taken.stderr.decode()
    assert kept.read_text() == "refreshed\n"
    assert cli.run("rm", owned_name, "--discard", env=env).returncode == 0
    assert_gone(owned_name)

    forgot = cli.run("login", "rm", "standin", env=env)
    assert forgot.returncode == 0 and not kept.exists()
    again = cli.run(
        "run",
        "--blueprint",
        "standin",
        str(project),
        "--",
        "sh",
        "-c",
        "cat ~/.standin/auth.json || echo none",
        env=env,
    )
    assert again.stdout.decode().strip() == "none"
