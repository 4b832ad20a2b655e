"""A libvirt save image split in two: the guest's RAM as a flat file (each page at its offset, zero pages left as
holes) and the rest — device state, firmware ROMs — as a save image of its own, a few hundred KiB, that QEMU
restores over a copy-on-write mapping of that file (session.place.local.sharing maps it; vm.domain names it).

QEMU writes its RAM into a save image as the `ram` section of its migration stream (QEMU 7.2:
migration/savevm.c, migration/ram.c): the stream's magic and version, a configuration section (the machine
type), then `ram`'s START section listing every RAM block by name and length (RAM_SAVE_FLAG_MEM_SIZE), PART
sections of page records, an END section, then every device's state (FULL sections, which carry no length and
are copied through as they are), EOF, and a JSON description. A page record is a big-endian u64 of the page's
offset in its block OR'd with flags, the block's name unless it is the same block as the record before
(CONTINUE), then 4096 bytes (PAGE) or one fill byte (ZERO: a page of zeros). Every page of every block is sent
once, as PAGE or ZERO: the first pass of a migration sends all of them, and libvirt pauses the VM before it
saves, so no page is sent twice.

The split keeps every section and record but the main RAM's pages, and renames the main RAM block to the
memory backend a session maps the file with (`SHARED_BLOCK`): QEMU then takes the block's content from that
mapping and loads nothing into it. No migration capability is needed on either side (unlike `x-ignore-shared`,
which QEMU 7.2 makes the restoring side set too, and which libvirt 9.0 cannot). Anything this code does not
know (another iterative section, a compressed or XBZRLE page, a configuration subsection, a stream that ends
early) is refused with StreamError, and the caller restores the save image whole instead.
"""

from __future__ import annotations

import os
import shutil
import struct
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from vmsandbox.vm import domain, savefile

PAGE = 4096
MAIN_BLOCKS = ("pc.ram", "vmsandbox.ram")  # the machine's RAM as libvirt names it, and as a shared session's is
SHARED_BLOCK = "vmsandbox.ram"  # the memory backend (and so the RAM block) a session maps the file with

FILE_MAGIC, FILE_VERSION = 0x5145564D, 3  # "QEVM", 3
VM_EOF, SECTION_START, SECTION_PART, SECTION_END, SECTION_FULL = 0x00, 0x01, 0x02, 0x03, 0x04
SUBSECTION, CONFIGURATION, SECTION_FOOTER = 0x05, 0x07, 0x7E
FLAG_ZERO, FLAG_MEM_SIZE, FLAG_PAGE, FLAG_EOS, FLAG_CONTINUE = 0x02, 0x04, 0x08, 0x10, 0x20
FLAG_MASK = PAGE - 1  # the low bits of a record's u64 are its flags, the rest the page's offset
MAX_RUN = 256  # pages written in one pwritev (IOV_MAX is 1024)
ZERO_PAGE = bytes(PAGE)
ZERO_CONTINUED = FLAG_ZERO | FLAG_CONTINUE
READ_BUFFER = 1 << 20
BE32, BE64 = struct.Struct(">I"), struct.Struct(">Q")
ZERO_RECORD = struct.Struct(">QB")  # a ZERO record of the block before: its word and its fill byte


class StreamError(savefile.SaveImageError):
    """A save image whose RAM this code cannot take apart: it is restored whole instead."""


@dataclass(frozen=True)
class Split:
    ram_bytes: int  # the main RAM block's length (the file's size)
    pages: int  # pages of the file that hold data (the others are zero: holes, or zeros a live save sent again)
    state_bytes: int  # the save image left, header included


class _Reader:
    """Big-endian fields read from the stream, every read whole or StreamError. It reads ahead a buffer of its own
    (`buf` from `i` on: a run of records is parsed there in place, `_Ram._holes`)."""

    def __init__(self, f: BinaryIO, where: str) -> None:
        self.f, self.where = f, where
        self.buf, self.i, self.base = b"", 0, f.tell()  # base: where buf starts in the file

    @property
    def pos(self) -> int:
        return self.base + self.i

    def seek(self, pos: int) -> None:
        if self.base <= pos <= self.base + len(self.buf):
            self.i = pos - self.base
        else:
            self.f.seek(pos)
            self.buf, self.i, self.base = b"", 0, pos

    def take(self, n: int) -> bytes:
        while len(self.buf) - self.i < n:
            more = self.f.read(max(n, READ_BUFFER))
            if not more:
                break
            self.buf, self.base, self.i = self.buf[self.i :] + more, self.pos, 0
        got = self.buf[self.i : self.i + n]
        if len(got) != n:
            raise StreamError(f"{self.where}: the memory stream ends early (at byte {self.pos + len(got)})")
        self.i += n
        return got

    def rest(self, out: BinaryIO) -> None:
        """All that is left of the stream, copied to `out`."""
        out.write(self.buf[self.i :])
        shutil.copyfileobj(self.f, out, READ_BUFFER)
        self.buf, self.i, self.base = b"", 0, self.f.tell()

    def peek(self) -> int:
        got = self.take(1)
        self.i -= 1
        return got[0]

    def u8(self) -> int:
        return self.take(1)[0]

    def be32(self) -> int:
        value: int = BE32.unpack(self.take(4))[0]
        return value

    def be64(self) -> int:
        value: int = BE64.unpack(self.take(8))[0]
        return value

    def name(self) -> str:
        return self.take(self.u8()).decode("latin-1")


