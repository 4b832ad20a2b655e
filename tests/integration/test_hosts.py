"""Other libvirt hosts, played by a second libvirtd in its own mount namespace reached over qemu+ssh through
an sshd on 127.0.0.1 (farhost.py): `vmsandbox hosts` lists every host and the reason one does not answer,
and `host prepare` sends an image into a host's storage pool once, checked, and again only when it is not
whole there. All traffic stays on loopback."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration import farhost
from tests.integration.conftest import Cli
from vmsandbox import paths, pids
from vmsandbox.image import store

pytestmark = pytest.mark.root("it plays a second libvirt host: a libvirtd of its own in a mount namespace, an sshd")

IMAGE_FILES = ("disk.qcow2", "vmlinuz", "initrd.img")


@pytest.fixture(scope="module")
def far(host: str) -> Iterator[farhost.FarHost]:
    root = Path(tempfile.mkdtemp(prefix="vmsandbox-far-", dir="/var/tmp")) / "far"
    try:
        found = farhost.start(root)
    except RuntimeError as exc:
        pytest.fail(str(exc))
    yield found
    found.stop()
    shutil.rmtree(root.parent, ignore_errors=True)


def _config(tmp_path: Path, *hosts: dict[str, object]) -> dict[str, str]:
    conf = tmp_path / "config"
    conf.mkdir(exist_ok=True)
    (conf / "config.yaml").write_text(json.dumps({"hosts": list(hosts)}))  # JSON is YAML
    return {"VMSANDBOX_CONFIG_DIR": str(conf)}


def _sha256(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            sha.update(chunk)
    return sha.hexdigest()


def _wrong_speaker() -> socket.socket:
    """A listener on 127.0.0.1 that answers every connection with bytes that are no ssh greeting."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)

    def serve() -> None:
        with contextlib.suppress(OSError):  # closed: the test is over
            while True:
                conn, _ = listener.accept()
                with conn:
                    conn.sendall(b"\x00\x01 not ssh\r\n")
                    conn.settimeout(5)
                    with contextlib.suppress(OSError):
                        conn.recv(4096)

    threading.Thread(target=serve, daemon=True).start()
    return listener


