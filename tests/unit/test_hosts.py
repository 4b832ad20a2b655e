"""Hosts: the `hosts:` config, what `host prepare` records of an image sent, and both ends of a sparse stream."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from vmsandbox import paths
from vmsandbox.errors import VmsandboxError
from vmsandbox.image.store import Image
from vmsandbox.session import settings
from vmsandbox.session.place import choose, hostspec
from vmsandbox.session.place.local.place import LocalHost
from vmsandbox.session.place.remote import images
from vmsandbox.session.place.remote.place import RemoteHost
from vmsandbox.vm import storage
from vmsandbox.vm.node import Node, here


def _user_config(_tmp_path: Path, text: str) -> None:
    settings = paths.config_dir()  # (the test's own: conftest.isolated_dirs)
    settings.mkdir(exist_ok=True)
    (settings / "config.yaml").write_text(text)


def test_hosts_are_read_from_the_user_config(tmp_path: Path) -> None:
    _user_config(
        tmp_path,
        "hosts:\n"
        "  - name: big\n    uri: qemu+ssh://me@big.example/system\n    max_sessions: 4\n    keep_free: 2G\n"
        "  - name: lab-2\n    uri: qemu+tls://lab2/system\n    pool_path: /srv/vms/\n",
    )
    s = settings.load()
    assert s.hosts == (
        hostspec.HostSpec("big", "qemu+ssh://me@big.example/system", 4, 2048),
        hostspec.HostSpec("lab-2", "qemu+tls://lab2/system", None, 1024, "/srv/vms"),
    )
    assert [h.name for h in hostspec.every(s.libvirt_uri, s.hosts)] == ["local", "big", "lab-2"]
    every = hostspec.every(s.libvirt_uri, s.hosts)
    assert isinstance(choose.Hosts(s.libvirt_uri, every).at(every[0]), LocalHost)
    assert all(isinstance(choose.Hosts(s.libvirt_uri, every).at(h), RemoteHost) for h in every[1:])
    assert hostspec.named(s.libvirt_uri, s.hosts, "lab-2").uri == "qemu+tls://lab2/system"
    with pytest.raises(VmsandboxError, match="no host named 'lab3'") as err:
        hostspec.named(s.libvirt_uri, s.hosts, "lab3")
    assert err.value.hint is not None and "local, big, lab-2" in err.value.hint


@pytest.mark.parametrize(
    ("entry", "needle"),
    [
        ("{name: a, uri: 'qemu+tcp://h/system'}", "neither encrypts nor authenticates"),
        ("{name: a, uri: 'xen+ssh://h/'}", "is not a libvirt QEMU URI"),
        ("{name: a, uri: 'qemu+ssh://h/'}", "is not a libvirt QEMU URI"),
        ("{name: a, uri: 'qemu+ssh://h/system?no_verify=1'}", "turns off the check of the host's SSH key"),
        ("{name: local, uri: 'qemu+ssh://h/system'}", "`name` 'local' is not a host name"),
        ("{name: Big Box, uri: 'qemu+ssh://h/system'}", "is not a host name"),
        ("{name: a, uri: 'qemu+ssh://h/system', max_sessions: 0}", "`max_sessions` must be at least 1"),
        ("{name: a, uri: 'qemu+ssh://h/system', pool_path: 'vms'}", "`pool_path` must be an absolute path"),
        ("{name: a, uri: 'qemu+ssh://h/system', maxsessions: 2}", "unknown key `maxsessions`"),
        ("{name: a}", "missing key `uri`"),
        ("{name: a, uri: 'qemu+ssh://h/system', keep_free: lots}", "cannot read size"),
    ],
)
def test_a_bad_host_entry_names_the_file_the_entry_and_the_key(tmp_path: Path, entry: str, needle: str) -> None:
    _user_config(tmp_path, f"cpus: 1\nhosts:\n  - {entry}\n")
    with pytest.raises(VmsandboxError) as err:
        settings.load()
    assert needle in err.value.message
    assert "config.yaml, line 3" in err.value.message  # the entry's own line (issue 46: it said `hosts:`'s, 2)
    assert "`hosts[0]`" in err.value.message


def test_a_host_named_twice_is_an_error(tmp_path: Path) -> None:
    _user_config(tmp_path, "hosts:\n  - {name: a, uri: 'qemu:///system'}\n  - {name: a, uri: 'qemu+ssh://h/system'}\n")
    with pytest.raises(VmsandboxError, match="given twice"):
        settings.load()


def test_hosts_never_come_from_a_project(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / ".vmsandbox.yaml").write_text("hosts:\n  - {name: evil, uri: 'qemu+ssh://attacker/system'}\n")
    with pytest.raises(VmsandboxError, match="`hosts` is never taken from a project file") as err:
        settings.load(project)
    assert err.value.hint is not None and "VMSANDBOX_LIBVIRT_URI" not in err.value.hint


def test_the_config_schema_describes_a_host_entry() -> None:
    from vmsandbox.core.settings import json_schema
    from vmsandbox.filemodels import HostEntry, keys

    doc = json_schema()
    hosts = doc["properties"]["hosts"]
    assert hosts["type"] == "array"
    entry = doc["$defs"][hosts["items"]["$ref"].rsplit("/", 1)[1]]
    assert entry["required"] == ["name", "uri"]
    assert set(entry["properties"]) == set(keys(HostEntry))
    assert entry["additionalProperties"] is False


def _image(tmp_path: Path, built_at: str = "2026-12-01T10:00:00") -> Image:
    d = tmp_path / "base-x"
    d.mkdir(exist_ok=True)
    for f, size in zip(images.FILES, (3000, 200, 100), strict=True):
        (d / f).write_bytes(b"x" * size)
    return Image("x", d, {"built_at": built_at})


def test_what_was_sent_matches_only_the_same_build_and_sizes(tmp_path: Path) -> None:
    image = _image(tmp_path)
    sent = images.Sent("2026-12-01T10:00:00", {f: ((image.path / f).stat().st_size, "ab" * 32) for f in images.FILES})
    again = images.Sent.parse(sent.as_json().encode() + b"\0\0")
    assert again == sent
    assert again.matches(image)
    assert not images.Sent("2026-12-02T10:00:00", sent.files).matches(image)  # rebuilt since
    (image.path / "vmlinuz").write_bytes(b"y" * 201)
    assert not sent.matches(image)
    assert not images.Sent(sent.built_at, dict(list(sent.files.items())[:2])).matches(image)


@pytest.mark.parametrize("raw", [b"", b"{", b"[]", b'{"built_at": 1}', b'{"built_at": "a", "files": {"f": [1]}}'])
def test_a_damaged_record_of_what_was_sent_is_none(raw: bytes) -> None:
    assert images.Sent.parse(raw) is None


def _sparse(path: Path) -> bytes:
    """A file with a hole at its start, data, a hole in the middle, data, and a hole at its end; its bytes."""
    with path.open("wb") as f:
        f.seek(1 << 20)
        f.write(b"A" * 5000)
        f.seek(3 << 20)
        f.write(b"B" * 7000)
        f.truncate(5 << 20)
    return path.read_bytes()


def _send(path: Path) -> tuple[list[tuple[str, Any]], storage.Outgoing]:
    """What libvirt's sparseSendAll would do with our handlers: ask for the section, then skip or read it."""
    fd = os.open(path, os.O_RDONLY)
    done: list[int] = []
    sending = storage.Outgoing(fd, done.append)
    steps: list[tuple[str, Any]] = []
    try:
        while True:
            in_data, length = sending.section(None, None)
            if length == 0:
                break
            if in_data:
                data = b""
                while len(data) < length:
                    chunk = sending.read(None, min(4096, length - len(data)), None)
                    assert chunk
                    data += chunk
                steps.append(("data", data))
            else:
                sending.skip(None, length, None)
                steps.append(("hole", length))
    finally:
        os.close(fd)
    assert done[-1] == path.stat().st_size
    return steps, sending


