"""Tests that share one booted VM: they only read from it (or use throwaway files)."""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from vmsandbox import paths
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest import channel, ssh
from vmsandbox.image import store
from vmsandbox.session.record import Record

from .conftest import CLI_POLL, Cli, wait_for


def test_uname_over_ssh_through_loopback_forward(shared: Record, base_image: store.Image) -> None:
    """The foundation's done-when: boot the image under libvirt, read `uname -r` over SSH on 127.0.0.1."""
    link = channel.connect(shared.endpoint())
    try:
        assert link.transport.getpeername()[0] == "127.0.0.1"
        status, out = link.run("uname -r")
        assert status == 0 and out.decode().strip() == base_image.manifest["kernel_version"]
    finally:
        link.close()


def test_exit_code_and_separate_streams(shared: Record, cli: Cli) -> None:
    r = cli.run("exec", shared.name, "--", "sh", "-c", "echo to-out; echo to-err >&2; exit 7")
    assert r.returncode == 7
    assert r.stdout == b"to-out\n"
    assert b"to-err" in r.stderr and b"to-out" not in r.stderr


def test_stdin_reaches_the_command_byte_for_byte(shared: Record, cli: Cli) -> None:
    payload = os.urandom(200_000)
    r = cli.run("exec", shared.name, "--", "cat", input=payload)
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout == payload


def test_arguments_are_passed_as_argv(shared: Record, cli: Cli) -> None:
    r = cli.run("exec", shared.name, "--", "printf", "%s|", "a b", "$HOME", "it's")
    assert r.stdout == b"a b|$HOME|it's|"


def test_identity_hostname_user_and_workdir(shared: Record, cli: Cli) -> None:
    r = cli.run("exec", shared.name, "--", "sh", "-c", "hostname; id -un; id -u; id -g; pwd")
    host_user = pwd.getpwuid(os.getuid())
    assert r.stdout.decode().splitlines() == [
        f"vmsandbox-{shared.name}",
        host_user.pw_name,
        str(os.getuid()),
        str(os.getgid()),
        shared.project,
    ]


def test_ls_json(shared: Record, cli: Cli) -> None:
    rows = {row["name"]: row for row in cli.ls()}
    row = rows[shared.name]
    assert row["state"] == "running"
    assert row["ports"] == {"ssh": shared.ssh_port}
    assert row["accel"] == shared.accel
    assert row["project"] == shared.project
    assert row["memory_mib"] == shared.memory_mib
    assert isinstance(row["age_seconds"], int) and row["age_seconds"] >= 0


def test_duplicate_name_is_refused_and_leaves_the_session_alone(shared: Record, cli: Cli, tmp_path: Path) -> None:
    r = cli.run("run", "--name", shared.name, str(tmp_path), "--", "true")
    assert r.returncode == 125
    assert b"already exists" in r.stderr
    assert paths.session_paths(shared.name).overlay.exists()
    assert cli.run("exec", shared.name, "--", "true").returncode == 0


def test_guest_cannot_reach_the_hosts_loopback(shared: Record, cli: Cli) -> None:
    """slirp maps 10.0.2.2 to the host's 127.0.0.1; restrict=on must cut that off. Only loopback-mapped
    addresses are probed, so even a broken build sends nothing off this machine."""
    seen: list[object] = []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, peer = listener.accept()
            except TimeoutError:
                continue
            seen.append(peer)
            conn.close()

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        probe = (
            f"timeout 8 bash -c 'exec 3<>/dev/tcp/10.0.2.2/{port}' 2>/dev/null && echo CONNECTED || echo BLOCKED;"
            " ip route show default | grep -q . && echo HAS-DEFAULT-ROUTE || echo NO-DEFAULT-ROUTE"
        )
        r = cli.run("exec", shared.name, "--", "sh", "-c", probe)
        assert r.stdout.decode().split() == ["BLOCKED", "NO-DEFAULT-ROUTE"]
    finally:
        stop.set()
        t.join()
        listener.close()
    assert seen == []


def test_pinned_host_key_is_enforced(shared: Record, tmp_path: Path) -> None:
    """A known_hosts with another key for the same [127.0.0.1]:port must be refused by paramiko and ssh."""
    fake = paths.SessionPaths(tmp_path)
    shutil.copyfile(shared.files.client_key, fake.client_key)
    fake.client_key.chmod(0o600)
    other = ssh.generate_key(tmp_path / "other_host_key", "impostor")
    ssh.write_known_hosts(fake, shared.ssh_port, other)
    wrong = ssh.Endpoint(shared.name, shared.ssh_port, shared.user, fake)
    with pytest.raises(VmsandboxError, match="does not match the pinned one"):
        channel.connect(wrong)
    wrong.write_config()
    r = subprocess.run([*wrong.ssh_argv("-T"), "true"], capture_output=True, check=False, timeout=60)
    assert r.returncode == 255
    assert b"Host key verification failed" in r.stderr
    # and the real pinned key works with the same client key
    channel.connect(shared.endpoint()).close()


