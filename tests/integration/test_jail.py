"""The jail of the processes that read guest data, tried for real (bubblewrap; no VM): a reader that escapes its
process group, writes outside its target, opens a connection, reaches a Unix socket or reads a file the host
left readable to every account gets nowhere."""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from vmsandbox import proc
from vmsandbox.confine import accounts
from vmsandbox.confine.jail import Jail

from .conftest import wait_for

pytestmark = pytest.mark.no_vm


@pytest.fixture
def place() -> Iterator[Path]:
    """A directory the guest-data account can reach (pytest's own is private to root)."""
    made = Path(tempfile.mkdtemp(prefix="vmsandbox-it-jail-", dir="/var/tmp"))
    made.chmod(0o755)
    yield made
    shutil.rmtree(made, ignore_errors=True)


@pytest.fixture
def target(place: Path) -> Path:
    d = place / "target"
    d.mkdir()
    accounts.hand_over(d, accounts.guest_data_account())
    return d


def jailed(script: str, target: Path) -> proc.Result:
    who = accounts.guest_data_account()
    limits = accounts.guest_data_limits(1024**3)
    return proc.run(["sh", "-c", script], as_user=who, limits=limits, jail=Jail((target,)), cwd=target, check=False)


def test_a_setsid_grandchild_does_not_outlive_the_reader(target: Path) -> None:
    marker = f"vmsandbox-jail-test-{os.getpid()}"
    r = jailed(f"setsid sh -c 'exec -a {marker} sleep 300' </dev/null >/dev/null 2>&1 & echo started", target)
    assert r.stdout.strip() == "started", r.stderr

    def gone() -> bool:
        found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True, check=False).stdout
        return found.strip() == ""

    wait_for(gone, 10, "the jail's last process to be killed with it")


def test_the_reader_writes_its_target_only(target: Path, place: Path) -> None:
    place.chmod(0o777)  # the account could write here, were it not for the jail
    outside = place / "outside"
    r = jailed(
        f"echo in > {target}/in.txt; echo out > {outside}; echo out > /var/tmp/jail-escape; echo out > /usr/escape;"
        "echo out > /escape; mkdir /new",
        target,
    )
    assert (target / "in.txt").read_text() == "in\n"
    assert not outside.exists() and not Path("/var/tmp/jail-escape").exists()
    assert not Path("/usr/escape").exists() and not Path("/escape").exists() and not Path("/new").exists()
    # the directories down to the target, /usr and the jail's own root are there, read-only; nothing else
    assert r.stderr.count("Read-only file system") == 5, r.stderr


def test_the_reader_sees_the_system_and_its_target_and_nothing_else(target: Path, place: Path) -> None:
    """A file every account may read, a Unix socket every account may connect to (a read-only mount does not
    stop a connection): outside the target, neither is there; what is there is the system's programs."""
    (place / "open.txt").write_text("for everyone")
    (place / "open.txt").chmod(0o644)
    connect = f"import socket; socket.socket(socket.AF_UNIX).connect({str(place / 'sock')!r})"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(place / "sock"))
        (place / "sock").chmod(0o777)
        listener.listen()
        plain = proc.run(  # the same account, unjailed, reaches both: the jail is what stops it
            ["/usr/bin/python3", "-c", f"{connect}; print('reached')"],
            as_user=accounts.guest_data_account(), check=False,
        )  # fmt: skip
        assert plain.stdout.strip() == "reached", plain.stderr
        listener.accept()[0].close()
        r = jailed(
            f'cat {place}/open.txt; python3 -c "{connect}";'  # (the connection made unjailed is accepted above)
            "echo ==; ls /; echo ==; ls /var; echo ==; ls /home /root /run /srv /opt; rsync --version | head -1",
            target,
        )
        listener.settimeout(1)
        with pytest.raises(TimeoutError):
            listener.accept()
    assert "for everyone" not in r.stdout and "FileNotFoundError" in r.stderr, r.stdout + r.stderr
    _, top, var, rest = r.stdout.split("==\n")
    assert set(top.split()) <= {"bin", "dev", "etc", "lib", "lib64", "proc", "sbin", "tmp", "usr", "var"}, top
    assert var.split() == ["tmp"]  # only the path down to the target
    assert r.stderr.count("No such file or directory") >= 6, r.stderr  # the file, and each of those five
    assert rest.startswith("rsync  version"), rest