def test_a_sparse_file_is_sent_as_its_data_and_its_holes_and_hashed_whole(tmp_path: Path) -> None:
    whole = _sparse(tmp_path / "disk")
    steps, sending = _send(tmp_path / "disk")
    holes = [n for kind, n in steps if kind == "hole"]
    data = [d for kind, d in steps if kind == "data"]
    assert len(holes) >= 2, steps  # the file system kept holes: they are skipped, not read
    assert sum(holes) + sum(len(d) for d in data) == len(whole)
    assert sum(len(d) for d in data) < len(whole) // 4
    assert sending.sha.hexdigest() == hashlib.sha256(whole).hexdigest()

    received = storage.Incoming(keep=(1 << 20) + 10)
    for kind, item in steps:  # the same stream read back: the same hash, and the first bytes kept
        if kind == "hole":
            assert received.hole(None, item, None) == 0
        else:
            assert received.data(None, item, None) == len(item)
    assert received.sha.hexdigest() == sending.sha.hexdigest()
    assert bytes(received.kept) == whole[: (1 << 20) + 10]


def test_the_stream_of_a_file_without_holes_is_all_data(tmp_path: Path) -> None:
    (tmp_path / "k").write_bytes(os.urandom(10000))
    steps, sending = _send(tmp_path / "k")
    assert [k for k, _ in steps] == ["data"]
    assert sending.sha.hexdigest() == hashlib.sha256((tmp_path / "k").read_bytes()).hexdigest()