def _ssh_wrapper(tmp_path: Path, name: str, *, key: Path, known_hosts: Path) -> Path:
    """An ssh for libvirt's `command=` that reaches the stand-in with this key and known_hosts."""
    wrapper = tmp_path / name
    wrapper.write_text(
        "#!/bin/sh\n"
        f"exec ssh -i {key} -o IdentitiesOnly=yes -o UserKnownHostsFile={known_hosts} -o StrictHostKeyChecking=yes "
        '-o BatchMode=yes -o ConnectTimeout=10 "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


def _new_key(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", path], check=True)
    return path


def test_hosts_lists_each_host_and_why_one_does_not_answer(
    cli: Cli, far: farhost.FarHost, tmp_path: Path, base_image: store.Image
) -> None:
    refused = farhost.free_port()  # nothing listens there
    silent = socket.socket()  # takes connections and never says a word: ssh waits for a banner
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    silent_port = silent.getsockname()[1]
    speaker = _wrong_speaker()
    # the stand-in's sshd as a host whose key is not the one known here, and as one that takes none of our keys
    other_host_key = _new_key(tmp_path / "other_host_key").with_suffix(".pub").read_text().split()
    (tmp_path / "stale_known_hosts").write_text(f"[127.0.0.1]:{far.port} {other_host_key[0]} {other_host_key[1]}\n")
    client_key = far.root / "client_key"
    stale = _ssh_wrapper(tmp_path, "stale-ssh", key=client_key, known_hosts=tmp_path / "stale_known_hosts")
    stranger = _ssh_wrapper(
        tmp_path, "stranger-ssh", key=_new_key(tmp_path / "k"), known_hosts=far.root / "known_hosts"
    )
    at_far = f"qemu+ssh://root@127.0.0.1:{far.port}/system?no_tty=1&command="
    try:
        env = cli.env(
            **_config(
                tmp_path,
                {"name": "far", "uri": far.uri, "max_sessions": 3},
                {"name": "refused", "uri": f"qemu+ssh://root@127.0.0.1:{refused}/system?command={far.ssh}&no_tty=1"},
                {"name": "silent", "uri": f"qemu+ssh://root@127.0.0.1:{silent_port}/system?no_tty=1"},
                {"name": "not-ssh", "uri": f"qemu+ssh://root@127.0.0.1:{speaker.getsockname()[1]}/system?no_tty=1"},
                {"name": "key-changed", "uri": at_far + str(stale)},
                {"name": "no-key", "uri": at_far + str(stranger)},
            )
        )
        started = time.monotonic()
        # (a reachable host answers over ssh and libvirt within this, even on a loaded 2-core machine: 5 s did not)
        result = cli.run("host", "ls", "--json", "--timeout", "15", env=env)
        took = time.monotonic() - started
        assert result.returncode == 0, result.stderr.decode()
        rows = {r["name"]: r for r in map(json.loads, result.stdout.splitlines())}
        assert list(rows) == ["local", "far", "refused", "silent", "not-ssh", "key-changed", "no-key"]
        for name in ("local", "far"):
            assert rows[name]["reachable"] is True, rows[name]
            assert rows[name]["libvirt"] and rows[name]["qemu"] and rows[name]["cpus"] >= 1
            assert rows[name]["available_mib"] > 0
            assert rows[name]["accel"] == "tcg"  # this machine's KVM is not one guests can use
        assert rows["far"]["max_sessions"] == 3
        assert base_image.path.name in rows["local"]["images"]
        # why each other host does not answer, in ssh's words (libvirt's transport says "Broken pipe" or nothing)
        said = {name: rows[name]["problem"] for name in list(rows)[2:]}
        assert all(rows[name]["reachable"] is False for name in said), rows
        assert said["refused"] == f"ssh: connect to host 127.0.0.1 port {refused}: Connection refused", said
        assert said["silent"] == "Connection timed out during banner exchange", said
        assert said["not-ssh"].startswith("kex_exchange_identification"), said
        assert said["key-changed"] == (
            f"Host key for [127.0.0.1]:{far.port} has changed and you have requested strict checking."
        ), said
        assert said["no-key"] == "root@127.0.0.1: Permission denied (publickey).", said
        assert "start sshd there" in rows["refused"]["hint"]
        remove = f'ssh-keygen -f "{tmp_path}/stale_known_hosts" -R "[127.0.0.1]:{far.port}"'  # ssh's own words
        assert remove in rows["key-changed"]["hint"]
        assert took < 60, f"a silent host held `hosts` for {took:.0f} s"

        table = cli.run("host", "ls", "--timeout", "15", env=env)
        assert table.returncode == 0
        lines = table.stdout.decode().splitlines()
        assert lines[0].split()[:3] == ["NAME", "STATE", "ACCEL"]
        assert [ln.split()[1] for ln in lines[1:]] == ["ok", "ok", *["unreachable"] * 5]
        hints = table.stderr.decode()
        assert _hint_of(hints, "refused").startswith("hint: nothing listens on that port there"), hints
        assert _hint_of(hints, "no-key").startswith("hint: let ssh in by key"), hints
    finally:
        silent.close()
        speaker.close()


def _hint_of(said: str, host: str) -> str:
    """The hint `host ls` gives under a host that does not answer (its line, `HOST: why`, then the hint)."""
    lines = said.splitlines()
    return next(after for line, after in itertools.pairwise(lines) if line.startswith(f"{host}: "))


def _inside(far: farhost.FarHost, *argv: str) -> str:
    done = far.run_inside(*argv)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_an_image_goes_to_a_host_once_checked_and_again_when_not_whole(
    cli: Cli, far: farhost.FarHost, tmp_path: Path, base_image: store.Image
) -> None:
    pool_path = f"/var/lib/libvirt/vmsandbox-it-{tmp_path.name[-12:]}"
    name = base_image.path.name
    env = cli.env(**_config(tmp_path, {"name": "far", "uri": far.uri, "pool_path": pool_path}))
    try:
        first = cli.run("host", "prepare", "far", env=env)
        assert first.returncode == 0, first.stderr.decode()
        assert f"Host far holds {name}: sent" in first.stderr.decode()
        listing = _inside(far, "ls", pool_path).split()
        assert sorted(listing) == sorted([*(f"{name}.{f}" for f in IMAGE_FILES), f"{name}.ready"])
        # what is there is what we have, byte for byte, and only the stand-in's mount namespace sees it
        for f in IMAGE_FILES:
            there = _inside(far, "sha256sum", f"{pool_path}/{name}.{f}").split()[0]
            assert there == _sha256(base_image.path / f), f
        assert not Path(pool_path).exists()
        # holes stayed holes: the disk takes no more room there than here
        here_blocks = (base_image.path / "disk.qcow2").stat().st_blocks
        there_blocks = int(_inside(far, "stat", "-c", "%b", f"{pool_path}/{name}.disk.qcow2"))
        assert there_blocks <= here_blocks * 1.05 + 2048

        again = cli.run("host", "prepare", "far", env=env)
        assert again.returncode == 0, again.stderr.decode()
        assert "already there" in again.stderr.decode()
        assert "Sending" not in again.stderr.decode()

        listed = [json.loads(line) for line in cli.run("host", "ls", "--json", env=env).stdout.splitlines()]
        assert name in next(r for r in listed if r["name"] == "far")["images"]

        # an upload cut off: the record of it is gone and a volume is short. It is not used; it is sent again.
        _inside(far, "rm", f"{pool_path}/{name}.ready")
        _inside(far, "truncate", "-s", "4096", f"{pool_path}/{name}.vmlinuz")
        listed = [json.loads(line) for line in cli.run("host", "ls", "--json", env=env).stdout.splitlines()]
        assert name not in next(r for r in listed if r["name"] == "far")["images"]
        resent = cli.run("host", "prepare", "far", env=env)
        assert resent.returncode == 0, resent.stderr.decode()
        assert f"Host far holds {name}: sent" in resent.stderr.decode()
        assert _inside(far, "sha256sum", f"{pool_path}/{name}.vmlinuz").split()[0] == _sha256(
            base_image.path / "vmlinuz"
        )

        # the config names another directory than the pool has: said, with both paths
        moved = cli.env(**_config(tmp_path, {"name": "far", "uri": far.uri, "pool_path": "/srv/elsewhere"}))
        wrong = cli.run("host", "prepare", "far", env=moved)
        assert wrong.returncode != 0
        assert pool_path in wrong.stderr.decode() and "/srv/elsewhere" in wrong.stderr.decode()
    finally:
        _drop_pool(far)


def test_a_full_pool_is_said_with_the_host_and_leaves_nothing_half_sent(
    cli: Cli, far: farhost.FarHost, tmp_path: Path, base_image: store.Image
) -> None:
    pool_path = "/var/lib/libvirt/vmsandbox-small"
    _inside(far, "mkdir", "-p", pool_path)
    _inside(far, "mount", "-t", "tmpfs", "-o", "size=64m", "vmsandbox-small", pool_path)
    env = cli.env(**_config(tmp_path, {"name": "small", "uri": far.uri, "pool_path": pool_path}))
    try:
        result = cli.run("host", "prepare", "small", env=env)
        assert result.returncode != 0
        err = result.stderr.decode()
        assert "host small" in err or "pool vmsandbox" in err, err
        assert "free space" in err, err
        assert "Traceback" not in err
        assert _inside(far, "ls", "-A", pool_path).split() == []  # the cut-off volume was deleted
    finally:
        _drop_pool(far)
        far.run_inside("umount", pool_path)


def _drop_pool(far: farhost.FarHost) -> None:
    """Each test makes the pool at a path of its own: take the definition away (files stay in the stand-in)."""
    for verb in ("pool-destroy", "pool-undefine"):
        far.run_inside("virsh", "-c", "qemu:///system", verb, "vmsandbox")


def test_a_layer_travels_after_its_base_naming_the_base_volume_as_its_backing_file(
    far: farhost.FarHost, tmp_path: Path, base_image: store.Image
) -> None:
    """A blueprint layer's header names the base's disk by its path here; there it names the base's volume
    beside it, and reads the same, block for block (checked by qemu-img in the stand-in's namespace)."""
    import subprocess

    from vmsandbox.session.place import hostspec
    from vmsandbox.session.place.remote import images
    from vmsandbox.vm.virt import Hypervisor

    layer_dir = tmp_path / "bp-it-layer"
    layer_dir.mkdir()
    disk = layer_dir / "disk.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", base_image.disk, disk], check=True)
    subprocess.run(["qemu-io", "-c", "write -P 0x5a 1M 192k", "-c", "write -z 2M 64k", disk], check=True)
    layer = store.Image("it-layer", layer_dir, {"built_at": "now", "base_version": base_image.version})
    pool_path = "/var/lib/libvirt/vmsandbox-layer"
    spec = hostspec.HostSpec("far", far.uri, pool_path=pool_path)
    try:
        with Hypervisor(far.uri) as hv:
            assert images.ensure(hv, spec, layer) is True
            assert images.ensure(hv, spec, layer) is False
            assert images.ready(hv) == sorted([base_image.path.name, layer_dir.name])
        there = f"{pool_path}/{layer_dir.name}.disk.qcow2"
        info = json.loads(_inside(far, "qemu-img", "info", "--output=json", there))
        assert info["backing-filename"] == f"{base_image.path.name}.disk.qcow2"
        assert info["full-backing-filename"] == f"{pool_path}/{base_image.path.name}.disk.qcow2"
        assert "Images are identical" in _inside(far, "qemu-img", "compare", str(disk), there)
        here = subprocess.run(["qemu-img", "info", "--output=json", disk], capture_output=True, text=True, check=True)
        assert json.loads(here.stdout)["backing-filename"] == str(base_image.disk), "the layer here was changed"
        assert not Path(pool_path).exists()
    finally:
        _drop_pool(far)


