"""What a host's storage pool is given, without libvirt itself (virt.py wires these in): the XML of a dir pool
and of a volume (built as data), and the two ends of a sparse stream — a local file sent into a volume, and
a volume read back — each hashing what passes (holes as zeros), so that what arrived can be checked against
what was sent; and the loop that talks over a non-blocking stream to a guest's port (`exchange`).
"""

from __future__ import annotations

import errno
import hashlib
import os
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Protocol

Progress = Callable[[int], None]  # told the bytes done so far (holes count: they are the file's too)
_ZEROS = bytes(1024 * 1024)


def pool_xml(name: str, path: str) -> str:
    pool = ET.Element("pool", type="dir")
    ET.SubElement(pool, "name").text = name
    target = ET.SubElement(pool, "target")
    ET.SubElement(target, "path").text = path
    perms = ET.SubElement(target, "permissions")
    ET.SubElement(perms, "mode").text = "0711"
    return ET.tostring(pool, encoding="unicode")


def volume_xml(
    name: str, capacity: int, *, mode: str = "0644", backing: str | None = None, fmt: str | None = None
) -> str:
    """A file volume of `capacity` bytes, nothing allocated: raw (what is uploaded into it fills it), or with a
    `backing` volume's path a qcow2 overlay of it (or in the format `fmt`: a copy's)."""
    vol = ET.Element("volume", type="file")
    ET.SubElement(vol, "name").text = name
    ET.SubElement(vol, "capacity", unit="bytes").text = str(capacity)
    ET.SubElement(vol, "allocation", unit="bytes").text = "0"
    target = ET.SubElement(vol, "target")
    ET.SubElement(target, "format", type=fmt or ("raw" if backing is None else "qcow2"))
    perms = ET.SubElement(target, "permissions")
    ET.SubElement(perms, "mode").text = mode
    if backing is not None:
        store = ET.SubElement(vol, "backingStore")
        ET.SubElement(store, "path").text = backing
        ET.SubElement(store, "format", type="qcow2")
    return ET.tostring(vol, encoding="unicode")


def copy_xml(name: str, source_xml: str, fmt: str | None = None) -> str:
    """A volume to be made as a copy of the volume `source_xml` describes, in its format or `fmt` (libvirt gives it
    the source's capacity; a copy of a qcow2 overlay reads through its chain, so it has no backing volume)."""
    found = ET.fromstring(source_xml).find("target/format")  # noqa: S314 - libvirt's own description
    return volume_xml(name, 0, mode="0600", fmt=fmt or ("raw" if found is None else found.get("type", "raw")))


def _zeros(sha: hashlib._Hash, length: int) -> None:
    while length > 0:
        n = min(length, len(_ZEROS))
        sha.update(memoryview(_ZEROS)[:n])
        length -= n


class Outgoing:
    """A local file read for a sparse upload: its data sections sent, its holes skipped, and `patches` (offset
    -> bytes, within data) sent in place of what the file holds there."""

    def __init__(
        self, fd: int, progress: Progress | None = None, patches: dict[int, bytes] | None = None, *, hashed: bool = True
    ) -> None:
        self.fd = fd
        self.hashed = hashed  # holes hash as zeros: ~1 s per GiB, not worth it for what is never checked
        self.sha = hashlib.sha256()
        self.done = 0
        self.progress = progress
        self.patches = patches or {}

    def _moved(self, n: int) -> None:
        self.done += n
        if self.progress is not None:
            self.progress(self.done)

    def read(self, _stream: object, nbytes: int, _opaque: object) -> bytes:
        here = os.lseek(self.fd, 0, os.SEEK_CUR)
        data = os.read(self.fd, nbytes)
        for at, new in self.patches.items():
            if at < here + len(data) and here < at + len(new):
                start, end = max(at, here), min(at + len(new), here + len(data))
                data = data[: start - here] + new[start - at : end - at] + data[end - here :]
        if self.hashed:
            self.sha.update(data)
        self._moved(len(data))
        return data

    def skip(self, _stream: object, length: int, _opaque: object) -> int:
        if self.hashed:
            _zeros(self.sha, length)
        self._moved(length)
        return os.lseek(self.fd, length, os.SEEK_CUR)

    def section(self, _stream: object, _opaque: object) -> list[int]:
        """[in data?, length of the section from here] (libvirt's hole handler)."""
        here = os.lseek(self.fd, 0, os.SEEK_CUR)
        try:
            data = os.lseek(self.fd, here, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
            data = -1  # nothing but a hole to the end
        if data < 0:
            length, in_data = os.lseek(self.fd, 0, os.SEEK_END) - here, 0
        elif data > here:
            length, in_data = data - here, 0
        else:
            length, in_data = os.lseek(self.fd, here, os.SEEK_HOLE) - here, 1
        os.lseek(self.fd, here, os.SEEK_SET)
        return [in_data, length]


class Incoming:
    """A volume read back through a sparse download: hashed, kept only up to `keep` bytes, and written to the
    file open at `into` (holes as holes) if one is given."""

    def __init__(self, keep: int = 0, into: int | None = None) -> None:
        self.sha = hashlib.sha256()
        self.kept = bytearray()
        self.keep = keep
        self.into = into
        self.hashed = into is None  # a copy is not checked: holes hash as zeros, ~1 s per GiB

    def data(self, _stream: object, buf: bytes, _opaque: object) -> int:
        if self.into is not None:
            view = memoryview(buf)
            while view:
                view = view[os.write(self.into, view) :]
        if self.hashed:
            self.sha.update(buf)
        if len(self.kept) < self.keep:
            self.kept += buf[: self.keep - len(self.kept)]
        return len(buf)

    def hole(self, _stream: object, length: int, _opaque: object) -> int:
        if self.into is not None:
            os.ftruncate(self.into, os.lseek(self.into, length, os.SEEK_CUR))
        if self.hashed:
            _zeros(self.sha, length)
        if len(self.kept) < self.keep:
            self.kept += bytes(min(length, self.keep - len(self.kept)))
        return 0


class Stream(Protocol):
    """A non-blocking libvirt stream: send returns the bytes taken, recv the bytes read; either -2 for "not now"."""

    def send(self, data: bytes) -> int: ...

    def recv(self, nbytes: int) -> bytes | int: ...


def exchange(stream: Stream, data: bytes, limit: int, deadline: float, tick: Callable[[], object]) -> bytes:
    """Send all of `data`, then read until a newline, `limit` bytes or the end of the stream; TimeoutError at
    `deadline` (time.monotonic()). `tick` is called while nothing moves: without an event loop, a libvirt client
    reads what arrives for a stream only while it waits for the reply to some call."""
    got = b""
    while data or (b"\n" not in got and len(got) < limit):
        moved = stream.send(data[:65536]) if data else stream.recv(limit - len(got))
        if moved == b"":  # the other end closed
            break
        if isinstance(moved, bytes):
            got += moved
        elif moved > 0:
            data = data[moved:]
        elif time.monotonic() > deadline:
            raise TimeoutError
        else:
            time.sleep(0.02)
            tick()
    return got