def test_logs_console(shared: Record, cli: Cli) -> None:
    """`logs` prints the guest's serial console: what the guest writes to ttyS0 shows up, line by line, with
    the console's carriage returns gone."""
    marker = f"console-marker-{secrets.token_hex(4)}"
    r = cli.run("exec", shared.name, "--", "sudo", "sh", "-c", f"echo {marker} > /dev/ttyS0")
    assert r.returncode == 0, r.stderr.decode()
    wait_for(lambda: marker.encode() in cli.run("logs", shared.name).stdout, 30, "the marker", every=CLI_POLL)
    out = cli.run("logs", shared.name).stdout
    assert f"{marker}\n".encode() in out and b"\r" not in out


def test_doctor_passes_here(cli: Cli) -> None:
    r = cli.run("doctor", "--json")
    assert r.returncode == 0, r.stdout.decode()
    checks = {c["name"]: c for c in [json.loads(line) for line in r.stdout.splitlines()]}
    if "KVM" not in checks["accelerator"]["detail"]:  # the fallback is no success: a warning with a fix
        assert checks["accelerator"]["level"] == "warn" and checks["accelerator"]["fix"]
    text = cli.run("doctor")  # the report is the output: `vmsandbox doctor | less` shows it
    assert b"accelerator:" in text.stdout and b"libvirt:" in text.stdout and b"accelerator" not in text.stderr


def test_ls_lists_sessions_when_libvirt_does_not_answer(shared: Record, cli: Cli) -> None:
    """Like `limactl list`: what the records say is still shown (state unknown), with a warning that names
    the setting to check when the URI is not the default one."""
    bogus = "qemu+unix:///system?socket=/nonexistent/libvirt-sock"
    r = cli.run("ls", "--json", env=cli.env(VMSANDBOX_LIBVIRT_URI=bogus))
    assert r.returncode == 0, r.stderr.decode()
    mine = [s for s in [json.loads(line) for line in r.stdout.splitlines()] if s["name"] == shared.name]
    assert [s["state"] for s in mine] == ["unknown"]
    err = r.stderr.decode()
    assert "cannot connect to libvirt" in err and "libvirt_uri" in err
    plain = cli.run("ls", "-q", env=cli.env(VMSANDBOX_LIBVIRT_URI=bogus))
    assert shared.name in plain.stdout.decode().split()


def test_the_base_has_what_agents_reach_for(shared: Record, cli: Cli) -> None:
    """`vmsandbox run . -- make test` and the first things agents try work in a default session."""
    script = (
        "set -e; python3 -c 'import sys; print(sys.version_info[0])'; make --version | head -1; "
        "cc --version | head -1; rg --version | head -1; jq --version; unzip -v | head -1; file --version | head -1; "
        "patch --version | head -1; ssh -V 2>&1; pip3 --version; "
        # a venv, and what seeds its pip (python3-venv's ensurepip; seeding it takes ~90 s under TCG)
        "python3 -m venv --without-pip /tmp/venv-probe && /tmp/venv-probe/bin/python -c "
        "'import ensurepip; print(\"ensurepip\", ensurepip.version())'"
    )
    r = cli.run("exec", shared.name, "--", "sh", "-c", script)
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode()
    for expected in (
        "3\n",
        "GNU Make",
        "cc (Debian",
        "ripgrep",
        "jq-",
        "UnZip",
        "file-",
        "GNU patch",
        "OpenSSH",
        "pip ",
        "ensurepip ",
    ):
        assert expected in out, (expected, out)


def test_the_egress_daemon_runs_as_an_account_of_its_own(shared: Record, cli: Cli) -> None:
    """Run by root, the daemon that parses what the guest sends is not root: a uid no account has, no groups,
    no capabilities, no_new_privs (run by a plain user, it is that user: there is nothing to drop); either way
    it still opens the guest's door, answers, and logs through the files it opened before it dropped root."""
    from vmsandbox.egress import account, control
    from vmsandbox.egress.control import Door

    st = control.daemon_state(shared.files)
    assert st is not None and st.alive and st.pid is not None and st.forward is Door.UP
    status = dict(line.split(":", 1) for line in Path(f"/proc/{st.pid}/status").read_text().splitlines())
    uids, gids = set(status["Uid"].split()), set(status["Gid"].split())
    if os.geteuid() != 0:
        assert uids == {str(os.geteuid())} and int(status["CapEff"], 16) == 0, status["Uid"]
    else:
        assert len(uids) == 1 and int(uids.pop()) in account.UIDS, status["Uid"]
        assert len(gids) == 1 and int(gids.pop()) in account.UIDS, status["Gid"]
        assert status["Groups"].split() == [] and int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0
        assert status["NoNewPrivs"].strip() == "1"
    r = cli.run("exec", shared.name, "--", "curl", "-sS", "-m", "20", "-o", "/dev/null", "-w", "%{http_code}",
                "http://not-allowed.invalid/dropped")  # fmt: skip
    assert r.stdout == b"403", r.stderr.decode()
    assert "not-allowed.invalid" in shared.files.proxy_log.read_text()


