"""Blueprints as data: the shipped ones load, user and project ones extend them, bad ones name file and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from vmsandbox import trust
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest import bootfiles
from vmsandbox.image import blueprint
from vmsandbox.session.host.trust import trust_candidates


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.mark.parametrize("name", ["claude", "codex", "gemini", "opencode"])
def test_shipped_agents_declare_what_a_session_needs(name: str) -> None:
    bp = blueprint.load(name)
    assert bp.needs_layer and bp.npm and bp.node and bp.node >= 22
    assert bp.command and bp.chain[0].endswith("base.yaml")
    assert "registry.npmjs.org" in bp.allow  # from base
    assert bp.secrets and all(s["required"] is False for s in bp.secrets)
    assert all(c.startswith("~/") for c in bp.copy)


def test_agent_argv_puts_the_skip_flag_before_the_users_args() -> None:
    assert blueprint.load("claude").agent_argv(["-p", "hi"]) == ["claude", "--dangerously-skip-permissions", "-p", "hi"]
    with pytest.raises(VmsandboxError, match="no agent command"):
        blueprint.load("base").agent_argv([])


def test_user_blueprint_extends_and_adds(isolated_dirs: Path) -> None:
    write(
        isolated_dirs / "config" / "blueprints" / "mine.yaml",
        "extends: claude\napt: [jq]\nallow: [crates.io]\nenv: {A: '1'}\ncommand: [claude, --verbose]\n",
    )
    bp = blueprint.load("mine")
    assert bp.apt == ("jq",) and bp.npm == ("@anthropic-ai/claude-code",)
    assert "crates.io" in bp.allow and "api.anthropic.com" in bp.allow
    assert bp.env["A"] == "1" and bp.env["IS_SANDBOX"] == "1"
    assert bp.command == ("claude", "--verbose")
    assert bp.layer_hash("v1", "1") != blueprint.load("claude").layer_hash("v1", "1")
    # what does not go into the image does not change its hash
    write(isolated_dirs / "config" / "blueprints" / "mine.yaml", "extends: claude\napt: [jq]\nallow: [x.example]\n")
    assert blueprint.load("mine").layer_hash("v1", "1") == bp.layer_hash("v1", "1")


def test_a_user_blueprint_may_extend_the_builtin_of_the_same_name(isolated_dirs: Path, tmp_path: Path) -> None:
    write(isolated_dirs / "config" / "blueprints" / "claude.yaml", "extends: claude\napt: [ripgrep]\n")
    project = tmp_path / "proj"
    mine = project / ".vmsandbox" / "blueprints" / "claude.yaml"
    write(mine, "extends: claude\nallow: [proj.example]\n")
    with pytest.raises(trust.UntrustedError):  # a cloned repository's blueprint is not used silently
        blueprint.load("claude", project)
    trust.trust(mine, mine.read_bytes())
    bp = blueprint.load("claude", project)
    assert bp.apt == ("ripgrep",) and "proj.example" in bp.allow and bp.npm
    assert len(bp.chain) == 4  # base, built-in claude, user claude, project claude


@pytest.mark.parametrize("linked", [".vmsandbox", ".vmsandbox/blueprints"])
def test_a_project_cannot_borrow_trust_through_a_linked_directory(tmp_path: Path, linked: str) -> None:
    """A cloned repository whose `.vmsandbox` (or `.vmsandbox/blueprints`) links to a trusted project's gets
    neither its blueprints nor a way to trust them: the link is refused, by `run` and by `vmsandbox config trust`."""
    trusted = tmp_path / "trusted"
    mine = trusted / ".vmsandbox" / "blueprints" / "dev.yaml"
    write(mine, "extends: base\nallow: [internal.example]\n")
    trust.trust(mine, mine.read_bytes())
    assert "internal.example" in blueprint.load("dev", trusted).allow
    clone = tmp_path / "clone"
    (clone / linked).parent.mkdir(parents=True, exist_ok=True)
    (clone / linked).symlink_to(trusted / linked)
    with pytest.raises(VmsandboxError, match="is a symlink; a project's config directories must be its own") as err:
        blueprint.load("dev", clone)
    assert str(clone / linked) in err.value.message
    with pytest.raises(VmsandboxError, match="is a symlink"):
        trust_candidates(clone)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("aptt: [jq]\n", "unknown key `aptt`"),
        ("apt: jq\n", "`apt` must be a list of strings"),
        ("apt: ['jq; rm -rf /']\n", "`apt`"),
        ("npm: ['left pad']\n", "`npm`"),
        ("node: 12\n", "`node`"),
        ("copy: [/etc/shadow]\n", "`copy`"),
        ("copy: ['~/../x']\n", "`copy`"),
        ("env: {A: 1}\n", "`env`"),
        ("env: {'A-B': x}\n", "`env`"),
        ("extends: nothere\n", "`extends`"),
        ("extends: bad\n", "`extends`"),
        ("secrets: [{secret: k, host: a.example}]\n", "secrets[0]"),
    ],
)
def test_invalid_blueprints_name_file_and_key(isolated_dirs: Path, text: str, needle: str) -> None:
    f = write(isolated_dirs / "config" / "blueprints" / "bad.yaml", text)
    with pytest.raises(VmsandboxError) as err:
        blueprint.load("bad")
    assert str(f) in err.value.message and needle in err.value.message


def test_unknown_blueprint_lists_the_known_ones() -> None:
    with pytest.raises(VmsandboxError) as err:
        blueprint.load("claud")
    assert err.value.hint is not None and "claude" in err.value.hint


def test_copied_files_keep_their_place_and_get_the_guest_owner(tmp_path: Path) -> None:
    import io
    import tarfile

    home = tmp_path / "home"
    write(home / ".claude" / "settings.json", "{}")
    write(home / ".claude" / "commands" / "a.md", "a")
    (home / ".claude" / "commands" / "link").symlink_to("/etc/passwd")
    owner = bootfiles.GuestUser("alice", 1234, 2345)
    bundle = bootfiles.Bundle(owner)
    for item in ("~/.claude/settings.json", "~/.claude/commands", "~/.missing"):
        bundle.copy_from_home(home, item)
    with tarfile.open(fileobj=io.BytesIO(bundle.close())) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert set(members) == {
        "home/alice/.claude",
        "home/alice/.claude/settings.json",
        "home/alice/.claude/commands",
        "home/alice/.claude/commands/a.md",
    }
    assert all((m.uid, m.gid) == (1234, 2345) for m in members.values())
    assert bundle.copied == ["~/.claude/settings.json", "~/.claude/commands"]


def test_env_lines_refuse_line_breaks() -> None:
    assert bootfiles.env_lines({"A": "1 2"}) == "A=1 2\n"
    with pytest.raises(VmsandboxError):
        bootfiles.env_lines({"A": "x\nB=y"})


def test_a_blueprints_problems_come_in_one_round(isolated_dirs: Path) -> None:
    """Shape, values and `extends` were three rounds (issue 46): now one, each at its own line."""
    f = write(
        isolated_dirs / "config" / "blueprints" / "bad.yaml",
        "extends: claudee\napt: [jq, 'Bad Name']\nallow: ['http://bad']\nnodee: 24\nlogin:\n  fils: [x]\n",
    )
    for attempt in (lambda: blueprint.load("bad"), lambda: blueprint.check_file(f)):
        with pytest.raises(VmsandboxError) as err:
            attempt()
        said = err.value.message
        assert said.startswith(f"{f}: 6 problems:")
        for line in (
            "line 1: `extends`: no blueprint named 'claudee' (did you mean `claude`?)",
            "line 2: `apt`: 'Bad Name' is not a Debian package name",
            "line 3: `allow[0]`: 'http://bad' is a URL, not a host name",
            "line 4: unknown key `nodee` (did you mean `node`?)",
            "line 5: `login`: missing key `files`",
            "line 6: `login`: unknown key `fils` (did you mean `files`?)",
        ):
            assert line in said, line


def test_a_misspelt_blueprint_name_gets_a_did_you_mean() -> None:
    with pytest.raises(VmsandboxError, match=r"no blueprint named 'claudee' \(did you mean `claude`\?\)"):
        blueprint.load("claudee")


def test_a_duplicated_key_of_a_blueprint_is_said_with_the_others(isolated_dirs: Path) -> None:
    f = write(isolated_dirs / "config" / "blueprints" / "bad.yaml", "apt: [jq]\nnode: 12\napt: [rg]\n")
    with pytest.raises(VmsandboxError) as err:
        blueprint.check_file(f)
    assert "line 2: `node`" in err.value.message
    assert "line 3: the key `apt` is given twice (first on line 1)" in err.value.message


# One rule for a value wherever it may be written: a bad value of each key a config file and a blueprint both
# take, refused by both in the same words.
SHARED_BAD = {
    "allow": ("allow: ['http://bad', 'a b', '*.com']\n", ["'http://bad' is a URL", "bad allowlist entry", "too broad"]),
    "secrets": ("secrets: [{secret: k, host: 10.0.0.1, header: x}]\n", ["`secrets[0]`: `host`: IP literals"]),
}


@pytest.mark.parametrize("key", sorted(SHARED_BAD))
def test_a_value_is_held_to_one_rule_in_a_config_and_in_a_blueprint(tmp_path: Path, key: str) -> None:
    from vmsandbox.filemodels import BlueprintFile, keys
    from vmsandbox.session import settings
    from vmsandbox.session.settingrows import ConfigFile

    assert set(keys(ConfigFile)) & set(keys(BlueprintFile)) == set(SHARED_BAD)  # a new shared key needs a case
    text, needles = SHARED_BAD[key]
    as_config = write(tmp_path / "proj" / ".vmsandbox.yaml", text)
    as_blueprint = write(tmp_path / "blueprints" / "b.yaml", text)
    with pytest.raises(VmsandboxError) as by_config:
        settings.read_file(as_config, settings.Settings())
    with pytest.raises(VmsandboxError) as by_blueprint:
        blueprint.check_file(as_blueprint)
    for needle in needles:
        assert needle in by_config.value.message and needle in by_blueprint.value.message, needle
    shown = [m.value.message.split(": ", 1)[1] for m in (by_config, by_blueprint)]
    assert shown[0] == shown[1]  # the same words, past the file's name