def test_xml_of_a_pool_and_a_volume_is_built_as_data() -> None:
    assert "<path>/srv/a&amp;b</path>" in storage.pool_xml("vmsandbox", "/srv/a&b")
    vol = storage.volume_xml("base-x.disk.qcow2", 1234)
    assert '<capacity unit="bytes">1234</capacity>' in vol and '<format type="raw" />' in vol
    # a copy keeps its source's format: a qcow2 overlay copied as raw would not boot
    overlay = storage.volume_xml("d.overlay.qcow2", 1 << 30, backing="/pool/base.qcow2")
    assert '<format type="qcow2" />' in storage.copy_xml("fork.overlay.qcow2", overlay)
    assert "backingStore" not in storage.copy_xml("fork.overlay.qcow2", overlay)
    assert '<format type="raw" />' in storage.copy_xml("fork.workspace.raw", vol)


def test_kvm_on_a_host_needs_the_cpu_flag_and_libvirt_saying_yes() -> None:
    node = Node("h", "9.0.0", "7.2.0", 8, 32768, 30000, frozenset({"vmx", "aes"}), None)
    assert node.kvm_problem() is None and node.accel == "kvm"
    no_flag = Node("h", "9.0.0", "7.2.0", 8, 32768, 30000, frozenset({"hypervisor"}), None)
    assert no_flag.accel == "tcg" and "vmx/svm" in (no_flag.kvm_problem() or "")
    refused = Node("h", "9.0.0", "7.2.0", 8, 32768, 30000, frozenset({"svm"}), "KVM is not supported")
    assert refused.kvm_problem() == "KVM is not supported"


def test_host_listing_rows_keep_their_keys_when_a_host_does_not_answer() -> None:
    from vmsandbox.session.host import hosts

    up = hosts.Status(
        hostspec.HostSpec("far", "qemu+ssh://h/system", 2),
        Node("h", "9.0.0", "7.2.0", 8, 32768, 30000, frozenset({"vmx"}), None),
        None,
        1,
        ("base-x",),
    )
    down = hosts.Status(hostspec.HostSpec("gone", "qemu+ssh://g/system"), None, "no answer in 20 s")
    assert set(up.as_dict()) == set(down.as_dict())
    assert up.as_dict()["accel"] == "kvm" and down.as_dict()["accel"] is None
    assert json.loads(json.dumps(down.as_dict()))["problem"] == "no answer in 20 s"


def _qcow2_header(backing: bytes, cluster: int = 65536) -> bytes:
    """The first cluster of a qcow2 v3 file naming `backing` at offset 528 (as qemu-img writes it)."""
    import struct

    head = bytearray(cluster)
    head[:4] = images.QCOW2_MAGIC
    head[4:8] = struct.pack(">I", 3)
    head[8:20] = struct.pack(">QI", 528, len(backing))
    head[528 : 528 + len(backing)] = backing
    return bytes(head)