def test_shell_and_exec_run_what_follows_the_name_as_limactl_and_docker_do(shared: Record, cli: Cli) -> None:
    r = cli.run("shell", shared.name, "sh", "-c", "echo out; pwd; exit 3")
    assert r.returncode == 3, r.stderr.decode()
    assert r.stdout.decode().splitlines() == ["out", shared.project]
    r = cli.run("exec", shared.name, "uname", "-a")  # without `--`, as docker's: options after NAME are its
    assert r.returncode == 0 and r.stdout.startswith(b"Linux "), r.stderr.decode()
    assert cli.run("exec", shared.name, "true").returncode == 0
    r = cli.run("exec", "-it", shared.name, "--", "true")  # docker's -it (no terminal here: ssh runs it without)
    assert r.returncode == 0, r.stderr.decode()
    r = cli.run("inspect", "-f", "{{.State}}", shared.name)  # docker's -f
    assert (r.returncode, r.stdout) == (0, b"running\n"), r.stderr.decode()
    r = cli.run("ssh", shared.name, "uname", "-a")  # an old name: no command, its hint names one, nothing run
    assert (r.returncode, r.stdout) == (2, b"") and b"`vmsandbox shell NAME`" in r.stderr, r.stderr.decode()
    words = cli.run("ls", "-q", "--", "rm", "-rf", "/")  # a command that runs none takes no command
    assert words.returncode == 2 and b"unexpected extra argument" in words.stderr


def test_an_ssh_client_connects_with_only_the_printed_ssh_config(shared: Record, cli: Cli, tmp_path: Path) -> None:
    r = cli.run("inspect", "--format", "ssh-config", shared.name)
    assert r.returncode == 0, r.stderr.decode()
    config = tmp_path / "editor_ssh_config"
    config.write_bytes(r.stdout)  # as an editor would have it in ~/.ssh/config: nothing else
    host = f"vmsandbox-{shared.name}"
    got = subprocess.run(
        ["ssh", "-F", str(config), "-o", "BatchMode=yes", host, "cat /etc/hostname; id -un"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == [host, shared.user]
    assert "ControlPath" not in r.stdout.decode()  # vmsandbox's own connection socket is not the editor's


def test_cp_copies_host_files_into_the_guest(shared: Record, cli: Cli, tmp_path: Path) -> None:
    src = tmp_path / "fixtures"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "data.txt").write_text("payload\n")
    single = tmp_path / "one file.txt"
    single.write_text("single\n")
    dash = tmp_path / "-e.txt"  # a name rsync would have taken for its -e option
    dash.write_text("dash\n")
    r = cli.run("cp", str(src), str(single), str(dash), f"{shared.name}:/tmp/cp-test/")
    assert r.returncode == 0, r.stderr.decode()
    script = "cd /tmp/cp-test && cat fixtures/sub/data.txt 'one file.txt' ./-e.txt && stat -c %U fixtures/sub/data.txt"
    out = cli.run("exec", shared.name, "--", "sh", "-c", script)
    assert out.stdout.decode().split("\n")[:4] == ["payload", "single", "dash", shared.user], out.stderr.decode()
    cli.run("exec", shared.name, "--", "rm", "-rf", "/tmp/cp-test")
    refused = cli.run("cp", str(single), shared.name)  # no NAME:PATH; and nothing ever copies out
    assert refused.returncode == 2 and b"NAME:PATH" in refused.stderr


def test_inspect_and_ls_with_a_filter_and_a_format(shared: Record, cli: Cli) -> None:
    r = cli.run("inspect", shared.name, "--json")
    assert r.returncode == 0, r.stderr.decode()
    (seen,) = json.loads(r.stdout)  # an array, as docker inspect
    assert seen["state"] == "running" and seen["ports"]["ssh"] == shared.ssh_port
    assert Path(seen["files"]["ssh_config"]).exists()
    listed = cli.run("ls", "--filter", f"name={shared.name},state=running", "--format", "{{.Name}} {{.Ports.ssh}}")
    assert listed.stdout.decode().splitlines() == [f"{shared.name} {shared.ssh_port}"], listed.stderr.decode()
    old = cli.run("ls", "--format", "{name} {ports[ssh]}")  # a Python format string names no field: refused
    assert old.returncode == 2 and old.stdout == b"" and b"{{.Name}}" in old.stderr, old.stderr.decode()
    assert cli.run("ls", "-q", "--filter", f"name={shared.name},state=stopped").stdout == b""