def test_the_reader_has_no_network(target: Path) -> None:
    """Its network namespace is empty: even this host's loopback is not there."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        r = proc.run(
            ["bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected"],
            as_user=accounts.guest_data_account(), jail=Jail((target,)), cwd=target, check=False,
        )  # fmt: skip
        listener.settimeout(1)
        with pytest.raises(TimeoutError):
            listener.accept()
    assert r.returncode != 0 and "connected" not in r.stdout, r.stdout + r.stderr


def test_the_reader_makes_no_namespace_and_no_kernel_surface_call(target: Path) -> None:
    """No user namespace (which would give it every capability over mounts and networks of its own), whichever
    way it asks: unshare(2), clone(2) with a namespace flag, setns(2); and the seccomp filter refuses the
    calls a reader never needs (mount, keyctl, bpf, ptrace, userfaultfd, io_uring), while what it does need
    (fork, exec, threads, pipes, files) still works."""
    probe = r"""
import ctypes, errno, os, threading, subprocess
libc = ctypes.CDLL(None, use_errno=True)
def call(nr, *args):
    r = libc.syscall(nr, *[ctypes.c_long(a) for a in args])
    return "ok" if r >= 0 else errno.errorcode[ctypes.get_errno()]
CLONE_NEWUSER, CLONE_NEWNET, SIGCHLD = 0x10000000, 0x40000000, 17
print("unshare-user", call(272, CLONE_NEWUSER))
print("unshare-net", call(272, CLONE_NEWNET))
print("clone-user", call(56, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0))
print("setns", call(308, 0, 0))
print("mount", call(165, 0, 0, 0, 0, 0))
print("keyctl", call(250, 0, 0, 0, 0, 0))
print("bpf", call(321, 0, 0, 0))
print("ptrace", call(101, 0, 0, 0, 0))
print("userfaultfd", call(323, 0))
print("io_uring", call(425, 1, 0))
print("clone3", call(435, 0, 0))
print("vsock", call(41, 40, 1, 0))
print("alg", call(41, 38, 5, 0))
print("ldt", call(154, 0, 0, 0))
print("unix", call(41, 1, 1, 0))
t = threading.Thread(target=lambda: None); t.start(); t.join()
pid = os.fork()
if pid == 0:
    os._exit(7)
print("spawn", subprocess.run(["true"]).returncode, os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""
    r = jailed(f"exec python3 -c {shlex.quote(probe)}", target)
    found = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    for call in ("unshare-user", "unshare-net", "clone-user", "setns", "mount", "keyctl", "bpf", "ptrace",
                 "userfaultfd", "io_uring", "vsock", "alg", "ldt"):  # fmt: skip
        assert found.get(call) == "EPERM", (call, r.stdout, r.stderr)
    assert found.get("clone3") == "ENOSYS", r.stdout  # so glibc falls back to clone(2), whose flags are seen
    assert found.get("unix") == "ok", r.stdout  # a socket pair's kind of socket is what a reader may use
    assert found.get("spawn") == "0 7", r.stdout + r.stderr
    r = jailed("unshare -U -r true; echo $?", target)
    assert r.stdout.strip() != "0", r.stdout + r.stderr


def test_own_modules_run_isolated_from_the_working_directory(tmp_path: Path) -> None:
    """A package named like the module started, planted where the process starts (a project's `json/`), is not
    what runs: `-I` keeps the working directory off the import path of every process vmsandbox starts of its own
    (the egress daemon, teardown, the memory holder start as root: the audit of issue 48 found the cwd there)."""
    planted = tmp_path / "marker"
    (tmp_path / "json").mkdir()
    (tmp_path / "json" / "__init__.py").write_text(f"open({str(planted)!r}, 'w').write('imported')\n")
    (tmp_path / "json" / "tool.py").write_text("")
    done = proc.run(proc.own_module("json.tool"), input='{"a": 1}', cwd=tmp_path)
    assert '"a": 1' in done.stdout and not planted.exists()
    bare = proc.run([proc.own_module("json")[0], "-m", "json.tool"], input="{}", cwd=tmp_path, check=False)
    assert planted.exists(), bare  # (the same start without -I imports it: the test can fail)