class _Pages:
    """The main RAM's pages, written into the file in runs of adjacent pages."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.run: list[bytes] = []
        self.start = 0

    def add(self, offset: int, page: bytes) -> None:
        if self.run and (offset != self.start + len(self.run) * PAGE or len(self.run) == MAX_RUN):
            self.flush()
        if not self.run:
            self.start = offset
        self.run.append(page)

    def flush(self) -> None:
        at, left = self.start, self.run
        while left:
            n = os.pwritev(self.fd, left, at)
            whole, part = divmod(n, PAGE)  # (a short write in a page: the rest of it again)
            left = [left[whole][part:], *left[whole + 1 :]] if part else left[whole:]
            at += n
        self.run = []


def split(source: Path, ram_fd: int, state: Path, xml: str | None = None) -> Split:
    """Write the main RAM of save image `source` into `ram_fd` (sized to the block, its zero pages left as holes)
    and the rest into a new save image `state` (carrying `xml`, else the saved XML), with the RAM block renamed
    to SHARED_BLOCK."""
    saved = savefile.read(source)
    # the RAM's size as libvirt wrote it: the stream (QEMU's) may claim any, and root sizes the file by it
    try:
        expected = domain.memory_bytes(ET.fromstring(saved.xml))  # noqa: S314 - libvirt's header, not QEMU's
    except (ValueError, ET.ParseError) as exc:
        raise StreamError(f"{source}: the saved domain's memory: {exc}") from None
    with source.open("rb", buffering=0) as f:
        f.seek(saved.stream_offset)
        fd = os.open(state, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            with open(fd, "wb", closefd=False) as out:
                out.write(savefile.header_for(saved, saved.xml if xml is None else xml))
                ram_bytes, pages = _split_stream(_Reader(f, str(source)), ram_fd, out, expected)
                size = out.tell()
        except BaseException:
            os.close(fd)
            state.unlink(missing_ok=True)
            raise
        os.close(fd)
    return Split(ram_bytes, pages, size)


def _head(r: _Reader, out: BinaryIO) -> None:
    """The stream's magic, version and configuration (the machine type), copied."""
    if r.be32() != FILE_MAGIC or r.be32() != FILE_VERSION:
        raise StreamError(f"{r.where}: not a QEMU migration stream of version {FILE_VERSION}")
    if r.u8() != CONFIGURATION:
        raise StreamError(f"{r.where}: the stream has no configuration section")
    machine = r.take(r.be32())
    out.write(BE32.pack(FILE_MAGIC) + BE32.pack(FILE_VERSION) + bytes([CONFIGURATION]))
    out.write(BE32.pack(len(machine)) + machine)
    if r.peek() == SUBSECTION:  # (capabilities to check, a UUID to validate: none in a libvirt save)
        raise StreamError(f"{r.where}: the configuration has a subsection this code does not read")


def _split_stream(r: _Reader, ram_fd: int, out: BinaryIO, expected: int) -> tuple[int, int]:
    _head(r, out)
    ram = _Ram(ram_fd, r.where, expected)
    names: dict[int, str] = {}
    while True:
        begin = r.pos
        kind = r.u8()
        if kind in (SECTION_START, SECTION_FULL):
            section = r.be32()
            names[section] = r.name()
            r.take(8)  # instance and version
            if kind == SECTION_FULL:  # the devices' state, to the end: copied as it is
                if ram.pending():
                    raise StreamError(f"{r.where}: device state before the RAM was complete")
                r.seek(begin)
                r.rest(out)
                return ram.finish()
        elif kind in (SECTION_PART, SECTION_END):
            section = r.be32()
        elif kind == VM_EOF:
            raise StreamError(f"{r.where}: the stream ends before any device state")
        else:
            raise StreamError(f"{r.where}: section type {kind:#x} at byte {begin}, which this code does not read")
        if names.get(section) != "ram":
            raise StreamError(f"{r.where}: an iterative section {names.get(section)!r} besides the RAM")
        here = r.pos
        r.seek(begin)
        head = r.take(here - begin)
        body = ram.section(r)
        if r.u8() != SECTION_FOOTER or r.be32() != section:
            raise StreamError(f"{r.where}: a RAM section without its footer")
        if kind == SECTION_PART and not body:
            continue  # every record of it was the main RAM's
        out.write(head + body + BE64.pack(FLAG_EOS) + bytes([SECTION_FOOTER]) + BE32.pack(section))


