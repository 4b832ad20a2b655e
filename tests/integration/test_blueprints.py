"""Agent blueprints, the agent shorthands, published ports, copied-in config files and the opt-in host identity
(ssh-agent, git) — on real VMs (Docker in the guest: test_egress.py, on its session). Blueprint layers are
built once and cached in the data directory by their hash, like the base image."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from vmsandbox.image import blueprint, store
from vmsandbox.session.start import layer

from .conftest import Cli, assert_gone, keep_console_on_failure, unique_name, wait_for


@pytest.fixture(scope="session")
def claude_layer(base_image: store.Image) -> store.Image:
    built, _ = layer.build_layer(blueprint.load("claude"))
    return built


@pytest.fixture(scope="session")
def codex_layer(base_image: store.Image) -> store.Image:
    built, _ = layer.build_layer(blueprint.load("codex"))
    return built


def test_claude_version_in_its_blueprint(cli: Cli, claude_layer: store.Image, owned_name: str, project: Path) -> None:
    r = cli.run(
        "run", "--blueprint", "claude", "--yes", "--name", owned_name, str(project), "--", "claude", "--version"
    )
    assert r.returncode == 0, r.stderr.decode()
    assert re.match(r"^\d+\.\d+\.\d+ \(Claude Code\)$", r.stdout.decode().strip()), r.stdout
    assert_gone(owned_name)


def test_codex_shorthand_passes_args_through(
    cli: Cli, codex_layer: store.Image, owned_name: str, project: Path
) -> None:
    """`vmsandbox codex PATH -- --version` runs `codex <skip-permissions flag> --version` and reviews."""
    r = cli.run("codex", str(project), "--yes", "--name", owned_name, "--", "--version")
    assert r.returncode == 0, r.stderr.decode()
    assert re.match(r"^codex-cli \d+\.\d+\.\d+", r.stdout.decode().strip()), r.stdout
    assert b"No changes in the guest" in r.stderr
    assert_gone(owned_name)


@pytest.fixture(scope="module")
def dev(
    request: pytest.FixtureRequest, base_image: store.Image, cli: Cli, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, int]]:
    """A kept session as a (pretend) sudo user, with guest port 8000 published."""
    project = tmp_path_factory.mktemp("dev") / "web"
    project.mkdir()
    (project / "index.html").write_text("hello from the guest's dev server\n")
    name = unique_name()
    env = cli.env(SUDO_USER="alice", SUDO_UID="1234", SUDO_GID="2345")
    r = cli.run("run", "--keep", "--publish", "8000", "--name", name, str(project), "--", "true", env=env)
    assert r.returncode == 0, r.stderr.decode()
    ports = [json.loads(line) for line in cli.run("port", "ls", name, "--json").stdout.splitlines()]
    yield name, int(ports[0]["host"])
    keep_console_on_failure(request, name)
    cli.run("rm", name, "--discard")
    assert_gone(name)


PERL_SERVER = r"""
use IO::Socket::INET;
my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 8000, Listen => 5, ReuseAddr => 1) or die;
while (my $c = $s->accept) {
    open(my $f, '<', 'index.html'); local $/; my $body = <$f>;
    print $c "HTTP/1.0 200 OK\r\nContent-Length: " . length($body) . "\r\n\r\n" . $body; close $c;
}
"""


def test_a_dev_server_in_the_guest_answers_on_host_loopback(cli: Cli, dev: tuple[str, int]) -> None:
    name, port = dev
    listing = cli.run("port", "ls", name).stdout.decode()
    rows = [line.split(None, 1) for line in listing.splitlines()]
    assert rows == [["GUEST", "PLACES"], ["8000/tcp", f"127.0.0.1:{port}, [::1]:{port}"]], listing
    start = cli.run("exec", name, "--", "sh", "-c", f"setsid perl -e {_sh_quote(PERL_SERVER)} >/dev/null 2>&1 &")
    assert start.returncode == 0, start.stderr.decode()

    def fetch(host: str) -> str | None:
        try:
            with urllib.request.urlopen(f"http://{host}:{port}/", timeout=5) as response:
                return str(response.read().decode())
        except OSError:
            return None

    wait_for(lambda: fetch("127.0.0.1"), 60, "the guest's dev server on the host's 127.0.0.1")
    assert fetch("127.0.0.1") == "hello from the guest's dev server\n"
    if _has_ipv6_loopback():
        assert fetch("[::1]") == "hello from the guest's dev server\n"
    assert _listening_addresses(port) <= {"127.0.0.1", "::1"}  # loopback only


def _listening_addresses(port: int) -> set[str]:
    """The local addresses listening on port, from /proc/net/tcp{,6}."""
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            local, _remote, state = line.split()[1:4]
            address, port_hex = local.split(":")
            if state != "0A" or int(port_hex, 16) != port:
                continue
            raw = bytes.fromhex(address)
            if width == 8:
                found.add(socket.inet_ntop(socket.AF_INET, raw[::-1]))
            else:
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                found.add(socket.inet_ntop(socket.AF_INET6, words))
    return found


def test_user_blueprint_extends_base_and_config_is_copied_in_only(
    cli: Cli, base_image: store.Image, owned_name: str, project: Path, tmp_path: Path, ssh_agent: str
) -> None:
    """A user blueprint that extends base and adds a Debian package has its own layer (over this base, built
    once and then found by its hash, like the agents' layers: building it cost ~4 minutes of CI); the
    config file it names is copied in, changed in the guest, and the host copy stays as it was. With
    --git-identity and --ssh-agent the guest sees the host user's git name and can use (not read) the agent's
    key."""
    config_dir = tmp_path / "config"
    (config_dir / "blueprints").mkdir(parents=True)
    (config_dir / "blueprints" / "mine.yaml").write_text(
        "extends: base\napt: [jq]\ncopy: [~/.config/tool/settings.json]\nenv: {MINE: 'yes'}\n"
    )
    home = tmp_path / "home"
    (home / ".config" / "tool").mkdir(parents=True)
    settings_file = home / ".config" / "tool" / "settings.json"
    settings_file.write_text('{"theme": "dark"}\n')
    (home / ".gitconfig").write_text("[user]\n\tname = Host Person\n\temail = host@example.test\n")
    env = cli.env(VMSANDBOX_CONFIG_DIR=str(config_dir), HOME=str(home), SSH_AUTH_SOCK=ssh_agent)
    script = (
        'jq --version; echo $MINE; cat ~/.config/tool/settings.json; echo \'{"theme": "light"}\' >'
        " ~/.config/tool/settings.json; git config --global user.name; ssh-add -l | wc -l"
    )
    r = cli.run(
        "run", "--blueprint", "mine", "--git-identity", "--ssh-agent", "--yes", "--name", owned_name,
        str(project), "--", "sh", "-c", script, env=env, timeout=1800,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr.decode()
    lines = r.stdout.decode().splitlines()
    assert lines[0].startswith("jq-"), lines
    assert lines[1:] == ["yes", '{"theme": "dark"}', "Host Person", "1"], lines
    assert settings_file.read_text() == '{"theme": "dark"}\n'  # never written back
    assert b"No changes in the guest" in r.stderr  # and not part of the review
    assert_gone(owned_name)
    images = [json.loads(line) for line in cli.run("image", "ls", "--json").stdout.splitlines()]
    assert [i["kind"] for i in images if i.get("base") == base_image.version].count("blueprint mine") == 1


@pytest.fixture
def ssh_agent(tmp_path: Path) -> Iterator[str]:
    """An ssh-agent holding one fresh key; its socket path."""
    sock = tmp_path / "agent.sock"
    out = subprocess.run(["ssh-agent", "-a", str(sock)], check=True, capture_output=True, text=True).stdout
    pid = int(re.search(r"SSH_AGENT_PID=(\d+)", out).group(1))  # type: ignore[union-attr]
    try:
        key = tmp_path / "id_test"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        env = {**os.environ, "SSH_AUTH_SOCK": str(sock)}
        subprocess.run(["ssh-add", str(key)], check=True, capture_output=True, env=env)
        yield str(sock)
    finally:
        os.kill(pid, 15)


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"
