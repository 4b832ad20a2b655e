"""Warm starts on another host, without one: the talk with a guest's port over a non-blocking libvirt stream,
the identity sent through it, a template's saved domain restored with a socket libvirt places, and what gc
reads of a qcow2 header there."""

from __future__ import annotations

import dataclasses
import json
import struct
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.unit.test_domain import spec
from tests.unit.test_warm import template_xml
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest import identity
from vmsandbox.session.place.remote import gc
from vmsandbox.vm import storage
from vmsandbox.vm.domain import LIBVIRTS_SOCKET, build_xml, client_of, for_restore

WOULD_BLOCK = -2


class FakeStream:
    """Takes at most `take` bytes per send, says "not now" every other call, then answers `reply` in pieces."""

    def __init__(self, reply: bytes, take: int = 1000) -> None:
        self.reply, self.take, self.sent, self.calls = reply, take, b"", 0

    def send(self, data: bytes) -> int:
        self.calls += 1
        if self.calls % 2:
            return WOULD_BLOCK
        self.sent += data[: self.take]
        return min(len(data), self.take)

    def recv(self, nbytes: int) -> bytes | int:
        self.calls += 1
        if self.calls % 2:
            return WOULD_BLOCK
        got = self.reply[: min(3, nbytes)]
        self.reply = self.reply[len(got) :]
        return got


def test_exchange_sends_everything_then_reads_one_bounded_line() -> None:
    ticks: list[int] = []
    stream = FakeStream(b"ok\nand more")
    data = bytes(range(256)) * 20
    got = storage.exchange(stream, data, 512, time.monotonic() + 10, lambda: ticks.append(1))
    assert stream.sent == data
    assert got.split(b"\n")[0] == b"ok"
    assert ticks  # driven while the stream had nothing: a libvirt client reads a stream only then
    flood = storage.exchange(FakeStream(b"A" * 10_000), b"x", 100, time.monotonic() + 10, lambda: None)
    assert len(flood) <= 102


def test_exchange_ends_at_the_end_of_the_stream_and_times_out_on_silence() -> None:
    closed = FakeStream(b"")
    closed.recv = lambda nbytes: b""  # type: ignore[method-assign]
    assert storage.exchange(closed, b"x", 100, time.monotonic() + 10, lambda: None) == b""
    silent = FakeStream(b"")
    silent.recv = lambda nbytes: WOULD_BLOCK  # type: ignore[method-assign]
    with pytest.raises(TimeoutError):
        storage.exchange(silent, b"x", 100, time.monotonic() + 0.2, lambda: None)


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (b"ok\n", None),
        (b"\x1b]0;owned\x07no\n", "\\x1b]0;owned\\x07no"),  # escaped, never obeyed
        (b"A" * 5000, "A" * 100),
    ],
)
def test_the_identity_through_libvirt_is_checked_as_over_a_socket(
    tmp_path: Path, answer: bytes, expected: str | None
) -> None:
    (tmp_path / "hostname").write_text("vmsandbox-x\n")
    (tmp_path / "template").write_text("1\n")
    sent: list[bytes] = []

    def exchange(data: bytes) -> bytes:
        sent.append(data)
        return answer

    if expected is None:
        identity.send_through(exchange, tmp_path, timeout=5)
        header, _, body = sent[0].partition(b"\n")
        assert header == f"{identity.HEADER} {len(body)}".encode()
    else:
        with pytest.raises(VmsandboxError) as err:
            identity.send_through(exchange, tmp_path, timeout=5)
        assert expected in err.value.message
        assert len(err.value.message) < identity.REPLY_LIMIT * 4 + 100

    def silent(data: bytes) -> bytes:
        raise TimeoutError

    with pytest.raises(VmsandboxError, match="within 5 s"):
        identity.send_through(silent, tmp_path, timeout=5)


def test_a_socket_libvirt_places_has_no_path_in_the_xml_and_loses_the_templates_on_restore() -> None:
    built = ET.fromstring(build_xml(dataclasses.replace(spec(), channel=LIBVIRTS_SOCKET)))  # noqa: S314
    source = built.find("devices/channel/source")
    assert source is not None and source.get("mode") == "bind" and source.get("path") is None
    session = dataclasses.replace(
        spec(), fwcfg_files={"template": Path("/pool/t.fw.template")}, channel=LIBVIRTS_SOCKET
    )
    restored = ET.fromstring(for_restore(template_xml(), session))  # noqa: S314
    source = restored.find("devices/channel/source")
    assert source is not None and source.get("path") is None  # not the template's socket there
    saved = ET.fromstring(template_xml())  # noqa: S314
    channel = saved.find("devices/channel")
    assert channel is not None
    channel.remove(channel.find("source"))  # type: ignore[arg-type]  # as libvirt saves a socket it placed
    restored = ET.fromstring(for_restore(ET.tostring(saved, encoding="unicode"), session))  # noqa: S314
    source = restored.find("devices/channel/source")
    assert source is not None and source.get("mode") == "bind" and source.get("path") is None


def test_a_template_build_there_says_whose_it_is() -> None:
    xml = build_xml(dataclasses.replace(spec(), template=True, client="laptop/abc"))
    assert client_of(xml) == "laptop/abc"  # gc here removes an interrupted build of its own, no other's
    assert client_of(build_xml(dataclasses.replace(spec(), template=True))) is None


