"""Egress from inside a real VM: one door out (the session's proxy), the allowlist, secrets injected on the
host, `clean`, and the proxy dying. Every upstream is a 127.0.0.1 stand-in on the host: the session's egress
daemon is replaced by the stand-in daemon (the product's daemon with a test resolver and the test CA
injected; the product itself has no test switch); refused requests are aimed at a recording listener that
must stay silent."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from secrets import token_hex

import pytest

from vmsandbox import paths
from vmsandbox.egress import control, secrets
from vmsandbox.egress.control import Door
from vmsandbox.session.record import Record

from .conftest import SUDO_PLAYED, Cli, VmFactory, guest_sh, played_user, suite_settings, wait_for
from .standins import Recorder, Upstream, http_upstream, make_ca, standin, use_standin_daemon

HTTP, TLS, API = standin("http"), standin("tls"), standin("api")


@dataclass
class Guest:
    record: Record
    cli: Cli
    secret_name: str
    secret: str
    http: Upstream
    tls: Upstream
    api: Upstream
    recorder: Recorder
    ca_file: str  # the upstream test CA, inside the guest's project
    ca: Path  # the same, on the host
    standin_pid: int | None = None

    def standins(self) -> None:
        """The stand-in egress daemon, unless it serves the session already (a test may have restarted the
        product's own)."""
        state = control.daemon_state(self.record.files)
        if state is not None and state.alive and state.pid == self.standin_pid:
            return
        env = self.cli.env(VMSANDBOX_CONFIG_DIR=os.environ["VMSANDBOX_CONFIG_DIR"])
        upstreams = [self.http, self.tls, self.api]
        self.standin_pid = use_standin_daemon(self.record.name, self.record.files.root, upstreams, self.ca, env)

    def sh(self, script: str, *, user: str | None = None) -> subprocess.CompletedProcess[bytes]:
        argv = ["exec", self.record.name, "--", "sh", "-c", script]
        if user == "root":
            argv = ["exec", self.record.name, "--", "sudo", "-E", "sh", "-c", script]
        return self.cli.run(*argv, timeout=180)

    def events(self) -> list[dict[str, object]]:
        r = self.cli.run("policy", "log", self.record.name, "--json")
        assert r.returncode == 0, r.stderr.decode()
        return [json.loads(line) for line in r.stdout.decode().splitlines()]


ALICE = SUDO_PLAYED  # the invoking user the session plays (as under `sudo`): not root in the guest


@pytest.fixture(scope="module")
def guest(module_vms: VmFactory, cli: Cli, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guest]:
    tmp = tmp_path_factory.mktemp("egress")
    ca = make_ca(tmp / "ca", "upstream-ca", [TLS, API])
    project = tmp / "project"
    project.mkdir()
    (project / "upstream-ca.pem").write_bytes(ca.cert.read_bytes())
    (project / "notes.txt").write_text("keep me\n")
    recorder = Recorder()
    secret_name = "it-api-key"
    secret = "it-secret-" + token_hex(12)
    saved = os.environ.get("VMSANDBOX_CONFIG_DIR")
    with (
        http_upstream(HTTP) as plain,
        http_upstream(TLS, ca.server_context(TLS)) as tls,
        http_upstream(API, ca.server_context(API)) as api,
    ):
        os.environ["VMSANDBOX_CONFIG_DIR"] = str(tmp / "config")
        secrets.put(secret_name, secret)
        settings = suite_settings().merged(
            {
                "allow": [HTTP, TLS, f"localhost:{recorder.port}"],
                "secrets": [{"secret": secret_name, "host": API, "header": "x-api-key", "env": "IT_KEY"}],
            },
            "test",
        )
        record = module_vms.make(project, settings=settings, user=ALICE)
        g = Guest(
            record, cli, secret_name, secret, plain, tls, api, recorder, str(project / "upstream-ca.pem"), ca.cert
        )
        try:
            g.standins()
            yield g
        finally:
            module_vms.cleanup()
            recorder.close()
            if saved is None:
                os.environ.pop("VMSANDBOX_CONFIG_DIR", None)
            else:
                os.environ["VMSANDBOX_CONFIG_DIR"] = saved


def test_allowed_hosts_work_through_the_proxy(guest: Guest) -> None:
    guest.standins()
    r = guest.sh(f"curl -sS -m 20 http://{HTTP}/plain && curl -sS -m 20 --cacert {guest.ca_file} https://{TLS}/t")
    assert r.returncode == 0, r.stderr.decode()
    assert f"hello from {HTTP} GET /plain".encode() in r.stdout
    assert f"hello from {TLS} GET /t".encode() in r.stdout
    hosts = {(e["host"], e["decision"]) for e in guest.events()}
    assert {(HTTP, "allow"), (TLS, "allow")} <= hosts


def test_denied_and_loopback_requests_are_refused_and_logged(guest: Guest) -> None:
    port = guest.recorder.port
    r = guest.sh(
        f"for url in https://denied.invalid/ http://127.0.0.1:{port}/ https://localhost:{port}/ "
        f"http://[::1]:{port}/; do "
        "curl -sS -m 20 --noproxy '' -o /dev/null -w '%{http_code} ' \"$url\"; echo \"exit=$?\"; done"
    )
    lines = r.stdout.decode().splitlines()
    assert len(lines) == 4 and all("exit=0" not in line or line.startswith("403") for line in lines), lines
    assert guest.recorder.hits == 0
    denied = [
        (str(e.get("host", e.get("target"))), str(e["reason"])) for e in guest.events() if e["decision"] == "deny"
    ]

    def refused(target: str, why: str) -> bool:
        return any(target in t and why in reason for t, reason in denied)

    assert refused("denied.invalid", "special-use"), denied
    assert refused(f"127.0.0.1:{port}", "IP literal"), denied
    assert refused(f"[::1]:{port}", "IP literal"), denied
    assert refused("localhost", "loopback"), denied
    readable = guest.cli.run("policy", "log", guest.record.name)
    assert b"DENY" in readable.stdout and b"denied.invalid" in readable.stdout


def test_logs_follow_shows_new_decisions(guest: Guest) -> None:
    follower = guest.cli.popen("policy", "log", guest.record.name, "--follow")
    try:
        time.sleep(1.5)
        guest.sh("curl -sS -m 20 -o /dev/null https://follow-me.invalid/")
        assert follower.stdout is not None
        deadline = time.monotonic() + 30
        seen = b""
        while b"follow-me.invalid" not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([follower.stdout], [], [], 1)
            if ready:
                seen += os.read(follower.stdout.fileno(), 65536)
        assert b"DENY" in seen and b"follow-me.invalid" in seen, seen
    finally:
        follower.kill()
        follower.wait()


def test_a_direct_connection_has_no_route(guest: Guest) -> None:
    """Bypassing the proxy: no DNS, and no route even to an address (slirp's host alias 10.0.2.2 would be
    the host's loopback if the network were not restricted: the recorder would see it)."""
    port = guest.recorder.port
    r = guest.sh(
        f"curl -sS -m 10 --noproxy '*' http://{HTTP}/; echo dns=$?; "
        f"curl -sS -m 10 --noproxy '*' --resolve x.test:{port}:10.0.2.2 http://x.test:{port}/; echo route=$?"
    )
    out = r.stdout.decode()
    assert "dns=6" in out and "route=0" not in out, out
    assert guest.recorder.hits == 0


def test_secret_is_injected_on_the_host_and_never_in_the_guest(guest: Guest) -> None:
    guest.standins()
    r = guest.sh(f'curl -sS -m 30 -H "x-api-key: $IT_KEY" https://{API}/v1/messages; echo; echo "key=$IT_KEY"')
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode()
    assert f"hello from {API} GET /v1/messages" in out, r.stderr.decode()
    assert "key=vmsandbox-placeholder-" in out
    assert guest.api.requests[-1]["x-api-key"] == guest.secret
    key_line = paths.session_paths(guest.record.name).ca_key.read_text().splitlines()[1]
    patterns = f"{guest.secret}\n{key_line}\n"
    search = (  # the needles come in on stdin: on a command line they would be in /proc themselves
        "umask 077; cat > /tmp/needles; "
        "grep -rlaF -f /tmp/needles --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev / 2>/dev/null"
        " | grep -v '^/tmp/needles$'; "
        "cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | grep -caF -f /tmp/needles; rm -f /tmp/needles"
    )
    found = guest.cli.run(
        "exec", guest.record.name, "--", "sudo", "sh", "-c", search, input=patterns.encode(), timeout=300
    )
    lines = found.stdout.decode().split()
    assert lines == ["0"], f"the secret or the CA key is visible in the guest: {lines}"


ECH_HELLO = r"""
import socket, sys
host = sys.argv[1].encode()
def vec(n, b):
    return len(b).to_bytes(n, "big") + b
sni = vec(2, b"\x00" + vec(2, host))  # the allowed name in the clear; ECH would hide the real one
exts = b"".join(k.to_bytes(2, "big") + vec(2, d) for k, d in [(0x0000, sni), (0xFE0D, bytes(40))])
body = b"\x03\x03" + bytes(32) + vec(1, b"") + vec(2, b"\x13\x01") + vec(1, b"\x00") + vec(2, exts)
s = socket.create_connection(("127.0.0.1", 3128), timeout=30)
s.sendall(b"CONNECT " + host + b":443 HTTP/1.1\r\nHost: " + host + b":443\r\n\r\n")
head = b""
while b"\r\n\r\n" not in head and (got := s.recv(4096)):
    head += got
print(head.split(b"\r\n")[0].decode())
s.sendall(b"\x16\x03\x01" + vec(2, b"\x01" + vec(3, body)))
rest = b""
while got := s.recv(4096):
    rest += got
print("after the hello:", len(rest))
"""


def test_a_guest_gets_no_secret_echoed_and_hides_no_server_name(guest: Guest) -> None:
    """From the real guest: a TRACE to the API host carrying the placeholder is refused before anything goes
    upstream (a TRACE echoes the request, the injected secret with it), and a ClientHello to an allowed host that
    carries Encrypted Client Hello (the name in the clear a decoy) is cut off there; the proxy log says both."""
    guest.standins()
    seen = len(guest.api.requests)
    r = guest.sh(f'curl -sS -m 30 -X TRACE -H "x-api-key: $IT_KEY" -w "\\n%{{http_code}}" https://{API}/echo')
    out = r.stdout.decode()
    assert out.splitlines()[-1] == "403" and "never carries a secret" in out, (out, r.stderr.decode())
    assert guest.secret not in out and len(guest.api.requests) == seen
    tls_seen = len(guest.tls.requests)
    r = guest.sh(f"cat > /tmp/ech.py <<'EOF'\n{ECH_HELLO}\nEOF\npython3 /tmp/ech.py {TLS}")
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode().splitlines() == ["HTTP/1.1 200 Connection established", "after the hello: 0"]
    assert len(guest.tls.requests) == tls_seen
    events = guest.events()
    trace = [e for e in events if e.get("method") == "CONNECT TRACE"]  # a request inside the terminated tunnel
    assert trace and trace[-1]["decision"] == "deny" and not trace[-1].get("secret"), trace
    hidden = [e for e in events if e.get("host") == TLS and "Encrypted Client Hello" in str(e.get("reason"))]
    assert hidden and hidden[-1]["decision"] == "deny", events[-3:]


def test_a_secret_changed_or_removed_reaches_the_running_session(guest: Guest) -> None:
    """`secret set` and `secret rm` restart the egress daemon of each running session that injects the secret (a
    daemon holds only the secrets it was handed when it started, it cannot read the store): the new value is
    injected from then on, and a removed one no more."""
    guest.standins()
    env = guest.cli.env(VMSANDBOX_CONFIG_DIR=os.environ["VMSANDBOX_CONFIG_DIR"])
    restarted = f"session {guest.record.name}: its egress proxy restarted"
    fetch = f'curl -sS -m 30 -H "x-api-key: $IT_KEY" https://{API}/rotated'
    new = "it-rotated-" + token_hex(8)
    try:
        r = guest.cli.run("secret", "set", guest.secret_name, input=new.encode(), env=env)
        assert r.returncode == 0 and restarted in r.stderr.decode(), r.stderr.decode()
        st = control.daemon_state(guest.record.files)
        assert st is not None and st.alive and st.pid != guest.standin_pid and st.forward is Door.UP
        guest.standins()  # the stand-in again, handed the store's value as the product's daemon was
        assert guest.sh(fetch).returncode == 0
        assert guest.api.requests[-1]["x-api-key"] == new
        r = guest.cli.run("secret", "rm", guest.secret_name, env=env)
        assert r.returncode == 0 and restarted in r.stderr.decode(), r.stderr.decode()
        guest.standins()
        seen = len(guest.api.requests)
        out = guest.sh(fetch + " -w '\\n%{http_code}'").stdout.decode()
        assert out.splitlines()[-1] == "502" and f"vmsandbox secret set {guest.secret_name}" in out, out
        assert len(guest.api.requests) == seen and new not in out
    finally:
        secrets.put(guest.secret_name, guest.secret)
        guest.standin_pid = None  # the next test's stand-in is handed the secret again
        guest.standins()


def test_clean_removes_credentials_and_keeps_the_workspace(guest: Guest) -> None:
    r = guest.sh(
        "mkdir -p ~/.claude && echo token > ~/.claude/.credentials.json && echo https://u:p@x > ~/.git-credentials"
        " && sudo mkdir -p /root/.codex && echo t | sudo tee /root/.codex/auth.json >/dev/null"
        " && echo agent-work > agent.txt"
    )
    assert r.returncode == 0, r.stderr.decode()
    before = guest.sh("find . -type f | sort | xargs sha256sum").stdout
    r = guest.cli.run("secret", "wipe", guest.record.name)
    assert r.returncode == 0, r.stderr.decode()
    assert b".credentials.json" in r.stderr and b"auth.json" in r.stderr
    left = guest.sh(
        "ls ~/.claude/.credentials.json ~/.git-credentials 2>&1; sudo ls /root/.codex/auth.json 2>&1;"
        " grep -c IT_KEY /etc/environment"
    )
    assert left.stdout.decode().count("No such file") == 3 and left.stdout.decode().strip().endswith("0")
    assert guest.sh("find . -type f | sort | xargs sha256sum").stdout == before
    # the placeholder a process may still hold is not honoured any more
    guest.standins()
    r = guest.sh(f"curl -sS -m 30 -H 'x-api-key: vmsandbox-placeholder-x' https://{API}/after-clean")
    assert f"hello from {API}".encode() in r.stdout
    assert guest.api.requests[-1]["x-api-key"] == "vmsandbox-placeholder-x"


CONTAINER_IMAGE = r"""
set -e
d=$(mktemp -d)
for f in /usr/bin/curl $(ldd /usr/bin/curl | grep -o '/[^ ]*'); do
    mkdir -p "$d$(dirname "$f")"; cp -L "$f" "$d$f"
done
tar -C "$d" -c . | docker import - vmsandbox-it/curl:1 >/dev/null
printf 'FROM vmsandbox-it/curl:1\nRUN ["/usr/bin/curl", "-sS", "-m", "30", "-o", "/fetched", "http://%s/build"]\n' \
    "$1" > "$d/Dockerfile"
docker build -q -t vmsandbox-it/built:1 - < "$d/Dockerfile" >/dev/null
docker run --rm vmsandbox-it/curl:1 /usr/bin/curl -sS -m 30 "http://$1/run"
"""


def test_containers_reach_the_network_through_the_same_proxy(guest: Guest) -> None:
    """`docker run` and a `docker build` RUN step inside the guest fetch through the session's proxy and its
    allowlist (an image made in the guest from its own curl: nothing is pulled), as the guest user."""
    guest.standins()
    r = guest.sh(f"cat > /tmp/mkimage <<'EOF'\n{CONTAINER_IMAGE}\nEOF\nsh /tmp/mkimage {HTTP}")
    assert r.returncode == 0, (r.stdout.decode(), r.stderr.decode())
    assert f"hello from {HTTP} GET /run".encode() in r.stdout
    paths_seen = [q[":path"] for q in guest.http.requests]
    assert "/run" in paths_seen and "/build" in paths_seen
    assert {(e.get("host"), e["decision"]) for e in guest.events()} >= {(HTTP, "allow")}
    denied = guest.sh(
        "docker run --rm vmsandbox-it/curl:1 /usr/bin/curl -sS -m 30 -o /dev/null "
        "-w '%{http_code}' http://not-allowed.example.com/"
    )
    assert denied.stdout == b"403", (denied.stdout, denied.stderr)


def test_docker_runs_a_local_image_as_root_and_as_the_user(guest: Guest) -> None:
    """Docker in the guest: its own daemon, images on the session's disk, usable by the guest user (in the
    docker group) and by root. (On the egress tests' session: one dockerd start serves both.)"""
    name = guest.record.name
    build = (
        "tar -C / -c usr/bin/echo usr/lib/x86_64-linux-gnu/libc.so.6 usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
        " usr/lib64 lib64 lib | docker import - local/mini:1"
        " >/dev/null && docker info --format '{{.Name}} {{.DockerRootDir}}' && df --output=source /var/lib/docker"
        " | tail -1"
    )
    r = guest.sh(build)
    assert r.returncode == 0, r.stderr.decode()
    info, source = r.stdout.decode().splitlines()
    assert info == f"vmsandbox-{name} /var/lib/docker"  # the guest's own daemon, images on the session's disk
    assert source == "/dev/vda"
    as_user = guest.sh("id -un; docker run --rm local/mini:1 /usr/bin/echo hi-user")
    assert as_user.stdout.decode().splitlines() == [played_user()[0], "hi-user"], as_user.stderr.decode()
    as_root = guest.cli.run(
        "exec", name, "--", "sudo", "docker", "run", "--rm", "local/mini:1", "/usr/bin/echo", "hi-root"
    )
    assert as_root.stdout == b"hi-root\n", as_root.stderr.decode()


def test_allow_and_deny_change_a_running_sessions_allowlist(guest: Guest) -> None:
    """`vmsandbox policy deny` takes a host off the allowlist of the running session (its next request is refused,
    naming the command that allows it again), `vmsandbox policy allow` puts it back; both are in the proxy log."""
    guest.standins()
    name = guest.record.name

    def fetch() -> bytes:
        r = guest.sh(f"curl -sS -m 20 -o /dev/null -w '%{{http_code}}' http://{HTTP}/runtime")
        return r.stdout

    assert fetch() == b"200"
    r = guest.cli.run("policy", "deny", name, HTTP)
    assert r.returncode == 0, r.stderr.decode()
    assert fetch() == b"403"
    refusal = [e for e in guest.events() if e.get("host") == HTTP and e["decision"] == "deny"][-1]
    assert f"vmsandbox policy allow {name} {HTTP}" in str(refusal["reason"])
    again = guest.cli.run("policy", "deny", name, HTTP)
    assert again.returncode != 0 and b"is not in the allowlist" in again.stderr
    r = guest.cli.run("policy", "allow", name, HTTP, "*.example.org")
    assert r.returncode == 0, r.stderr.decode()
    assert fetch() == b"200"
    policy_lines = [str(e["reason"]) for e in guest.events() if e["decision"] == "policy"]
    assert policy_lines[-2:] == [
        f"denied {HTTP} (vmsandbox policy deny)",
        f"allowed {HTTP}, *.example.org (vmsandbox policy allow)",
    ]
    covered = guest.cli.run("policy", "deny", name, "www.example.org")
    assert covered.returncode != 0 and b"*.example.org lets it through" in covered.stderr
    bad = guest.cli.run("policy", "allow", name, "10.0.0.1")
    assert bad.returncode != 0 and b"IP literal" in bad.stderr


def test_a_port_is_published_and_unpublished_while_the_session_runs(guest: Guest) -> None:
    """A guest server bound to its own loopback becomes reachable on the host's 127.0.0.1 after `port NAME
    publish`, without restarting the proxy (a connection through it stays up), and is gone after `unpublish`."""
    guest.standins()
    name = guest.record.name
    before = control.daemon_state(guest.record.files)
    serve = "(setsid python3 -m http.server 8123 --bind 127.0.0.1 </dev/null >/dev/null 2>&1 &)"
    assert guest.sh(serve).returncode == 0
    # listening before it is published (a connection to a guest port nobody listens on is closed, as it should)
    ready = 'for i in $(seq 120); do python3 -c "$PROBE" && exit 0; sleep 0.5; done; exit 1'
    probe = "import socket; socket.create_connection(('127.0.0.1', 8123), 1).close()"
    assert guest.sh(f'PROBE="{probe}"; {ready}').returncode == 0, "the guest's server never listened"
    r = guest.cli.run("port", "publish", name, "8123")
    assert r.returncode == 0, r.stderr.decode()
    listed = [json.loads(line) for line in guest.cli.run("port", "ls", name, "--json").stdout.splitlines()]
    host_port = next(p["host"] for p in listed if p["guest"] == 8123)
    with socket.create_connection(("127.0.0.1", host_port), timeout=30) as conn:
        conn.sendall(b"GET / HTTP/1.0\r\n\r\n")
        assert conn.recv(64).startswith(b"HTTP/1.0 200")
    after = control.daemon_state(guest.record.files)
    assert before is not None and after is not None and after.pid == before.pid  # reloaded, not restarted
    taken = guest.cli.run("port", "publish", name, "8123")
    assert taken.returncode != 0 and b"published already" in taken.stderr
    r = guest.cli.run("port", "rm", name, "8123")
    assert r.returncode == 0, r.stderr.decode()
    wait_for(lambda: not _listening(host_port), 10, "the published port to close")
    assert guest.cli.run("port", "ls", name, "--json").stdout == b""  # no object, no line


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        return False
    return True


def test_proxy_death_fails_closed_and_exec_restarts_it(guest: Guest) -> None:
    guest.standins()
    files = guest.record.files
    state = control.daemon_state(files)
    assert state is not None and state.alive and state.pid is not None
    os.kill(state.pid, signal.SIGKILL)
    wait_for(lambda: not state.alive, 10, "the proxy daemon to die")
    assert next(s for s in guest.cli.ls() if s["name"] == guest.record.name)["egress"] == "stopped"
    # the guest's door closed with the daemon: an immediate refusal, not a hang (plain ssh, so vmsandbox
    # does not restart the proxy first)
    argv = guest.record.endpoint().ssh_argv("-T")
    r = subprocess.run(
        [*argv, "--", f"curl -sS -m 20 http://{HTTP}/; echo exit=$?"],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert b"exit=7" in r.stdout, (r.stdout, r.stderr)  # 7: failed to connect (refused)
    # vmsandbox exec notices, says so, and restarts it (the product's own daemon: a special name gets its
    # answer, 403 from the proxy, without any lookup)
    r = guest.sh("curl -sS -m 20 -o /dev/null -w '%{http_code}' http://again.invalid/")
    assert b"had stopped" in r.stderr, r.stderr.decode()
    assert r.stdout == b"403"
    assert control.status(files, wanted=True) is Door.UP


# A guest's programs flooding its door (run in the guest by its own python3): FLOOD connections in batches, five
# kinds in turn: a superscript port, an open bracket, bytes that are no request, a head that never ends, and a
# request for a large answer on a socket that reads nothing. Every reader waits for its answer (or the end);
# the others are closed at the end. It prints what the readers got, by status.
FLOOD = 1000
FLOOD_SCRIPT = r"""
import json, resource, selectors, socket, sys, time
started = time.monotonic()
host = sys.argv[1]
n = int(sys.argv[2])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
kinds = [
    b"CONNECT " + host.encode() + b":\xb2 HTTP/1.1\r\n\r\n",
    b"GET http://[" + host.encode() + b"/ HTTP/1.1\r\n\r\n",
    b"\x16\x03\x01\x00\x05hello\r\n\r\n",
    b"GET http://" + host.encode() + b"/ HTTP/1.1\r\nHo",
    b"GET http://" + host.encode() + b"/big HTTP/1.1\r\n\r\n",
]
got, silent = {}, []
for start in range(0, n, 200):
    sel = selectors.DefaultSelector()
    for i in range(start, min(n, start + 200)):
        s = socket.socket()
        if i % 5 == 4:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.settimeout(60)
        s.connect(("127.0.0.1", 3128))
        try:
            s.sendall(kinds[i % 5])
        except OSError:
            pass  # refused and closed already: its answer is read below
        if i % 5 == 4:
            silent.append(s)
        else:
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ, bytearray())
    while sel.get_map():
        for key, _ in sel.select(120) or sys.exit("no answer in 120 s"):
            try:
                data = key.fileobj.recv(65536)
            except ConnectionResetError:
                data = b""
            if data:
                key.data.extend(data)
                continue
            status = bytes(key.data[9:12]).decode() or "closed"
            got[status] = got.get(status, 0) + 1
            sel.unregister(key.fileobj)
            key.fileobj.close()
    print(f"{time.monotonic() - started:.1f} s: {start + 200} opened, answers {got}", file=sys.stderr, flush=True)
for s in silent:
    s.close()
print(json.dumps(got))
"""

# Another session's program, asking its own door for an allowed page again and again until told to stop (a
# line on its stdin): what it got, by status.
STEADY_SCRIPT = r"""
import json, select, socket, sys
host = sys.argv[1]
got = {}
while not select.select([sys.stdin], [], [], 0)[0]:
    try:
        s = socket.create_connection(("127.0.0.1", 3128), timeout=60)
        s.sendall(b"GET http://" + host.encode() + b"/steady HTTP/1.1\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        s.close()
        status = data[9:12].decode() or "closed"
    except OSError as exc:
        status = type(exc).__name__
    got[status] = got.get(status, 0) + 1
print(json.dumps(got))
"""


def _daemon_counts(pid: int) -> tuple[int, int]:
    """The threads and descriptors of a daemon (as root may read them)."""
    threads = next(
        int(line.split()[1])
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("Threads:")
    )
    return threads, len(list(Path(f"/proc/{pid}/fd").iterdir()))


@pytest.mark.root("reads the egress daemon's threads and descriptors in /proc")
def test_a_guest_flooding_its_door_leaves_it_and_another_session_working(
    guest: Guest, vm_factory: VmFactory, tmp_path: Path
) -> None:
    """A real guest opens 1,000 malformed, slow and never-reading connections to its door (small timeouts
    here: a head 2 s, a side that takes nothing 2 s): every reader gets an answer or a refusal, the daemon's
    threads never grow and its descriptors stay bounded and come back, and the guest then makes an allowed
    request. Another session on the same host asks its own door for a page all the while, and every one of its
    requests is answered 200."""
    limits = {"head_timeout": 2.0, "send_timeout": 2.0}
    env = guest.cli.env(VMSANDBOX_CONFIG_DIR=os.environ["VMSANDBOX_CONFIG_DIR"])
    pid = use_standin_daemon(guest.record.name, guest.record.files.root, [guest.http], guest.ca, env, limits)
    guest.standin_pid = pid
    project = tmp_path / "other"
    project.mkdir()
    other = vm_factory.make(project, settings=suite_settings().merged({"allow": [HTTP]}, "test"), user=ALICE)
    use_standin_daemon(other.name, other.files.root, [guest.http], guest.ca, env)
    write_script = "cat > /tmp/{0}.py <<'EOF'\n{1}\nEOF"
    guest.sh(write_script.format("flood", FLOOD_SCRIPT))
    assert guest.sh(f"curl -sS -m 30 http://{HTTP}/before").returncode == 0  # (every thread it has is made)
    base, logged = _daemon_counts(pid), len(guest.events())
    steady = subprocess.Popen(
        [
            *other.endpoint().ssh_argv("-T"),
            "--",
            f"{write_script.format('steady', STEADY_SCRIPT)}\npython3 /tmp/steady.py {HTTP}",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    peaks: list[tuple[int, int]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            with contextlib.suppress(OSError, StopIteration):
                peaks.append(_daemon_counts(pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        answered = json.loads(guest_sh(guest.record, f"python3 /tmp/flood.py {HTTP} {FLOOD}", timeout=900))
        assert sum(answered.values()) == FLOOD * 4 // 5 and set(answered) <= {"400", "403", "408", "503"}, answered
        after = guest.sh(f"curl -sS -m 30 http://{HTTP}/after")
        assert f"hello from {HTTP} GET /after".encode() in after.stdout, after.stderr.decode()
    finally:
        done.set()
        sampler.join()
        out, err = steady.communicate(b"stop\n", timeout=300)
    served = json.loads(out)
    assert set(served) == {"200"} and served["200"] > 0, (served, err.decode())
    peaks.append(base)  # (a flood quicker than the sampler)
    assert max(t for t, _ in peaks) <= base[0], (base, max(peaks))  # no thread per connection
    assert max(f for _, f in peaks) <= base[1] + 3 * 128, (base, max(peaks))
    wait_for(lambda: all(n <= b for n, b in zip(_daemon_counts(pid), base, strict=True)), 60, "the daemon as it was")
    state = control.daemon_state(guest.record.files)
    assert state is not None and state.pid == pid and state.forward is Door.UP  # never restarted, up
    assert len(guest.events()) - logged == FLOOD + 1  # a line for every connection (and the last request)
    guest.standin_pid = None  # the next test gets the stand-in with the product's limits
