"""Warm starts without a VM: the save image clone, the restore XML, the identity bundle and reply, templates'
keys and the reasons a session boots cold."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import socket
import tarfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.unit.test_domain import qemu_args, spec
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest import identity
from vmsandbox.image.store import Image
from vmsandbox.session.place import templates
from vmsandbox.session.place.local import template
from vmsandbox.vm import savefile
from vmsandbox.vm.domain import build_xml, for_restore, session_of, with_netdev, workspace_xml


def fake_save(path: Path, xml: str, stream: bytes, *, pad: int = 4096) -> None:
    cookie = b"<cookie>\n  <slirpHelper/>\n</cookie>\n"
    body = xml.encode() + b"\0" + cookie + b"\0"
    data = body.ljust(len(body) + pad, b"\0")
    head = savefile.HEADER.pack(savefile.MAGIC, 2, len(data), 1, 0, len(xml.encode()) + 1, b"\0" * 56)
    path.write_bytes(head + data + stream)


def template_xml() -> str:
    s = dataclasses.replace(
        spec(),
        name="vmsandbox-template-ab12",
        fwcfg_files={"template": Path("/tmpl/.tmp-ab12/fwcfg/template")},
        channel=Path("/tmpl/.tmp-ab12/identity.sock"),
        forwards=(),
        template=True,
    )
    root = ET.fromstring(build_xml(s))  # noqa: S314
    ET.SubElement(root, "uuid").text = "11111111-2222-4333-8444-555555555555"  # what libvirt adds
    return ET.tostring(root, encoding="unicode")


def test_clone_rewrites_name_and_uuid_and_keeps_the_memory_stream(tmp_path: Path) -> None:
    stream = b"QEVM\0\0\0\3" + bytes(range(256)) * 1000
    fake_save(tmp_path / "t.save", template_xml(), stream)
    saved = savefile.read(tmp_path / "t.save")
    xml = savefile.renamed(saved.xml, "vmsandbox-s1", "99999999-2222-4333-8444-555555555555")
    savefile.clone(tmp_path / "t.save", tmp_path / "s1.save", xml)
    again = savefile.read(tmp_path / "s1.save")
    root = ET.fromstring(again.xml)  # noqa: S314
    assert root.findtext("name") == "vmsandbox-s1"
    assert root.findtext("uuid") == "99999999-2222-4333-8444-555555555555"
    assert again.cookie == saved.cookie
    assert (tmp_path / "s1.save").read_bytes()[again.stream_offset :] == stream
    with pytest.raises(FileExistsError):  # never over another file
        savefile.clone(tmp_path / "t.save", tmp_path / "s1.save", xml)


def test_clone_grows_the_header_when_the_new_xml_is_longer(tmp_path: Path) -> None:
    fake_save(tmp_path / "t.save", template_xml(), b"QEVM-stream", pad=0)
    saved = savefile.read(tmp_path / "t.save")
    longer = savefile.renamed(saved.xml, "vmsandbox-" + "x" * 200, "99999999-2222-4333-8444-555555555555")
    savefile.clone(tmp_path / "t.save", tmp_path / "s.save", longer)
    again = savefile.read(tmp_path / "s.save")
    assert again.xml == longer
    assert (tmp_path / "s.save").read_bytes()[again.stream_offset :] == b"QEVM-stream"


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b[:50],  # truncated
        lambda b: b"LibvirtQemudPart" + b[16:],  # libvirt's mark of an unfinished save
        lambda b: b[:16] + (3).to_bytes(4, "little") + b[20:],  # another version
        lambda b: b[:28] + (1).to_bytes(4, "little") + b[32:],  # compressed
    ],
)
def test_unusable_save_images_are_refused(tmp_path: Path, damage: object) -> None:
    fake_save(tmp_path / "t.save", template_xml(), b"QEVM")
    data = (tmp_path / "t.save").read_bytes()
    (tmp_path / "t.save").write_bytes(damage(data))  # type: ignore[operator]
    with pytest.raises(savefile.SaveImageError):
        savefile.read(tmp_path / "t.save")


def test_restore_xml_keeps_the_guest_abi_and_takes_the_sessions_host_side() -> None:
    session = dataclasses.replace(
        spec(), fwcfg_files={"template": Path("/state/sessions/s1/fwcfg/template")}, channel=Path("/s/id.sock")
    )
    xml = for_restore(template_xml(), session)
    root = ET.fromstring(xml)  # noqa: S314
    assert root.findtext("name") == "vmsandbox-s1"
    assert session_of(xml) == ("s1", Path("/state/sessions/s1"))  # a session's now, not a template's
    assert root.find("devices/disk/source").get("file") == "/state/sessions/s1/overlay.qcow2"  # type: ignore[union-attr]
    assert root.find("devices/serial/source").get("path") == "/state/sessions/s1/console.log"  # type: ignore[union-attr]
    assert root.find("devices/channel/source").get("path") == "/s/id.sock"  # type: ignore[union-attr]
    assert root.find("sysinfo/entry").get("file") == "/state/sessions/s1/fwcfg/template"  # type: ignore[union-attr]
    assert "hostfwd=tcp:127.0.0.1:40022-:22" in qemu_args(xml)[1]
    assert "restrict=on" in qemu_args(xml)[1]
    assert root.findtext("uuid") == "11111111-2222-4333-8444-555555555555"  # savefile.renamed sets the session's
    old = ET.fromstring(template_xml())  # noqa: S314
    assert [d.tag for d in root.find("devices")] == [d.tag for d in old.find("devices")]  # type: ignore[union-attr]


def test_restore_xml_refuses_a_template_that_reads_fwcfg_the_session_lacks() -> None:
    with pytest.raises(ValueError, match="template"):
        for_restore(template_xml(), spec())


def test_workspace_is_hot_plugged_as_a_scsi_disk_found_by_serial() -> None:
    el = ET.fromstring(workspace_xml(Path("/s/workspace.img")))  # noqa: S314
    assert el.find("target").get("bus") == "scsi"  # type: ignore[union-attr]
    assert el.findtext("serial") == "vmsandbox-workspace"


def test_identity_bundle_has_the_files_the_clock_and_a_fresh_seed(tmp_path: Path) -> None:
    for name, text in {"hostname": "vmsandbox-s1\n", "host_key": "KEY", "template": "1\n"}.items():
        (tmp_path / name).write_text(text)

    def members(data: bytes) -> dict[str, bytes]:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]

    one = members(identity.bundle(tmp_path, now=1234.5))
    assert sorted(one) == ["clock", "host_key", "hostname", "seed"]  # the template marker is the domain's only
    assert one["clock"] == b"1234.500000\n"
    seeds = [one["seed"], members(identity.bundle(tmp_path))["seed"]]
    assert len(seeds[0]) == identity.SEED_BYTES
    assert seeds[0] != seeds[1]


@pytest.mark.parametrize(
    ("guest", "expected"),
    [
        (b"ok\n", None),
        (b"ok forks\n", None),
        (b"error: sshd did not start\n", "sshd did not start"),
        (b"\x1b]0;owned\x07ok\n", "\\x1b]0;owned\\x07ok"),  # shown escaped, never obeyed
        (b"A" * 100_000, "A" * 100),  # bounded
        (b"", "(no answer)"),
    ],
)
def test_the_guests_answer_is_bounded_and_escaped(tmp_path: Path, guest: bytes, expected: str | None) -> None:
    (tmp_path / "fw").mkdir()
    (tmp_path / "fw" / "hostname").write_text("x\n")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(tmp_path / "id.sock"))
    server.listen(1)

    def fake_guest() -> None:
        conn, _ = server.accept()
        _read_identity(conn)
        # a flood: the host stops reading at REPLY_LIMIT and hangs up, which is the point
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            conn.sendall(guest)
        conn.close()

    t = threading.Thread(target=fake_guest)
    t.start()
    try:
        if expected is None:
            identity.send(tmp_path / "id.sock", tmp_path / "fw", timeout=10)
        else:
            with pytest.raises(VmsandboxError) as err:
                identity.send(tmp_path / "id.sock", tmp_path / "fw", timeout=10)
            assert expected in err.value.message
            assert len(err.value.message) < identity.REPLY_LIMIT * 4 + 100
    finally:
        t.join()
        server.close()


def _read_identity(conn: socket.socket) -> None:
    """What the host sends on the port: its header line, then the bundle of the size the header names."""
    header = b""
    while not header.endswith(b"\n"):
        header += conn.recv(1)
    size, got = int(header.split()[1]), 0
    while got < size:
        got += len(conn.recv(65536))


def _fake_guest(server: socket.socket, answer: bytes, hold: threading.Event | None = None) -> None:
    """Take the identity (header and bundle) on the port, send `answer`, hang up (once `hold` is set)."""
    conn, _ = server.accept()
    with conn:
        _read_identity(conn)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            conn.sendall(answer)
        if hold is not None:
            hold.wait(30)


@pytest.mark.parametrize(
    ("guest", "expected"),
    [
        (b"taking\nok forks\n", True),
        (b"taking\nok\n", False),  # taken: its forks get theirs with a login (not this one a second time)
        (b"taking\nok forks   \n", "ok forks"),  # compared as it came
        (b"taking  \nok forks\n", identity.NotListeningError),
        (b"taking\n", "(no answer)"),  # the guest hung up after taking it
        (b"taking\nerror: sshd did not reload\n", "sshd did not reload"),
        (b"taking\n\x1b]0;owned\x07\n", "\\x1b]0;owned\\x07"),  # shown escaped, never obeyed
        (b"taking\n" + b"A" * 100_000, "A" * 100),  # bounded
        (b"ok forks\n", identity.NotListeningError),  # not "taking": the host logs in instead
        (b"\x1b]0;owned\x07" * 1000, identity.NotListeningError),
        (b"", identity.NotListeningError),  # nothing listens: the port closes
    ],
)
def test_a_forks_identity_on_its_port_is_taken_then_answered(
    tmp_path: Path, guest: bytes, expected: bool | str | type[Exception]
) -> None:
    (tmp_path / "fw").mkdir()
    (tmp_path / "fw" / "hostname").write_text("x\n")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(tmp_path / "id.sock"))
    server.listen(1)
    t = threading.Thread(target=_fake_guest, args=(server, guest))
    t.start()
    try:
        if isinstance(expected, bool):
            handed = identity.hand_over(tmp_path / "id.sock", tmp_path / "fw", ack=5, timeout=5)
            assert handed == identity.Handed(serving=expected)
        else:
            kind = expected if isinstance(expected, type) else VmsandboxError
            with pytest.raises(kind) as err:
                identity.hand_over(tmp_path / "id.sock", tmp_path / "fw", ack=5, timeout=5)
            message = err.value.message  # type: ignore[attr-defined]
            assert "\x1b" not in message and len(message) < identity.REPLY_LIMIT * 4 + 100
            if isinstance(expected, str):
                assert expected in message and not isinstance(err.value, identity.NotListeningError)
    finally:
        t.join()
        server.close()


def test_a_fork_port_where_nothing_listens_is_given_up_after_the_ack_time(tmp_path: Path) -> None:
    (tmp_path / "fw").mkdir()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(tmp_path / "id.sock"))
    server.listen(1)  # QEMU's end of the port takes the connection; no guest process reads it
    hold = threading.Event()
    t = threading.Thread(target=_fake_guest, args=(server, b"", hold))
    t.start()
    try:
        with pytest.raises(identity.NotListeningError, match="no answer within 1 s"):
            identity.hand_over(tmp_path / "id.sock", tmp_path / "fw", ack=1, timeout=60)
    finally:
        hold.set()
        t.join()
        server.close()


def test_a_fork_that_took_its_identity_then_panicked_is_said_at_the_next_look(tmp_path: Path) -> None:
    """ "taking", then nothing: the wait for the answer asks `alive` every LOOK seconds and stops at its word (a
    kernel panic on the fork's console), not after the whole timeout."""
    (tmp_path / "fw").mkdir()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(tmp_path / "id.sock"))
    server.listen(1)
    hold = threading.Event()
    t = threading.Thread(target=_fake_guest, args=(server, b"taking\n", hold))
    t.start()
    looks: list[float] = []

    def alive() -> str | None:
        looks.append(time.monotonic())
        return "its kernel panicked (its console says so)" if len(looks) >= 2 else None

    try:
        started = time.monotonic()
        with pytest.raises(VmsandboxError, match="the guest will not answer: its kernel panicked"):
            identity.hand_over(tmp_path / "id.sock", tmp_path / "fw", ack=5, timeout=60, alive=alive)
        assert len(looks) == 2 and looks[0] - started >= identity.LOOK * 0.9  # (asked only while nothing came)
    finally:
        hold.set()
        t.join()
        server.close()