def test_a_layer_header_is_rewritten_to_name_the_base_volume_on_the_way(tmp_path: Path) -> None:
    old = b"/var/lib/vmsandbox/images/base-bookworm-1234/disk.qcow2"
    disk = tmp_path / "disk.qcow2"
    disk.write_bytes(_qcow2_header(old) + b"D" * 100000)
    patches = images.backing_patch(disk, "base-bookworm-1234.disk.qcow2")
    fd = os.open(disk, os.O_RDONLY)
    try:
        sending = storage.Outgoing(fd, None, patches)
        sent = b""
        while chunk := sending.read(None, 333, None):  # reads that start and end inside the patched bytes
            sent += chunk
    finally:
        os.close(fd)
    assert disk.read_bytes()[528 : 528 + len(old)] == old  # the file here is not touched
    assert len(sent) == disk.stat().st_size
    assert sent[16:20] == len(b"base-bookworm-1234.disk.qcow2").to_bytes(4, "big")
    assert sent[528 : 528 + len(old)] == b"base-bookworm-1234.disk.qcow2".ljust(len(old), b"\0")
    assert sent[:16] == disk.read_bytes()[:16] and sent[600:] == disk.read_bytes()[600:]
    assert sending.sha.hexdigest() == hashlib.sha256(sent).hexdigest()


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"not an image at all" * 10, "is not a qcow2 image"),
        (_qcow2_header(b"short"), "where it cannot be rewritten"),
        (_qcow2_header(b""), "where it cannot be rewritten"),
    ],
)
def test_a_header_that_cannot_take_the_new_name_is_refused(tmp_path: Path, content: bytes, needle: str) -> None:
    (tmp_path / "d").write_bytes(content)
    with pytest.raises(VmsandboxError, match=needle):
        images.backing_patch(tmp_path / "d", "base-bookworm-1234.disk.qcow2")


def test_the_tunnel_reaches_the_host_as_libvirt_does() -> None:
    from vmsandbox.session.place.remote import tunnel

    argv = tunnel.ssh_argv("qemu+ssh://me@big.example:2222/system?keyfile=/k/id&command=/opt/ssh&no_verify=0")
    assert argv[0] == "/opt/ssh"
    assert argv[argv.index("-p") + 1] == "2222" and argv[argv.index("-i") + 1] == "/k/id"
    assert argv[argv.index("-l") + 1] == "me"
    assert "StrictHostKeyChecking=yes" in argv and "BatchMode=yes" in argv  # the host's key is always checked
    assert argv[-2:] == ["--", "big.example"]
    plain = tunnel.ssh_argv("qemu+ssh://big/system")
    assert plain[0] == "ssh" and "-p" not in plain and "-l" not in plain and "StrictHostKeyChecking=yes" in plain
    with pytest.raises(VmsandboxError, match="no_verify") as err:
        tunnel.ssh_argv("qemu+ssh://big/system?no_verify=1")
    assert err.value.hint is not None and "known_hosts" in err.value.hint
    forward = tunnel.forward_argv("qemu+ssh://big/system", 41000, 25000)
    assert forward[forward.index("-L") + 1] == "127.0.0.1:41000:127.0.0.1:25000"  # loopback at both ends
    assert "-N" in forward and "ExitOnForwardFailure=yes" in forward
    assert forward[-2:] == ["--", "big"]  # options before the host, never after it
    for uri in ("qemu+tls://big/system", "qemu:///system"):
        with pytest.raises(VmsandboxError, match="not an ssh URI"):
            tunnel.ssh_argv(uri)