def _remote_volumes(far: farhost.FarHost, prefix: str) -> list[str]:
    listing = far.run_inside("ls", "/var/lib/libvirt/vmsandbox").stdout.split()
    return [v for v in listing if v.startswith(prefix)]


def _tunnel_ssh(root: Path) -> list[int]:
    """The forwarding ssh processes of a session's tunnel (children of its supervisor)."""
    state = json.loads((root / "tunnel.json").read_text())
    found = []
    for proc_dir in Path("/proc").iterdir():
        if proc_dir.name.isdigit():
            try:
                stat = (proc_dir / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == state["pid"]:
                found.append(int(proc_dir.name))
    return found


def test_a_session_runs_on_another_host_and_its_changes_come_back(
    cli: Cli, far: farhost.FarHost, tmp_path: Path, project: Path, base_image: store.Image
) -> None:
    """The issue's check: a session placed on the stand-in host boots there (never here), runs a command with
    its egress and a published port through the tunnel, has its changes pulled back (live, after a lost
    tunnel, and from its disk after its VM died there), and is destroyed with nothing left on either side."""
    from tests.integration.conftest import unique_name, wait_for
    from vmsandbox.session.record import domain_name
    from vmsandbox.vm.virt import Hypervisor

    env = cli.env(**_config(tmp_path, {"name": "far", "uri": far.uri}))
    first = cli.run("run", "--host", "far", "--yes", str(project), "--", "sh", "-c", "echo made > made.txt", env=env)
    assert first.returncode == 0, first.stderr.decode()
    assert "on host far" in first.stderr.decode()
    assert (project / "made.txt").read_text() == "made\n"
    # the first session of this image and shape there builds that host's warm-start template (or finds it)
    templates = _remote_volumes(far, "vmsandbox-template-")
    assert {v.split(".", 1)[1] for v in templates} == {"disk.qcow2", "save", "fw.template", "ready"}, (
        templates,
        first.stderr.decode(),
    )

    name = unique_name()
    domain = domain_name(name)
    port = farhost.free_port()
    started = cli.run(
        "run", "--host", "far", "--keep", "--name", name, "-p", f"{port}:8000", str(project), "--",
        "sh", "-c", "echo kept > k.txt; cd /tmp && nohup python3 -m http.server 8000 --bind 127.0.0.1 "
        ">/dev/null 2>&1 &",
        env=env,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr.decode()
    assert "Sending image" not in started.stderr.decode()  # once per image version and host
    assert "Building a warm-start template" not in started.stderr.decode()  # once per image, shape and host
    try:
        with Hypervisor("qemu:///system") as here:
            assert here.info(domain) is None  # it runs there, not here
        row = next(
            r for r in map(json.loads, cli.run("ls", "--json", env=env).stdout.splitlines()) if r["name"] == name
        )
        assert (row["host"], row["state"]) == ("far", "running")
        assert row["start"] == "warm", row  # restored from that host's template: everything below runs on it
        assert _inside(far, "virsh", "-c", "qemu:///system", "domstate", domain).strip() == "running"
        volumes = _remote_volumes(far, f"{domain}.")
        assert f"{domain}.overlay.qcow2" in volumes and f"{domain}.workspace.raw" in volumes
        # the guest's SSH is forwarded to the host's loopback only
        assert "hostfwd=tcp:127.0.0.1:" in _inside(far, "virsh", "-c", "qemu:///system", "dumpxml", domain)
        supervisor = json.loads((cli.state_dir / "sessions" / name / "tunnel.json").read_text())
        _through_the_tunnel(cli, env, name, port, project)
        _console_followed(cli, env, name)
        _stopped_and_started(cli, far, env, name, port)
        _after_its_vm_died(cli, far, env, name, project)
    finally:
        gone = cli.run("rm", name, "--discard", env=env)
    assert gone.returncode == 0, gone.stderr.decode()
    assert _remote_volumes(far, f"{domain}.") == []
    assert domain not in _inside(far, "virsh", "-c", "qemu:///system", "list", "--all", "--name").split()
    assert not (cli.state_dir / "sessions" / name).exists()
    wait_for(lambda: not pids.alive(supervisor["pid"], supervisor["start"]), 10, "the tunnel's supervisor to end")


def _through_the_tunnel(cli: Cli, env: dict[str, str], name: str, port: int, project: Path) -> None:
    """A published port (served by the egress daemon here), a lost tunnel opened again, a live pull."""
    import os
    import signal

    from tests.integration.conftest import wait_for

    wait_for(lambda: _get(f"http://127.0.0.1:{port}/") == 200, 30, "the published guest port")
    for pid in _tunnel_ssh(cli.state_dir / "sessions" / name):
        os.kill(pid, signal.SIGKILL)
    again = cli.run("exec", name, "--", "cat", "k.txt", env=env)
    assert again.returncode == 0, again.stderr.decode()
    assert again.stdout == b"kept\n"
    pulled = cli.run("pull", name, "--yes", env=env)
    assert pulled.returncode == 0, pulled.stderr.decode()
    assert (project / "k.txt").read_text() == "kept\n"
    (project / "from-host.txt").write_text("pushed\n")  # and the other way
    pushed = cli.run("push", name, env=env)
    assert pushed.returncode == 0, pushed.stderr.decode()
    assert cli.run("exec", name, "--", "cat", "from-host.txt", env=env).stdout == b"pushed\n"


def _console_followed(cli: Cli, env: dict[str, str], name: str) -> None:
    """`logs --follow` of a remote session prints what the guest writes to its console there as it comes,
    escaped."""
    import threading

    from tests.integration.conftest import wait_for

    follower = cli.popen("logs", name, "--follow", env=env)
    got: list[bytes] = []
    out = follower.stdout
    assert out is not None

    def read() -> None:
        for line in iter(out.readline, b""):
            got.append(line)

    threading.Thread(target=read, daemon=True).start()
    try:
        # a warm session's console starts at its restore: its warm-start steps
        wait_for(lambda: any(b"vmsandbox-warm: " in line for line in got), 30, "the console so far")
        write = r"printf 'followed-line \033[31mred\n' | sudo tee /dev/ttyS0 >/dev/null"
        assert cli.run("exec", name, "--", "sh", "-c", write, env=env).returncode == 0
        wait_for(lambda: any(b"followed-line" in line for line in got), 30, "the new console line, followed")
    finally:
        follower.kill()
        follower.wait()
    shown = next(line for line in got if b"followed-line" in line)
    assert b"\\x1b[31mred" in shown and b"\x1b" not in shown, shown


def _stopped_and_started(cli: Cli, far: farhost.FarHost, env: dict[str, str], name: str, port: int) -> None:
    """`stop` saves the VM on its host (no domain, no tunnel left); `diff` of the stopped session reads its disk,
    fetched from there; the save outlives a restart of that host's libvirtd; `start` brings back a running
    process, an unsynced change and the published port."""
    from vmsandbox.session.place.remote import tunnel
    from vmsandbox.session.record import domain_name

    domain, root = domain_name(name), cli.state_dir / "sessions" / name
    busy = "echo paused > paused.txt; nohup sleep 7777 >/dev/null 2>&1 &"
    assert cli.run("exec", name, "--", "sh", "-c", busy, env=env).returncode == 0
    stopped = cli.run("stop", name, env=env)
    assert stopped.returncode == 0, stopped.stderr.decode()
    assert "saved on host far" in stopped.stderr.decode()
    assert domain not in _inside(far, "virsh", "-c", "qemu:///system", "list", "--all", "--name").split()
    assert f"{domain}.save" in _remote_volumes(far, f"{domain}.")
    assert not tunnel.alive(root)
    far.restart_libvirtd()
    row = next(r for r in map(json.loads, cli.run("ls", "--json", env=env).stdout.splitlines()) if r["name"] == name)
    assert row["state"] == "stopped"
    diff = cli.run("diff", name, env=env)
    assert diff.returncode == 0, diff.stderr.decode()
    assert b"paused.txt" in diff.stdout and "from host far" in diff.stderr.decode()
    started = cli.run("start", name, env=env)
    assert started.returncode == 0, started.stderr.decode()
    assert cli.run("exec", name, "--", "pgrep", "-x", "sleep", env=env).returncode == 0  # still running
    assert cli.run("exec", name, "--", "cat", "paused.txt", env=env).stdout == b"paused\n"
    assert f"{domain}.save" not in _remote_volumes(far, f"{domain}.")
    assert _get(f"http://127.0.0.1:{port}/") == 200


def _after_its_vm_died(cli: Cli, far: farhost.FarHost, env: dict[str, str], name: str, project: Path) -> None:
    """Work unsynced when the VM dies there is read from its disk, fetched from the host."""
    from vmsandbox.session.record import domain_name

    # the guest writes a terminal escape to its console, which lives on the host: `logs` shows it escaped
    title = r"printf '\033]0;pwned-title\007\n' | sudo tee /dev/ttyS0 >/dev/null"
    wrote = cli.run("exec", name, "--", "sh", "-c", f"echo late > late.txt; {title}; sync", env=env)
    assert wrote.returncode == 0, wrote.stderr.decode()
    _inside(far, "virsh", "-c", "qemu:///system", "destroy", domain_name(name))
    row = next(r for r in map(json.loads, cli.run("ls", "--json", env=env).stdout.splitlines()) if r["name"] == name)
    assert row["state"] == "exited"
    # the host grows the disk it gives back: no more than was sent comes here
    disk = f"/var/lib/libvirt/vmsandbox/{domain_name(name)}.workspace.raw"
    _inside(far, "sh", "-c", f"head -c 8M /dev/urandom >> {disk}")
    late = cli.run("pull", name, "--yes", env=env)
    assert late.returncode == 0, late.stderr.decode()
    assert "from host far" in late.stderr.decode()
    assert (project / "late.txt").read_text() == "late\n"
    root = cli.state_dir / "sessions" / name
    sent = json.loads((root / paths.SESSION_RECORD).read_text())["workspace_bytes"]
    assert (root / paths.SESSION_WORKSPACE_DISK).stat().st_size == sent
    logs = cli.run("logs", name, env=env)
    assert logs.returncode == 0, logs.stderr.decode()
    assert b"vmsandbox-warm: warm start done" in logs.stdout, logs.stdout[-300:]  # its console since the restore
    assert b"\\x1b]0;pwned-title\\x07" in logs.stdout, logs.stdout[-300:]
    assert b"\x1b" not in logs.stdout and b"\x07" not in logs.stdout
    raw = cli.run("logs", name, "--raw", env=env)
    assert b"\x1b]0;pwned-title\x07" in raw.stdout  # kept as the guest sent it, for who asks


def _get(url: str) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310 - a loopback URL made here
            return int(r.status)
    except (urllib.error.URLError, OSError):
        return 0


def _lost_host(cli: Cli, far: farhost.FarHost, env: dict[str, str], tmp_path: Path, lost: str, dead: str) -> None:
    """A session whose host takes connections and never says a word (its record names a silent listener, and an
    ssh with no ConnectTimeout of its own: only vmsandbox's wait ends the attempt) is listed `unknown` by `ls`
    instead of hanging; one whose host refuses (`dead`) is not destroyed but with --discard, which forgets it
    here."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    patient = tmp_path / "ssh-patient"
    patient.write_text('#!/bin/sh\nexec ssh -o BatchMode=yes "$@"\n')
    patient.chmod(0o755)
    silent_uri = f"qemu+ssh://root@127.0.0.1:{silent.getsockname()[1]}/system?command={patient}&no_tty=1"
    record_file = cli.state_dir / "sessions" / lost / paths.SESSION_RECORD
    record_file.write_text(record_file.read_text().replace(far.uri, silent_uri))
    try:
        listed = cli.run("ls", "--json", env=env, timeout=120)  # never held for TCP's minutes
        assert listed.returncode == 0, listed.stderr.decode()
        assert next(r for r in map(json.loads, listed.stdout.splitlines()) if r["name"] == lost)["state"] == "unknown"
        assert "no answer in" in listed.stderr.decode()
        record_file.write_text(record_file.read_text().replace(silent_uri, dead))
        refused = cli.run("rm", lost, env=env, timeout=120)
        assert refused.returncode != 0
        assert "host far does not answer" in refused.stderr.decode() and "--discard" in refused.stderr.decode()
        forgotten = cli.run("rm", lost, "--discard", env=env, timeout=120)
        assert forgotten.returncode == 0, forgotten.stderr.decode()
        assert "forgotten here" in forgotten.stderr.decode()
        assert not (cli.state_dir / "sessions" / lost).exists()
    finally:
        silent.close()


def _stale_template(far: farhost.FarHost, tmp_path: Path) -> str:
    """Volumes there of a template saved by another QEMU and libvirt (as after an upgrade of that host)."""
    name = "vmsandbox-template-0ld0ld0ld0ld"
    record = tmp_path / "ready.json"  # /tmp is the stand-in host's too
    record.write_text(json.dumps({"key": {"qemu": "1.0.0", "libvirt": "1.0.0"}, "image": "base-x"}))
    for vol in ("disk.qcow2", "save", "fw.template", "ready"):
        _inside(far, "virsh", "-c", "qemu:///system", "vol-create-as", "vmsandbox", f"{name}.{vol}", "0")
    _inside(far, "virsh", "-c", "qemu:///system", "vol-upload", "--pool", "vmsandbox", f"{name}.ready", str(record))
    return name


def _swept_by_gc(
    cli: Cli, far: farhost.FarHost, env: dict[str, str], tmp_path: Path, lost: str, wiped: str, dead: str
) -> None:
    """A session whose host stops answering can be destroyed here only with --discard (`lost`), and one whose
    directory here is gone (a wiped state directory) leaves its VM or its saved volumes there (`wiped`): gc finds
    both by this machine's name (in the domain's metadata, in the owner volume), and says which host (at `dead`)
    did not answer."""
    from vmsandbox.egress import control
    from vmsandbox.session.place.remote import tunnel
    from vmsandbox.session.record import domain_name
    from vmsandbox.sync.fetch import volume

    _lost_host(cli, far, env, tmp_path, lost, dead)

    # `wiped`: stopped (no domain there, its volumes and saved memory stay), then its directory gone at once
    assert cli.run("stop", wiped, env=env).returncode == 0
    root = cli.state_dir / "sessions" / wiped
    control.stop(paths.SessionPaths(root))
    tunnel.close(root)
    aside = cli.state_dir / f"wiped-{wiped}"  # beside sessions/, on its file system (an rmtree races ssh's socket)
    root.rename(aside)
    assert f"{domain_name(wiped)}.save" in _remote_volumes(far, f"{domain_name(wiped)}.")
    stale = _stale_template(far, tmp_path)
    serving = _remote_volumes(far, "vmsandbox-template-")

    swept = cli.run("rm", "--stale", env=env)
    assert swept.returncode == 0, swept.stderr.decode()
    said = swept.stderr.decode()
    assert f"removed a superseded warm-start template on host far ({stale})" in said, said
    assert _remote_volumes(far, "vmsandbox-template-") == [v for v in serving if not v.startswith(stale)]
    assert f"destroyed domain {domain_name(lost)} on host far" in said, said
    assert f"deleted the volumes of {domain_name(wiped)} on host far" in said, said
    assert "host dead did not answer" in said, said
    listed = _inside(far, "virsh", "-c", "qemu:///system", "list", "--all", "--name").split()
    for name in (lost, wiped):
        assert _remote_volumes(far, f"{domain_name(name)}.") == []
        assert domain_name(name) not in listed
    volume.drop(paths.SessionPaths(aside))  # (its mirror's own file system, mounted by its review)
    shutil.rmtree(aside, ignore_errors=True)


def test_a_fan_out_there_is_compared_checkpointed_forked_and_its_leftovers_swept_by_gc(
    cli: Cli, far: farhost.FarHost, tmp_path: Path, project: Path, base_image: store.Image
) -> None:
    """`fanout --host far`: every session is made there (sized by that host), runs the command, is reviewed and
    compared here; one of them takes a checkpoint, rolls back to it and is forked there; then the two are lost
    in the two ways gc cleans up after (a host that stops answering, a wiped session directory), and nothing
    of them is left there. (One test: the stand-in host boots every VM under TCG.)"""
    from tests.integration.conftest import unique_name
    from vmsandbox.session.record import domain_name

    dead_uri = f"qemu+ssh://root@127.0.0.1:{farhost.free_port()}/system?command={far.ssh}&no_tty=1"
    env = cli.env(**_config(tmp_path, {"name": "far", "uri": far.uri}, {"name": "dead", "uri": dead_uri}))
    group = unique_name()
    names = [f"{group}-1", f"{group}-2"]
    try:
        made = cli.run(
            "run", "--fanout", "2", str(project), "--host", "far", "--name", group, "--check", "test -s n.txt",
            "--", "sh", "-c", "echo $VMSANDBOX_INDEX > n.txt",
            env=env,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr.decode()
        rows = {r["name"]: r for r in map(json.loads, cli.run("ls", "--json", env=env).stdout.splitlines())}
        listed = _inside(far, "virsh", "-c", "qemu:///system", "list", "--name").split()
        for name in names:
            assert rows[name]["host"] == "far" and rows[name]["group"] == group
            assert domain_name(name) in listed
        compared = cli.run("diff", names[0], "--against", names[1], "--stat", "--json", env=env)
        assert compared.returncode == 0, compared.stderr.decode()
        n_txt = next(row for row in map(json.loads, compared.stdout.splitlines()) if row["path"] == "n.txt")
        assert n_txt["sessions"] == dict.fromkeys(names, "added")
        _warm_and_distinct(cli, env, names)
        _checkpoint_and_rollback(cli, far, env, names[0])
        _swept_by_gc(cli, far, env, tmp_path, lost=names[0], wiped=names[1], dead=dead_uri)
        _a_failed_warm_start_boots_cold(cli, far, env, tmp_path, project)
    finally:
        cli.run("rm", "--group", group, "--discard", env=env)  # what a failed step left
    for name in names:
        assert _remote_volumes(far, f"{domain_name(name)}.") == []


def _a_failed_warm_start_boots_cold(
    cli: Cli, far: farhost.FarHost, env: dict[str, str], tmp_path: Path, project: Path
) -> None:
    """A template there whose saved memory cannot be restored (its save volume overwritten with zeros): the
    session boots cold there all the same, says why, and the template is marked failed; gc removes it once no
    session's disk rests on it."""
    (name,) = {v.split(".", 1)[0] for v in _remote_volumes(far, "vmsandbox-template-")}
    junk = tmp_path / "junk"  # /tmp is the stand-in host's too
    junk.write_bytes(bytes(1024 * 1024))
    _inside(far, "virsh", "-c", "qemu:///system", "vol-upload", "--pool", "vmsandbox", f"{name}.save", str(junk))
    done = cli.run("run", "--host", "far", "--yes", str(project), "--", "sh", "-c", "echo cold > cold.txt", env=env)
    said = done.stderr.decode()
    assert done.returncode == 0, said
    assert "the warm start on host far failed" in said and "booting cold" in said, said
    assert (project / "cold.txt").read_text() == "cold\n"
    assert f"{name}.failed" in _remote_volumes(far, f"{name}.")
    swept = cli.run("rm", "--stale", env=env)
    assert swept.returncode == 0, swept.stderr.decode()
    assert f"removed a warm-start template that failed a warm start on host far ({name})" in swept.stderr.decode()
    assert _remote_volumes(far, "vmsandbox-template-") == []


def _warm_and_distinct(cli: Cli, env: dict[str, str], names: list[str]) -> None:
    """Two sessions restored there from one template: each its own hostname, host key, entropy and clock."""
    probe = "hostname; id -u; id -g; cat /proc/sys/kernel/random/uuid; openssl rand -hex 16; date +%s"

    rows = {r["name"]: r for r in map(json.loads, cli.run("ls", "--json", env=env).stdout.splitlines())}
    seen = []
    for name in names:
        assert rows[name]["start"] == "warm", rows[name]
        done = cli.run(
            "exec", name, "--", "sh", "-c", probe + "; sudo ssh-keygen -y -f /etc/ssh/ssh_host_ed25519_key", env=env
        )
        assert done.returncode == 0, done.stderr.decode()
        seen.append(done.stdout.decode().splitlines())
    one, two = seen
    assert one[0] != two[0]  # hostname
    assert one[3] != two[3] and one[4] != two[4]  # random uuid, openssl rand: reseeded apart
    assert abs(int(one[5]) - time.time()) < 120  # the clock stepped to this machine's time
    assert one[-1] != two[-1]  # host key


def _checkpoint_and_rollback(cli: Cli, far: farhost.FarHost, env: dict[str, str], name: str) -> None:
    """A checkpoint keeps the VM and a copy of the workspace disk as volumes there; a rollback brings back its
    processes and files (what was unsynced is kept here first); removing it deletes its volumes and the
    overlays no chain needs."""
    from vmsandbox.session.record import domain_name

    domain = domain_name(name)
    started = "echo one > a.txt; nohup sleep 4444 >/dev/null 2>&1 &"
    assert cli.run("exec", name, "--", "sh", "-c", started, env=env).returncode == 0
    took = cli.run("checkpoint", "create", name, "c1", env=env)
    assert took.returncode == 0, took.stderr.decode()
    volumes = _remote_volumes(far, f"{domain}.")
    assert f"{domain}.cp.c1.save" in volumes and f"{domain}.cp.c1.workspace.raw" in volumes
    assert cli.run("exec", name, "--", "pgrep", "-x", "sleep", env=env).returncode == 0  # it carried on
    later = "echo two > b.txt; echo changed > a.txt; pkill -x sleep"
    assert cli.run("exec", name, "--", "sh", "-c", later, env=env).returncode == 0

    rolled = cli.run("checkpoint", "restore", name, "c1", env=env)
    assert rolled.returncode == 0, rolled.stderr.decode()
    assert "rolled-back" in rolled.stderr.decode()  # the unsynced b.txt and a.txt kept here first
    assert cli.run("exec", name, "--", "cat", "a.txt", env=env).stdout == b"one\n"
    assert cli.run("exec", name, "--", "test", "-e", "b.txt", env=env).returncode != 0
    assert cli.run("exec", name, "--", "pgrep", "-x", "sleep", env=env).returncode == 0  # back with it
    listed = [json.loads(line) for line in cli.run("checkpoint", "ls", name, "--json", env=env).stdout.splitlines()]
    assert [c["label"] for c in listed] == ["c1"]
    assert listed[0]["bytes"] > 16 * 1024**2  # as the host says: the guest's memory is most of it
    _forked_there(cli, far, env, name)

    removed = cli.run("checkpoint", "rm", name, "c1", env=env)
    assert removed.returncode == 0, removed.stderr.decode()
    record = json.loads((cli.state_dir / "sessions" / name / paths.SESSION_RECORD).read_text())
    volumes = _remote_volumes(far, f"{domain}.")
    assert not [v for v in volumes if ".cp.c1." in v]
    assert sorted(v for v in volumes if v.startswith(f"{domain}.overlay")) == sorted(record["overlays"])


def _forked_there(cli: Cli, far: farhost.FarHost, env: dict[str, str], name: str) -> None:
    """`fork` of a session there: made on that host from a checkpoint taken for it (dropped after), with the
    source's files and processes and an identity of its own; the source carries on; destroying the fork leaves
    none of its volumes."""
    from tests.integration.conftest import unique_name
    from vmsandbox.session.record import domain_name

    fork, domain = unique_name(), domain_name(name)
    assert cli.run("exec", name, "--", "sh", "-c", "echo before > f.txt", env=env).returncode == 0
    try:
        made = cli.run("create", "--from", name, "--name", fork, env=env)
        assert made.returncode == 0, made.stderr.decode()
        row = next(
            r for r in map(json.loads, cli.run("ls", "--json", env=env).stdout.splitlines()) if r["name"] == fork
        )
        assert (row["host"], row["state"]) == ("far", "running")
        assert domain_name(fork) in _inside(far, "virsh", "-c", "qemu:///system", "list", "--name").split()
        assert cli.run("exec", fork, "--", "cat", "f.txt", env=env).stdout == b"before\n"
        assert cli.run("exec", fork, "--", "pgrep", "-x", "sleep", env=env).returncode == 0  # it ran on
        assert cli.run("exec", fork, "--", "hostname", env=env).stdout.decode().strip() == f"vmsandbox-{fork}"
        key = "/etc/ssh/ssh_host_ed25519_key"
        keys = cli.run("exec", fork, "--", "sudo", "ssh-keygen", "-y", "-f", key, env=env).stdout.split()
        mine = paths.session_paths(fork).host_key.with_suffix(".pub").read_bytes().split()
        theirs = paths.session_paths(name).host_key.with_suffix(".pub").read_bytes().split()
        assert keys[:2] == mine[:2] != theirs[:2]
        assert cli.run("exec", fork, "--", "sh", "-c", "echo fork > only-fork.txt", env=env).returncode == 0
        assert cli.run("exec", name, "--", "test", "-e", "only-fork.txt", env=env).returncode != 0  # apart
        assert not [v for v in _remote_volumes(far, f"{domain}.") if ".cp.fork-" in v]  # its checkpoint dropped
    finally:
        gone = cli.run("rm", fork, "--discard", env=env)
    assert gone.returncode == 0, gone.stderr.decode()
    assert _remote_volumes(far, f"{domain_name(fork)}.") == []
    assert cli.run("exec", name, "--", "cat", "f.txt", env=env).stdout == b"before\n"  # the source carries on