def _drip(server: socket.socket, answer: bytes, every: float, done: threading.Event) -> None:
    """A guest that doles out its answer a byte at a time, each within any per-read timeout."""
    conn, _ = server.accept()
    with conn, contextlib.suppress(OSError):
        _read_identity(conn)
        for byte in answer:
            if done.wait(every):
                return
            conn.sendall(bytes([byte]))


@pytest.mark.parametrize(("answer", "phase"), [(b"taking" + b" " * 400, "ack"), (b"taking\n" + b" " * 400, "answer")])
def test_a_guest_that_doles_out_its_answer_is_given_up_on_at_the_deadline(
    tmp_path: Path, answer: bytes, phase: str
) -> None:
    (tmp_path / "fw").mkdir()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(tmp_path / "id.sock"))
    server.listen(1)
    done = threading.Event()
    t = threading.Thread(target=_drip, args=(server, answer, 0.05, done))
    t.start()
    try:
        # a deadline for the whole line: with a timeout per read, all 400 bytes came (20 s) and no timeout
        expected = identity.NotListeningError if phase == "ack" else VmsandboxError
        with pytest.raises(expected, match="within 1 s"):
            identity.hand_over(tmp_path / "id.sock", tmp_path / "fw", ack=1, timeout=1)
    finally:
        done.set()
        t.join()
        server.close()