def test_gc_reads_the_backing_file_a_qcow2_header_names() -> None:
    name = b"/var/lib/libvirt/vmsandbox/vmsandbox-template-ab.disk.qcow2"
    head = bytearray(4096)
    head[:4] = b"QFI\xfb"
    head[8:20] = struct.pack(">QI", 512, len(name))
    head[512 : 512 + len(name)] = name
    assert gc.backing_of(bytes(head)) == name.decode()
    head[8:16] = struct.pack(">Q", 0)
    assert gc.backing_of(bytes(head)) is None  # no backing file
    assert gc.backing_of(b"\0" * 4096) is None  # not qcow2
    head[8:20] = struct.pack(">QI", 4000, 500)
    assert gc.backing_of(bytes(head)) is None  # names past what was read


class FakePool:
    """A host's pool and domains, as gc there sees them through libvirt."""

    def __init__(self, files: dict[str, bytes], domains: dict[str, str]) -> None:
        self.files, self.domains, self.deleted, self.destroyed = files, domains, [], []  # type: ignore[var-annotated]

    def volumes(self, pool: str) -> dict[str, str]:
        return {name: f"/pool/{name}" for name in self.files}

    def xml(self, name: str) -> str | None:
        return self.domains.get(name)

    def download(self, pool: str, name: str, *, keep: int = 0, length: int = 0) -> storage.Incoming:
        got = storage.Incoming(keep)
        got.kept += self.files[name][:keep]
        return got

    def qemu_version(self) -> str:
        return "7.2.0"

    def version(self) -> str:
        return "9.0.0"

    def destroy(self, name: str) -> bool:
        self.destroyed.append(name)
        return self.domains.pop(name, None) is not None

    def delete_volume(self, pool: str, name: str) -> None:
        self.deleted.append(name)
        self.files.pop(name, None)


def _template(name: str, *, qemu: str = "7.2.0", image: str = "base-x", ready: bool = True) -> dict[str, bytes]:
    meta = {"key": {"qemu": qemu, "libvirt": "9.0.0"}, "image": image}
    vols = {f"{name}.{v}": b"" for v in ("disk.qcow2", "save", "fw.template")}
    return vols | ({f"{name}.ready": json.dumps(meta).encode()} if ready else {})


def _overlay_on(backing: str) -> bytes:
    head = bytearray(4096)
    head[:4] = b"QFI\xfb"
    head[8:20] = struct.pack(">QI", 512, len(backing))
    head[512 : 512 + len(backing)] = backing.encode()
    return bytes(head)


def test_gc_there_removes_unusable_templates_only_when_no_disk_rests_on_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vmsandbox.session.end.gc import Tidier
    from vmsandbox.session.place.hostspec import HostSpec
    from vmsandbox.session.place.remote import template, vm

    monkeypatch.setattr(template, "lock_path", lambda host: tmp_path / "lock")
    monkeypatch.setattr(vm, "client_id", lambda: "me/1")
    files = {"base-x.ready": b"{}", "base-x.disk.qcow2": b""}
    files |= _template("vmsandbox-template-good")  # serves: kept
    files |= _template("vmsandbox-template-old", qemu="6.0.0")  # stale, no disk on it: removed
    files |= _template("vmsandbox-template-oldused", qemu="6.0.0")  # stale, a session's overlay rests on it: kept
    files |= _template("vmsandbox-template-gone", image="base-y")  # its image is gone there: removed
    files |= _template("vmsandbox-template-failed") | {"vmsandbox-template-failed.failed": b"x"}  # removed
    files |= _template("vmsandbox-template-cut", ready=False)  # interrupted, no domain: removed
    files |= _template("vmsandbox-template-mine", ready=False)  # my interrupted build, domain left: removed
    files |= _template("vmsandbox-template-theirs", ready=False)  # another machine's build running: kept
    files["vmsandbox-s1.overlay.qcow2"] = _overlay_on("/pool/vmsandbox-template-oldused.disk.qcow2")
    build = build_xml(dataclasses.replace(spec(), template=True, client="me/1"))
    theirs = build_xml(dataclasses.replace(spec(), template=True, client="them/2"))
    hv = FakePool(files, {"vmsandbox-template-mine": build, "vmsandbox-template-theirs": theirs})
    said = list(gc._templates(hv, HostSpec("far", "qemu+ssh://far/system"), Tidier()))  # type: ignore[arg-type]
    left = {v.split(".", 1)[0] for v in hv.files if v.startswith("vmsandbox-template-")}
    assert left == {"vmsandbox-template-good", "vmsandbox-template-oldused", "vmsandbox-template-theirs"}, said
    assert hv.destroyed.count("vmsandbox-template-mine") >= 1
    assert "vmsandbox-template-theirs" not in hv.destroyed
    assert any("superseded" in line and "vmsandbox-template-old)" in line for line in said), said
    assert any("failed a warm start" in line for line in said), said
    # a removal deletes `ready` first: from then on, it is not there for a session that looks
    old = [v for v in hv.deleted if v.startswith("vmsandbox-template-old.")]
    assert old[0] == "vmsandbox-template-old.ready"