def test_run_on_another_host_checks_the_host_before_anything_is_made(
    tmp_path: Path, isolated_dirs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.unit.test_cli import run_cli
    from vmsandbox.cli import base

    _user_config(
        tmp_path,
        "hosts:\n  - {name: big, uri: 'qemu+ssh://me@big/system'}\n  - {name: tls, uri: 'qemu+tls://t/system'}\n",
    )
    project = tmp_path / "proj"
    project.mkdir()
    assert run_cli(["run", str(project), "--host", "nowhere", "--", "true"]) == base.EXIT_USAGE
    err = capsys.readouterr().err
    assert "no host named 'nowhere'" in err and "local, big, tls" in err
    assert run_cli(["run", str(project), "--host", "tls", "--", "true"]) == base.EXIT_RUN_FAILED
    assert "not an ssh URI" in capsys.readouterr().err
    assert not (isolated_dirs / "state" / "sessions").exists() or not any(
        (isolated_dirs / "state" / "sessions").iterdir()
    )


def test_a_long_chain_there_is_refused_with_the_fork_that_starts_over() -> None:
    from vmsandbox.session.moments import checkpoint
    from vmsandbox.session.place.remote.checkpoint import MAX_CHAIN
    from vmsandbox.session.record import Record

    def check_room(record: Record) -> None:
        with choose.vm_of(record) as vm:  # nothing asked of its host: its abilities say it
            checkpoint.check_room(vm)

    record = Record("exp", "/p", "v", "tcg", "", 1, 512, 4096, 0, "u", 1000, 1000, "qemu+ssh://me@big/system")
    record.host = "big"
    record.overlays = [f"o{i}" for i in range(MAX_CHAIN - 1)]
    check_room(record)
    record.overlays.append("top")
    with pytest.raises(VmsandboxError, match="runs on host big over 18 overlays") as refused:
        check_room(record)
    assert "vmsandbox create --from exp:LABEL --name NEW" in str(refused.value.hint)
    record.libvirt_uri, record.host = "qemu:///system", "local"
    check_room(record)  # this machine's: folded, nothing to refuse


def test_a_volume_read_into_a_file_keeps_its_holes(tmp_path: Path) -> None:
    whole = _sparse(tmp_path / "disk")
    steps, _ = _send(tmp_path / "disk")
    fd = os.open(tmp_path / "copy", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        into = storage.Incoming(into=fd)
        for kind, item in steps:
            if kind == "hole":
                into.hole(None, item, None)
            else:
                into.data(None, item, None)
    finally:
        os.close(fd)
    assert (tmp_path / "copy").read_bytes() == whole
    assert (tmp_path / "copy").stat().st_blocks < (tmp_path / "disk").stat().st_size // 512 // 4


class _Host:
    """What check_room asks of a host: its vmsandbox domains and its memory."""

    def __init__(self, running: int, available_mib: int) -> None:
        from vmsandbox.vm.node import DomainInfo

        self.found = [DomainInfo(f"vmsandbox-s{i}", "running", None) for i in range(running)]
        self.found.append(DomainInfo("vmsandbox-old", "shutoff", None))
        self.available_mib = available_mib

    def domains(self, prefix: str) -> list[Any]:
        assert prefix == "vmsandbox-"
        return self.found

    def node(self) -> Node:
        return Node("h", "9", "7", 8, 65536, self.available_mib, frozenset({"vmx"}), None)


def test_a_host_s_limits_are_kept_when_a_session_is_placed_there() -> None:
    from vmsandbox.session.place import room

    host = hostspec.HostSpec("big", "qemu+ssh://big/system", max_sessions=3, keep_free_mib=4096)
    room.check(_Host(2, 8192), host, 2048)  # type: ignore[arg-type]  # a third fits, leaving 6 GiB
    with pytest.raises(VmsandboxError, match="host big runs 3 session") as err:
        room.check(_Host(3, 60000), host, 2048)  # type: ignore[arg-type]
    assert err.value.hint is not None and "another --host" in err.value.hint
    with pytest.raises(VmsandboxError, match="6000 MiB of memory available: a 2048 MiB session would leave less"):
        room.check(_Host(0, 6000), host, 2048)  # type: ignore[arg-type]
    room.check(_Host(9, 6144), hostspec.HostSpec("any", "qemu+ssh://a/system"), 2048)  # type: ignore[arg-type]


def test_this_machine_keeps_its_keep_free_too() -> None:
    from vmsandbox.session.place import room

    local = hostspec.HostSpec(hostspec.LOCAL, "qemu:///system")  # keep_free 1 GiB, no max_sessions
    room.check(_Host(50, 3072), local, 2048)  # type: ignore[arg-type]
    with pytest.raises(VmsandboxError, match="this machine has 3071 MiB of memory available") as err:
        room.check(_Host(0, 3071), local, 2048)  # type: ignore[arg-type]
    assert err.value.hint is not None and "end a session" in err.value.hint


def test_how_many_more_sessions_fit() -> None:
    from vmsandbox.session.place import room

    # 20 GiB available, 1 GiB kept free, 2 GiB sessions that take 256 MiB each once started: the last one
    # admitted still has its whole 2 GiB to grow into
    assert room.fits(20480, 1024, 2048, 256) == (20480 - 1024 - 2048) // 256 + 1 == 69
    assert room.fits(20480, 1024, 2048, None) == 9  # nothing runs to measure: each counted whole
    assert room.fits(3071, 1024, 2048, 256) == 0 and room.fits(3072, 1024, 2048, 256) == 1


def _status(name: str, available: int | None, sessions: int = 0, **limits: Any) -> Any:
    from vmsandbox.session.host import hosts

    uri = "qemu:///system" if name == "local" else f"qemu+ssh://{name}/system"
    spec = hostspec.HostSpec(name, uri, **limits)
    if available is None:
        return hosts.Status(spec, None, "no answer in 5 s")
    return hosts.Status(spec, Node(name, "9", "7", 8, 65536, available, frozenset(), None), None, sessions)


def test_placement_takes_the_host_with_the_most_memory_that_has_room() -> None:
    from vmsandbox.session.host import hosts

    found = [
        _status("local", 6000),
        _status("big", 60000, sessions=4, max_sessions=4),  # full
        _status("mid", 30000),
        _status("down", None),
        _status("tight", 40000, keep_free_mib=39000),  # 2 GiB more would break its keep_free
    ]
    placed = hosts.place(found, 2048)
    assert placed.spec.name == "mid"
    assert "30000 MiB" in placed.reason and "2 host(s) with room" in placed.reason
    assert hosts.room(found[1], 2048) == "4 session(s) run there, its max_sessions"
    assert hosts.room(found[3], 2048) == "no answer in 5 s"
    assert hosts.room(found[4], 2048) == "40000 MiB available, keep_free 39000 MiB"
    assert hosts.place([_status("local", 30000), _status("twin", 30000)], 2048).spec.name == "local"  # a tie: here


def test_placement_stays_here_when_no_host_has_room_and_says_why() -> None:
    from vmsandbox.session.host import hosts

    tls = _status("tls", 90000)
    tls = hosts.Status(hostspec.HostSpec("tls", "qemu+tls://tls/system"), tls.node, None)
    assert hosts.room(tls, 2048) == "not an ssh URI (sessions reach another host over ssh)"
    placed = hosts.place([_status("local", 1500), _status("big", None), tls], 2048)
    assert placed.spec.name == "local"
    assert "no host has room" in placed.reason and "big: no answer in 5 s" in placed.reason


def test_opening_another_hosts_libvirt_gives_up_when_it_never_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading
    import time

    from vmsandbox.vm import node

    monkeypatch.setattr(node, "OPEN_TIMEOUT", 0.2)
    never = threading.Event()
    began = time.monotonic()
    with pytest.raises(TimeoutError):
        node.opened("qemu+ssh://me@far.example/system", never.wait)  # a silent host: the call never returns
    assert time.monotonic() - began < 5  # not the hang it plays
    never.set()
    with pytest.raises(ValueError, match="refused"):  # what the call raises reaches the caller as it is

        def refuse() -> None:
            raise ValueError("refused")

        node.opened("qemu+ssh://me@far.example/system", refuse)
    thread = threading.current_thread()
    assert node.opened("qemu:///system", threading.current_thread) is thread  # this machine: called right here
    assert node.opened("qemu+ssh://me@far.example/system", lambda: 7) == 7


def test_a_fan_out_on_another_host_starts_as_many_at_once_as_that_host_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    from vmsandbox.session.host import hosts
    from vmsandbox.session.moments import fanout
    from vmsandbox.session.options import Options, Run
    from vmsandbox.sync.review.take import Take

    spec = hostspec.HostSpec("big", "qemu+ssh://me@big/system")
    config = settings.Settings(memory_mib=2048)
    run = Run(Options(project=Path("/p"), name=None, settings=config, host=spec), ["true"], False, True, Take())

    def answering(tcg: bool, available_mib: int) -> None:
        node = Node("big", "9", "7", 8, 65536, available_mib, frozenset() if tcg else frozenset({"vmx"}), None)
        monkeypatch.setattr(hosts, "probe", lambda s: hosts.Status(s, node, None))

    answering(tcg=False, available_mib=7000)
    assert fanout.workers(run, 10) == 3  # its memory, not this machine's
    answering(tcg=True, available_mib=60000)
    assert fanout.workers(run, 10) == 10  # under TCG, two per CPU of its 8: all 10
    assert fanout.workers(run, 20) == 16
    monkeypatch.setattr(hosts, "probe", lambda s: hosts.Status(s, None, "Connection refused"))
    with pytest.raises(VmsandboxError, match="host big does not answer: Connection refused"):
        fanout.workers(run, 10)


def test_a_node_is_read_from_libvirts_answers() -> None:
    caps = "<capabilities><host><cpu><arch>x86_64</arch><feature name='vmx'/><feature name='avx'/></cpu></host>"
    stats = {"total": 8 * 1024 * 1024, "free": 1024 * 1024, "buffers": 512 * 1024, "cached": 512 * 1024}
    node = Node.of("h", "9.0.0", "7.2.0", 4, stats, caps + "</capabilities>", None)
    assert (node.memory_mib, node.available_mib, node.cpu_features) == (8192, 2048, frozenset({"vmx", "avx"}))
    assert node.accel == "kvm"
    assert Node.of("h", "9", "7", 4, {"total": 1024, "free": 0}, "<capabilities/>", None).accel == "tcg"


def test_this_machines_memory_available_is_the_kernels_not_libvirts_cached() -> None:
    # libvirt's `cached` counts shared memory (a template's held memory, tmpfs), which no pressure gives back:
    # admission read 2 GiB more than the kernel had to give with 100 sessions of one template
    stats = {"total": 24 * 1024 * 1024, "free": 512 * 1024, "buffers": 0, "cached": 3 * 1024 * 1024}
    meminfo = "MemTotal: 25165824 kB\nMemFree: 524288 kB\nMemAvailable: 1048576 kB\nShmem: 2097152 kB\n"
    caps = "<capabilities/>"
    assert Node.of("h", "9", "7", 4, stats, caps, None).available_mib == 3584  # another host: what libvirt says
    assert Node.of("h", "9", "7", 4, stats, caps, None, meminfo=meminfo).available_mib == 1024
    assert Node.of("h", "9", "7", 4, stats, caps, None, meminfo="MemTotal: 1 kB\n").available_mib == 3584
    assert here("qemu:///system") and here("qemu+unix:///system") and not here("qemu+ssh://root@big.example/system")


def test_domain_states_are_named_by_libvirts_numbers() -> None:
    import libvirt

    from vmsandbox.vm.node import state_name

    named = {
        libvirt.VIR_DOMAIN_NOSTATE: "nostate",
        libvirt.VIR_DOMAIN_RUNNING: "running",
        libvirt.VIR_DOMAIN_BLOCKED: "running",
        libvirt.VIR_DOMAIN_PAUSED: "paused",
        libvirt.VIR_DOMAIN_SHUTDOWN: "shutting-down",
        libvirt.VIR_DOMAIN_SHUTOFF: "shutoff",
        libvirt.VIR_DOMAIN_CRASHED: "crashed",
        libvirt.VIR_DOMAIN_PMSUSPENDED: "suspended",
    }
    assert {state: state_name(state) for state in named} == named
    assert state_name(99) == state_name(-1) == "unknown"
