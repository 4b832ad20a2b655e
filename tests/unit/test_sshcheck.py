"""Why a host does not answer, in ssh's words: the ssh `hosts` runs of its own (what libvirt's transport would
run, in batch mode, asking only `true`), what its complaint means, and how `probe` weighs it against libvirt's
answer. ssh's stderr below is what OpenSSH 9.2 said to stand-ins on 127.0.0.1 (a closed port, a listener that
never speaks, one that speaks no ssh, an sshd with another host key, one that takes no key of ours); unit tests
run no ssh, the integration test (tests/integration/test_hosts.py) runs it against the same stand-ins."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from vmsandbox import proc
from vmsandbox.errors import VmsandboxError
from vmsandbox.session.host import hosts
from vmsandbox.session.place.hostspec import HostSpec
from vmsandbox.vm import sshcheck
from vmsandbox.vm.node import Node
from vmsandbox.vm.sshcheck import Kind

TO = sshcheck.Target("127.0.0.1", 42222, "root")

CHANGED = """\
@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @
@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
IT IS POSSIBLE THAT SOMEONE IS DOING SOMETHING NASTY!
Someone could be eavesdropping on you right now (man-in-the-middle attack)!
It is also possible that a host key has just been changed.
The fingerprint for the ED25519 key sent by the remote host is
SHA256:HHMgvMg++IcCo8rJwTGPcsDW3tw5zVazdUR2kYD3j6Q.
Please contact your system administrator.
Add correct host key in /tmp/kh to get rid of this message.
Offending ED25519 key in /tmp/kh:1
  remove with:
  ssh-keygen -f "/tmp/kh" -R "[127.0.0.1]:42222"