class _Ram:
    """The records of the `ram` sections: the main block's pages go to the file, the rest stay in the stream."""

    def __init__(self, ram_fd: int, where: str, expected: int) -> None:
        self.where = where
        self.expected = expected  # the machine's RAM, as the domain says
        self.pages = _Pages(ram_fd)
        self.fd = ram_fd
        self.main: str | None = None  # the main block's name in the stream
        self.length = 0
        self.block: str | None = None  # the block of the record before (CONTINUE)
        self.seen = 0  # the main block's pages met, PAGE or ZERO
        # the pages of the file that hold data, a bit each: a live save sends a page again when the guest wrote it
        # meanwhile, and a page it zeroed comes as a ZERO record after the data it held
        self.written = bytearray()
        self.distinct = 0

    def section(self, r: _Reader) -> bytes:
        """One section's records, up to its EOS: what is kept of them, without the EOS."""
        kept = bytearray()
        while True:
            word = r.be64()
            flags, offset = word & FLAG_MASK, word & ~FLAG_MASK
            if flags & FLAG_EOS:
                return bytes(kept)
            if flags & FLAG_MEM_SIZE:
                kept += BE64.pack(word) + self._blocks(r, offset)
                continue
            if flags & FLAG_CONTINUE:
                if self.block is None:
                    raise StreamError(f"{self.where}: a page continues no block")
            else:
                self.block = r.name()
            if (flags & ~FLAG_CONTINUE) == FLAG_ZERO:
                data = r.take(1)
            elif (flags & ~FLAG_CONTINUE) == FLAG_PAGE:
                data = r.take(PAGE)
            else:
                raise StreamError(f"{self.where}: a page record with flags {flags:#x} (compressed? XBZRLE?)")
            if self.block == self.main:
                self._main_page(offset, flags, data)
                if flags & FLAG_CONTINUE:
                    self._holes(r)
                continue
            name = self.block.encode("latin-1")
            kept += BE64.pack(offset | (flags & ~FLAG_CONTINUE)) + bytes([len(name)]) + name + data

    def _blocks(self, r: _Reader, total: int) -> bytes:
        """The block list of RAM_SAVE_FLAG_MEM_SIZE, the main block renamed."""
        listed = bytearray()
        while total > 0:
            name, length = r.name(), r.be64()
            if name in MAIN_BLOCKS and self.main is None:
                self.main, self.length = name, length
                name = SHARED_BLOCK
            encoded = name.encode("latin-1")
            listed += bytes([len(encoded)]) + encoded + BE64.pack(length)
            total -= length
        if total != 0 or self.main is None:
            raise StreamError(f"{self.where}: the RAM blocks listed do not add up, or none is the machine's RAM")
        if self.length != self.expected:
            raise StreamError(
                f"{self.where}: the machine's RAM is {self.length} bytes in the stream, {self.expected} in the domain"
            )
        if self.length % PAGE:
            raise StreamError(f"{self.where}: the machine's RAM is not a whole number of pages")
        os.ftruncate(self.fd, self.length)
        self.written = bytearray(self.length // PAGE // 8 + 1)
        return bytes(listed)

    def _holes(self, r: _Reader) -> None:
        """The ZERO records of the main block that follow, each of a page the file holds as a hole (most of a
        guest's RAM, one record a page): taken from what the reader holds read ahead, a record at a time in C.
        What does not fit (another kind of record, a page written before) is left to `section`."""
        ahead = len(r.buf) - r.i
        taken, last, written = 0, self.length - PAGE, self.written
        with memoryview(r.buf) as view:
            for word, fill in ZERO_RECORD.iter_unpack(view[r.i : r.i + ahead - ahead % ZERO_RECORD.size]):
                offset = word ^ ZERO_CONTINUED
                if offset & FLAG_MASK or fill or offset > last or written[offset >> 15] >> (offset >> 12 & 7) & 1:
                    break
                taken += 1
        r.i += taken * ZERO_RECORD.size
        self.seen += taken

    def _main_page(self, offset: int, flags: int, data: bytes) -> None:
        if offset + PAGE > self.length:
            raise StreamError(f"{self.where}: a page past the end of the machine's RAM")
        self.seen += 1
        index = offset // PAGE
        byte, bit = divmod(index, 8)
        if flags & FLAG_PAGE:
            self.pages.add(offset, data)
        elif data[0] != 0:  # a page of one repeated byte (never sent by QEMU 7.2: it sends those as pages)
            self.pages.add(offset, data * PAGE)
        elif self.written[byte] >> bit & 1:  # a zero page sent again (a live save): zeros over what it held
            self.pages.add(offset, ZERO_PAGE)
            self.written[byte] &= ~(1 << bit) & 0xFF
            self.distinct -= 1
            return
        else:  # a zero page the file holds as a hole
            return
        if not self.written[byte] >> bit & 1:
            self.written[byte] |= 1 << bit
            self.distinct += 1

    def pending(self) -> bool:
        """Whether pages of the main block are still to come."""
        return self.main is None or self.seen < self.length // PAGE

    def finish(self) -> tuple[int, int]:
        self.pages.flush()
        return self.length, self.distinct