def test_a_fork_port_that_cannot_be_connected_is_handed_over_another_way(tmp_path: Path) -> None:
    (tmp_path / "fw").mkdir()
    with pytest.raises(identity.NotListeningError, match="did not take its identity"):
        identity.hand_over(tmp_path / "no.sock", tmp_path / "fw", ack=1, timeout=1)


class FakeHv:
    def __init__(self, qemu: str = "7.2.0") -> None:
        self.qemu = qemu

    def qemu_version(self) -> str:
        return self.qemu

    def version(self) -> str:
        return "9.0.0"


def test_a_template_is_used_only_under_the_key_it_was_saved_with(tmp_path: Path) -> None:
    image = Image("bookworm-aaa", tmp_path / "base-bookworm-aaa", {"kernel_cmdline": "root=/dev/vda"})
    shape = templates.Shape("tcg", 2, 2048, 8192)
    hv = FakeHv()
    found, why = template.find(image, shape, hv)  # type: ignore[arg-type]
    assert found is None
    assert "no warm-start template yet" in why
    key = templates.key(image, shape, hv)  # type: ignore[arg-type]
    where = template.root_of(image) / f"{shape.slug}-{templates.digest(key)}"
    where.mkdir(parents=True)
    (where / template.MEMORY).write_bytes(b"LibvirtQemudSave")
    (where / template.META).write_text(json.dumps({"key": key}))
    found, why = template.find(image, shape, hv)  # type: ignore[arg-type]
    assert found is not None
    assert found.path == where
    # QEMU was upgraded: that template is never used, and the session says why
    found, why = template.find(image, shape, FakeHv("8.0.0"))  # type: ignore[arg-type]
    assert found is None
    assert "qemu 7.2.0 → 8.0.0" in why
    # another image version never finds it (its directory is the image's)
    newer = Image("bookworm-bbb", tmp_path / "base-bookworm-bbb", image.manifest)
    assert template.find(newer, shape, hv)[0] is None  # type: ignore[arg-type]
    # another shape neither
    assert template.find(image, dataclasses.replace(shape, memory_mib=4096), hv)[0] is None  # type: ignore[arg-type]
    # one session's failed warm start may be that session's own (its name, its workspace): the template stays
    tmpl = found or template.Template(where, {})
    assert not template.mark_failed(tmpl, "the guest did not take its identity", "bad-input")
    assert not template.mark_failed(tmpl, "the guest did not take its identity", "bad-input")  # the same again
    assert template.find(image, shape, hv)[0] is not None  # type: ignore[arg-type]
    template.started(tmpl)  # then another session starts from it: the strike goes
    assert not template.mark_failed(tmpl, "the guest did not take its identity", "third", project="/p")
    # another session of the same project (a fan-out: the same input) fails too: still that project's input
    assert not template.mark_failed(tmpl, "the guest did not take its identity", "third-2", project="/p")
    # a session of another project fails next, with no success between: the template is not used again
    assert template.mark_failed(tmpl, "the guest did not take its identity", "fourth", project="/q")
    found, why = template.find(image, shape, hv)  # type: ignore[arg-type]
    assert found is None
    assert "failed a warm start" in why
    (where.with_name(where.name + ".failed")).unlink()
    # its own failure (its saved memory is not a save image) condemns it at once
    assert template.mark_failed(tmpl, "not a complete libvirt save image", "fifth", own=True)
    assert template.find(image, shape, hv)[0] is None  # type: ignore[arg-type]


def test_a_restored_domain_moves_its_ssh_forward_and_nothing_else() -> None:
    xml = build_xml(spec())
    moved = with_netdev(xml, 40999)
    assert qemu_args(moved)[1] == qemu_args(xml)[1].replace("127.0.0.1:40022-:22", "127.0.0.1:40999-:22")
    assert "restrict=on" in qemu_args(moved)[1]


def test_the_head_of_a_save_image_fetched_from_another_host_reads_as_the_file_does(tmp_path: Path) -> None:
    import io

    fake_save(tmp_path / "t.save", template_xml(), b"QEVM" * 1000)
    data = (tmp_path / "t.save").read_bytes()
    head = savefile.parse(io.BytesIO(data[:8192]), "t.save on host far")  # remotesave fetches the first MiB
    assert head == savefile.read(tmp_path / "t.save")
    with pytest.raises(savefile.SaveImageError, match=r"t\.save on host far: save image truncated"):
        savefile.parse(io.BytesIO(data[:200]), "t.save on host far")