Host key for [127.0.0.1]:42222 has changed and you have requested strict checking.
Host key verification failed.
"""


@pytest.mark.parametrize(
    ("stderr", "kind", "said", "fix"),
    [
        (
            "ssh: connect to host 127.0.0.1 port 42222: Connection refused\n",
            Kind.REFUSED,
            "ssh: connect to host 127.0.0.1 port 42222: Connection refused",
            "start sshd there",
        ),
        (
            "Connection timed out during banner exchange\nConnection to 127.0.0.1 port 42222 timed out\n",
            Kind.TIMED_OUT,
            "Connection timed out during banner exchange",
            "never speaks ssh",
        ),
        (
            "ssh: connect to host 127.0.0.1 port 42222: Connection timed out\n",
            Kind.TIMED_OUT,
            "ssh: connect to host 127.0.0.1 port 42222: Connection timed out",
            "`ssh -v -p 42222 root@127.0.0.1 true`",
        ),
        (
            "kex_exchange_identification: banner line contains invalid characters\n"
            "banner exchange: Connection to 127.0.0.1 port 42222: invalid format\n",
            Kind.NOT_SSH,
            "kex_exchange_identification: banner line contains invalid characters",
            "does not answer as an ssh server",
        ),
        (
            "kex_exchange_identification: Connection closed by remote host\n"
            "Connection closed by 127.0.0.1 port 42222\n",
            Kind.NOT_SSH,
            "kex_exchange_identification: Connection closed by remote host",
            "check the port in the URI",
        ),
        (
            CHANGED,
            Kind.KEY_CHANGED,
            "Host key for [127.0.0.1]:42222 has changed and you have requested strict checking.",
            '`ssh-keygen -f "/tmp/kh" -R "[127.0.0.1]:42222"`',  # ssh's own command to drop the old key
        ),
        ("Host key verification failed.\n", Kind.KEY_UNKNOWN, "Host key verification failed.", "known_hosts"),
        (
            "No ED25519 host key is known for [127.0.0.1]:42222 and you have requested strict checking.\n"
            "Host key verification failed.\n",
            Kind.KEY_UNKNOWN,
            "No ED25519 host key is known for [127.0.0.1]:42222 and you have requested strict checking.",
            "`ssh -p 42222 root@127.0.0.1 true` once",
        ),
        (
            "Warning: Permanently added '[127.0.0.1]:42222' (ED25519) to the list of known hosts.\n"
            "root@127.0.0.1: Permission denied (publickey).\n",
            Kind.AUTH,
            "root@127.0.0.1: Permission denied (publickey).",
            "`ssh-copy-id -p 42222 root@127.0.0.1`",
        ),
        (
            "ssh: connect to host 127.0.0.1 port 42222: No route to host\n",
            Kind.NO_ROUTE,
            "ssh: connect to host 127.0.0.1 port 42222: No route to host",
            "no route there",
        ),
        (
            "ssh: connect to host 127.0.0.1 port 42222: Network is unreachable\n",
            Kind.NO_ROUTE,
            "ssh: connect to host 127.0.0.1 port 42222: Network is unreachable",
            "your network",
        ),
        (
            "ssh: Could not resolve hostname nosuch.invalid: Name or service not known\n",
            Kind.UNRESOLVED,
            "ssh: Could not resolve hostname nosuch.invalid: Name or service not known",
            "check the host name in the URI",
        ),
        ("something new\nand its last word\n", Kind.OTHER, "and its last word", "`ssh -v -p 42222 root@127.0.0.1"),
        ("", Kind.OTHER, "ssh exited with 255 and said nothing", "shows where it stops"),
    ],
)
def test_ssh_s_complaint_is_kept_in_its_words_with_the_fix(stderr: str, kind: Kind, said: str, fix: str) -> None:
    why = sshcheck.reason(stderr, TO)
    assert (why.kind, why.said) == (kind, said)
    assert fix in why.hint


def test_the_check_runs_the_ssh_libvirts_transport_would_run() -> None:
    wrapped = sshcheck.target("qemu+ssh://me@big.example:2222/system?command=/opt/my-ssh&no_tty=1&keyfile=/k/id")
    assert wrapped == sshcheck.Target("big.example", 2222, "me", "/opt/my-ssh", "/k/id")
    assert sshcheck.argv(wrapped, 7) == [
        "/opt/my-ssh", "-p", "2222", "-l", "me", "-i", "/k/id",
        "-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=7", "-e", "none", "--", "big.example", "true",
    ]  # fmt: skip
    plain = sshcheck.target("qemu+ssh://big/system")
    assert plain == sshcheck.Target("big") and sshcheck.argv(plain, 3)[-3:] == ["--", "big", "true"]
    assert "-p" not in sshcheck.argv(plain, 3) and "-l" not in sshcheck.argv(plain, 3)
    # libssh transports: no `command=` (they run no program), their own known_hosts
    libssh = sshcheck.target("qemu+libssh2://me@big/system?known_hosts=/k/kh&command=/bin/evil")
    assert libssh == sshcheck.Target("big", None, "me", "ssh", None, "/k/kh")
    assert "UserKnownHostsFile=/k/kh" in sshcheck.argv(libssh, 3)
    # a host that looks like an option stays the host
    assert sshcheck.argv(sshcheck.Target("-oProxyCommand=x"), 3)[-3:] == ["--", "-oProxyCommand=x", "true"]
    for uri in ("qemu:///system", "qemu+tls://big/system", "qemu+unix:///system"):
        assert sshcheck.target(uri) is None


def _ssh_says(monkeypatch: pytest.MonkeyPatch, code: int, stderr: str = "") -> list[list[str]]:
    ran: list[list[str]] = []

    def run(argv: list[str], **kw: Any) -> proc.Result:
        assert kw["check"] is False
        ran.append(argv)
        return proc.Result(tuple(argv), code, "", stderr)

    monkeypatch.setattr(proc, "run", run)
    return ran


def test_the_check_goes_through_the_chokepoint_and_hears_only_ssh_s_own_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    uri = "qemu+ssh://root@127.0.0.1:42222/system"
    ran = _ssh_says(monkeypatch, 255, "ssh: connect to host 127.0.0.1 port 42222: Connection refused\n")
    why = sshcheck.check(uri, 20)
    assert why is not None and why.kind == Kind.REFUSED
    assert "ConnectTimeout=15" in ran[0]  # within the probe's time, so a silent port is heard of in it
    _ssh_says(monkeypatch, 0)
    assert sshcheck.check(uri, 20) is None  # got through
    _ssh_says(monkeypatch, 1, "This account is currently not available.\n")
    assert sshcheck.check(uri, 20) is None  # the remote shell's answer: ssh got through
    assert sshcheck.check("qemu:///system", 20) is None


def test_no_ssh_here_is_the_reason_with_the_package_that_brings_it(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(argv: list[str], **_kw: Any) -> proc.Result:
        raise VmsandboxError("`ssh` is not installed", hint="install it with `apt-get install openssh-client`")

    monkeypatch.setattr(proc, "run", missing)
    why = sshcheck.check("qemu+ssh://big/system", 5)
    assert why is not None and why.said == "`ssh` is not installed" and "openssh-client" in why.hint


NODE = Node("h", "9.0.0", "7.2.0", 8, 32768, 30000, frozenset({"vmx"}), None)
FAR = HostSpec("far", "qemu+ssh://root@127.0.0.1:42222/system")
REFUSED = sshcheck.Reason(Kind.REFUSED, "ssh: connect to host 127.0.0.1 port 42222: Connection refused", "start sshd")


def _hosts_answer(monkeypatch: pytest.MonkeyPatch, libvirt: Any, ssh: Any) -> threading.Event:
    """libvirt's and ssh's answers as given (a callable), or never (None) until the returned event is set."""
    release = threading.Event()

    def later(answer: Any) -> Any:
        def call(*_args: Any) -> Any:
            if answer is None:
                release.wait(60)
                raise RuntimeError("released")
            return answer(*_args)

        return call

    monkeypatch.setattr(hosts, "_ask", later(libvirt))
    monkeypatch.setattr(sshcheck, "check", later(ssh))
    return release


def test_a_refused_port_is_told_in_ssh_s_words_not_libvirt_s(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = hosts.Status(FAR, None, "cannot connect to libvirt at ...: Cannot write data: Broken pipe")
    _hosts_answer(monkeypatch, lambda s: broken, lambda uri, t: REFUSED)
    found = hosts.probe(FAR, 30)
    assert (found.problem, found.hint) == (REFUSED.said, REFUSED.hint)
    assert found.as_dict()["hint"] == "start sshd"


def test_ssh_s_reason_is_the_answer_when_libvirt_never_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    release = _hosts_answer(monkeypatch, None, lambda uri, t: REFUSED)
    try:
        assert hosts.probe(FAR, 30).problem == REFUSED.said  # returned without waiting for libvirt
    finally:
        release.set()


def test_a_host_that_answers_is_not_held_up_by_the_ssh_check(monkeypatch: pytest.MonkeyPatch) -> None:
    release = _hosts_answer(monkeypatch, lambda s: hosts.Status(s, NODE, None, 2), None)
    try:
        found = hosts.probe(FAR, 30)
        assert found.node == NODE and found.problem is None and found.sessions == 2
    finally:
        release.set()


def test_when_ssh_gets_through_libvirt_s_words_stand_with_the_fix_past_ssh(monkeypatch: pytest.MonkeyPatch) -> None:
    down = hosts.Status(FAR, None, "cannot connect to libvirt at ...: Failed to connect socket")
    _hosts_answer(monkeypatch, lambda s: down, lambda uri, t: None)
    found = hosts.probe(FAR, 30)
    assert found.problem == down.problem
    assert found.hint is not None and "ssh gets through" in found.hint and "libvirtd runs there" in found.hint


def test_a_host_where_neither_answers_in_time_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    release = _hosts_answer(monkeypatch, None, None)
    try:
        found = hosts.probe(FAR, 1)
        assert found.problem == "no answer in 1 s" and found.node is None
        assert found.hint is not None and "virsh -c URI version" in found.hint
    finally:
        release.set()


def test_this_machine_is_asked_through_libvirt_only(monkeypatch: pytest.MonkeyPatch) -> None:
    local = HostSpec("local", "qemu:///system")
    down = hosts.Status(local, None, "cannot connect to libvirt", hint="start it")

    def no_ssh(*_args: Any) -> None:
        raise AssertionError("this machine is not sshed to")

    monkeypatch.setattr(hosts, "_ask", lambda s: down)
    monkeypatch.setattr(sshcheck, "check", no_ssh)
    assert hosts.probe(local, 5) == down


def test_hosts_prints_each_unanswered_host_s_fix(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from vmsandbox.cli import main

    found = [
        hosts.Status(HostSpec("local", "qemu:///system"), NODE, None),
        hosts.Status(FAR, None, REFUSED.said, hint=REFUSED.hint),
    ]
    monkeypatch.setattr(hosts, "probe_all", lambda specs, timeout: found)
    with pytest.raises(SystemExit) as done:
        main.main(["host", "ls"])
    assert not done.value.code
    out, err = capsys.readouterr()
    assert out.splitlines()[-1].split()[:2] == ["far", "unreachable"]
    assert f"far: {REFUSED.said}" in err and f"hint: {REFUSED.hint}" in err  # after the table, ssh's words
    assert "local:" not in err


def test_a_session_s_host_that_does_not_answer_points_to_where_ssh_says_why() -> None:
    from vmsandbox.vm.node import REMOTE_HINT, unreachable_hint

    over_ssh = unreachable_hint("Cannot write data: Broken pipe", FAR.uri, "qemu:///system")
    assert over_ssh.startswith("`vmsandbox host ls` says why, in ssh's words") and REMOTE_HINT in over_ssh
    assert unreachable_hint("", "qemu+tls://big/system", "qemu:///system") == REMOTE_HINT
