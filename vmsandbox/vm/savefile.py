"""libvirt's QEMU save image (the file `virDomainSave` writes): read its domain XML, and clone it under another
name and UUID.

A save image restores only into a domain with the UUID it was saved with, and two domains with one UUID cannot
run at once. A warm-start template is restored by many sessions at the same time, so each gets its own copy
with its own name and UUID in the header. The copy is cheap: the header is rewritten, and the memory stream
(a few hundred MiB for an idle guest) is copied by the kernel (`copy_file_range`).

The layout, as libvirt writes it (src/qemu/qemu_saveimage.h): a 92-byte header (16-byte magic, then
little-endian u32 version, data_len, was_running, compressed, cookie_offset and 14 unused words), then
data_len bytes of data (the domain XML, NUL, the migration cookie XML, NUL, zero padding), then QEMU's
migration stream to the end of the file.
"""

from __future__ import annotations

import os
import struct
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from vmsandbox.errors import VmsandboxError

MAGIC = b"LibvirtQemudSave"
HEADER = struct.Struct("<16s5I56s")  # magic, version, data_len, was_running, compressed, cookie_offset, unused
SUPPORTED_VERSIONS = (2,)
MAX_DATA = 16 * 1024 * 1024  # the XML and cookie; libvirt's are a few KiB padded to 64 KiB


@dataclass(frozen=True)
class Saved:
    version: int
    was_running: int
    compressed: int
    xml: str
    cookie: bytes
    stream_offset: int
    unused: bytes


class SaveImageError(VmsandboxError):
    """Not a save image this code can clone (truncated, another format or version, compressed)."""


def read(path: Path) -> Saved:
    with path.open("rb") as f:
        return parse(f, str(path))


def parse(f: BinaryIO, where: str) -> Saved:
    """The header of a save image read from `f` (its start: a file, or the bytes fetched from another host)."""
    head = f.read(HEADER.size)
    if len(head) != HEADER.size:
        raise SaveImageError(f"{where}: too short for a libvirt save image")
    magic, version, data_len, was_running, compressed, cookie_offset, unused = HEADER.unpack(head)
    if magic != MAGIC:
        raise SaveImageError(f"{where}: not a complete libvirt save image (magic {magic!r})")
    if version not in SUPPORTED_VERSIONS or compressed != 0:
        raise SaveImageError(f"{where}: save image version {version}, compression {compressed}: not supported")
    if not (0 <= cookie_offset <= data_len <= MAX_DATA):
        raise SaveImageError(f"{where}: save image header out of range")
    data = f.read(data_len)
    if len(data) != data_len:
        raise SaveImageError(f"{where}: save image truncated in its header")
    xml = data.split(b"\0", 1)[0].decode()
    cookie = data[cookie_offset:].split(b"\0", 1)[0] if cookie_offset else b""
    return Saved(version, was_running, compressed, xml, cookie, HEADER.size + data_len, unused)


def renamed(xml: str, name: str, uuid: str) -> str:
    """The domain XML with another name and UUID (everything else, device addresses included, kept)."""
    root = ET.fromstring(xml)  # noqa: S314 - written by our own libvirt daemon
    for tag, value in (("name", name), ("uuid", uuid)):
        el = root.find(tag)
        if el is None:
            raise SaveImageError(f"the saved domain XML has no <{tag}>")
        el.text = value
    return ET.tostring(root, encoding="unicode")


def header_for(saved: Saved, xml: str) -> bytes:
    """The header and data block of a save image that carries `xml` instead of the saved XML."""
    body = xml.encode() + b"\0"
    cookie_offset = len(body) if saved.cookie else 0
    if saved.cookie:
        body += saved.cookie + b"\0"
    data_len = max(saved.stream_offset - HEADER.size, len(body))
    head = HEADER.pack(MAGIC, saved.version, data_len, saved.was_running, saved.compressed, cookie_offset, saved.unused)
    return head + body.ljust(data_len, b"\0")


def clone(source: Path, target: Path, xml: str) -> None:
    """Write `target`: the save image `source` carrying `xml` (its name and UUID), the memory copied in the kernel."""
    saved = read(source)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with open(fd, "wb", closefd=False) as out:
            out.write(header_for(saved, xml))
        with source.open("rb") as src:
            offset = saved.stream_offset
            while n := os.copy_file_range(src.fileno(), fd, 1 << 30, offset):
                offset += n
    except BaseException:
        os.close(fd)
        target.unlink(missing_ok=True)
        raise
    os.close(fd)
