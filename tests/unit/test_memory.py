"""Memory shared between sessions, without a VM: a save image split into RAM and the rest (on a stream written
here as QEMU 7.2 writes one), the domain's memory backend, sealed memory files and what the kernel refuses
with them, libvirt's word on how QEMU is confined, and why a host cannot share."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import json
import mmap
import os
import struct
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.test_domain import qemu_args, spec
from tests.unit.test_warm import fake_save, template_xml
from vmsandbox import pids
from vmsandbox.errors import VmsandboxError
from vmsandbox.session.place.local import sharing, template
from vmsandbox.session.record import Record
from vmsandbox.vm import domain, node, rambackend, savefile
from vmsandbox.vm.memory import holders, sealed, split, usage

P = split.PAGE
pytestmark = pytest.mark.usefixtures("looks_in_this_process")  # root's looks at holders (and QEMUs): this process's
RAM = 16 * P  # the machine's RAM in these streams: 16 pages
ROM = 2 * P


class Stream:
    """A migration stream as QEMU 7.2 writes a save: header, configuration, `ram` START/PART/END, devices, EOF."""

    def __init__(self) -> None:
        self.out = bytearray(struct.pack(">II", split.FILE_MAGIC, split.FILE_VERSION))
        self.out += bytes([split.CONFIGURATION]) + struct.pack(">I", 10) + b"pc-q35-7.2"
        self.last: str | None = None

    def section(self, kind: int, sid: int, records: bytes, name: str = "ram") -> None:
        head = bytes([kind]) + struct.pack(">I", sid)
        if kind in (split.SECTION_START, split.SECTION_FULL):
            head += bytes([len(name)]) + name.encode() + struct.pack(">II", 0, 4)
        self.out += head + records + bytes([split.SECTION_FOOTER]) + struct.pack(">I", sid)

    def blocks(self, listed: list[tuple[str, int]]) -> bytes:
        data = struct.pack(">Q", sum(n for _, n in listed) | split.FLAG_MEM_SIZE)
        for name, length in listed:
            data += bytes([len(name)]) + name.encode() + struct.pack(">Q", length)
        return data + self.eos()

    def page(self, block: str, offset: int, data: bytes | None) -> bytes:
        """A PAGE record (or ZERO, with None), CONTINUE when it is the block of the record before."""
        flags = split.FLAG_PAGE if data is not None else split.FLAG_ZERO
        same = block == self.last
        self.last = block
        record = struct.pack(">Q", offset | flags | (split.FLAG_CONTINUE if same else 0))
        record += b"" if same else bytes([len(block)]) + block.encode()
        return record + (data if data is not None else b"\0")

    @staticmethod
    def eos() -> bytes:
        return struct.pack(">Q", split.FLAG_EOS)


def page_of(n: int) -> bytes:
    return bytes([n]) * P


DEVICES = b"\x04" + struct.pack(">I", 9) + b"\x05apic0" + struct.pack(">II", 0, 3) + b"DEVICE-STATE" * 7


def sized(ram: int) -> str:
    """The template's domain XML with `ram` bytes of memory (what libvirt writes in a save's header)."""
    root = ET.fromstring(template_xml())  # noqa: S314
    memory = root.find("memory")
    assert memory is not None
    memory.text, memory.attrib = str(ram // 1024), {"unit": "KiB"}
    return ET.tostring(root, encoding="unicode")


def a_save(tmp_path: Path, *, main: str = "pc.ram") -> tuple[Path, dict[int, bytes]]:
    """A save image whose RAM has a page of its own at every odd page (zeros elsewhere), and a ROM of two pages."""
    s = Stream()
    s.section(split.SECTION_START, 3, s.blocks([(main, RAM), ("pc.rom", ROM)]))
    written = {i * P: page_of(i) for i in range(1, 16, 2)}
    first = b"".join(s.page(main, i * P, written.get(i * P)) for i in range(8))
    first += s.page("pc.rom", 0, page_of(0xAA)) + s.page("pc.rom", P, None)
    s.section(split.SECTION_PART, 3, first + s.eos())
    s.section(split.SECTION_PART, 3, b"".join(s.page(main, i * P, written.get(i * P)) for i in range(8, 16)) + s.eos())
    s.section(split.SECTION_END, 3, s.eos())
    s.out += DEVICES + b"\x00" + b"\x06" + struct.pack(">I", 2) + b"{}"
    fake_save(tmp_path / "vm.save", sized(RAM), bytes(s.out))
    return tmp_path / "vm.save", written


def split_of(tmp_path: Path, s: Stream) -> tuple[split.Split, bytes]:
    """Stream `s` saved as a save image of RAM bytes, split: what split says, and the RAM file it wrote."""
    fake_save(tmp_path / "vm.save", sized(RAM), bytes(s.out))
    fd = os.open(tmp_path / "ram", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        got = split.split(tmp_path / "vm.save", fd, tmp_path / "state.save")
    finally:
        os.close(fd)
    return got, (tmp_path / "ram").read_bytes()


def records(stream: bytes) -> tuple[list[tuple[str, int]], list[tuple[str, int, int]], bytes]:
    """What a split stream holds: the block list, every page record (block, offset, flags) and what follows the
    RAM sections."""
    pos, blocks, pages, block = 8 + 1 + 4 + 10, [], [], ""
    while stream[pos] != split.SECTION_FULL:
        kind = stream[pos]
        pos += 5
        if kind == split.SECTION_START:
            pos += 1 + stream[pos] + 8
        while True:
            (word,) = struct.unpack_from(">Q", stream, pos)
            pos += 8
            flags, offset = word & split.FLAG_MASK, word & ~split.FLAG_MASK
            if flags & split.FLAG_EOS:
                break
            if flags & split.FLAG_MEM_SIZE:
                total = offset
                while total:
                    name = stream[pos + 1 : pos + 1 + stream[pos]].decode()
                    pos += 1 + stream[pos]
                    (length,) = struct.unpack_from(">Q", stream, pos)
                    pos += 8
                    blocks.append((name, length))
                    total -= length
                continue
            if not flags & split.FLAG_CONTINUE:
                block = stream[pos + 1 : pos + 1 + stream[pos]].decode()
                pos += 1 + stream[pos]
            pages.append((block, offset, flags))
            pos += P if flags & split.FLAG_PAGE else 1
        pos += 5  # the footer
    return blocks, pages, stream[pos:]


@pytest.mark.parametrize("main", ["pc.ram", "vmsandbox.ram"])  # a template's save; a shared session's own save
def test_a_split_puts_every_page_of_ram_in_the_file_and_keeps_the_rest(tmp_path: Path, main: str) -> None:
    save, written = a_save(tmp_path, main=main)
    fd = os.open(tmp_path / "ram", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        got = split.split(save, fd, tmp_path / "state.save")
    finally:
        os.close(fd)
    ram = (tmp_path / "ram").read_bytes()
    assert got.ram_bytes == len(ram) == RAM
    assert got.pages == len(written)
    for i in range(16):
        assert ram[i * P : (i + 1) * P] == written.get(i * P, bytes(P)), f"page {i}"
    state = savefile.read(tmp_path / "state.save")
    assert state.xml == savefile.read(save).xml  # the same domain, its header kept
    blocks, pages, rest = records((tmp_path / "state.save").read_bytes()[state.stream_offset :])
    assert blocks == [(split.SHARED_BLOCK, RAM), ("pc.rom", ROM)]  # the RAM block is the shared backend's
    assert pages == [("pc.rom", 0, split.FLAG_PAGE), ("pc.rom", P, split.FLAG_ZERO)]  # none of the RAM's
    assert rest.startswith(DEVICES)  # the devices' state, copied as it was


def test_a_split_carries_the_xml_it_is_given(tmp_path: Path) -> None:
    save, _ = a_save(tmp_path)
    fd = os.open(tmp_path / "ram", os.O_RDWR | os.O_CREAT, 0o600)
    other = savefile.renamed(savefile.read(save).xml, "vmsandbox-x", "99999999-2222-4333-8444-555555555555")
    split.split(save, fd, tmp_path / "state.save", other)
    os.close(fd)
    assert savefile.read(tmp_path / "state.save").xml == other


def test_the_file_keeps_the_zero_pages_as_holes(tmp_path: Path) -> None:
    s = Stream()
    big = 4096 * P
    s.section(split.SECTION_START, 3, s.blocks([("pc.ram", big)]))
    body = b"".join(s.page("pc.ram", i * P, page_of(7) if i == 2000 else None) for i in range(4096))
    s.section(split.SECTION_END, 3, body + s.eos())
    s.out += DEVICES
    fake_save(tmp_path / "vm.save", sized(big), bytes(s.out))
    fd = os.open(tmp_path / "ram", os.O_RDWR | os.O_CREAT, 0o600)
    split.split(tmp_path / "vm.save", fd, tmp_path / "state.save")
    os.close(fd)
    assert (tmp_path / "ram").stat().st_size == big
    assert (tmp_path / "ram").stat().st_blocks * 512 < 64 * P  # one page written (file systems round up)


@pytest.mark.parametrize("buffer", [1 << 20, 4099, 13])  # reads ahead that end anywhere in a record
def test_runs_of_zero_pages_pages_sent_again_and_filled_pages_land_as_a_live_save_left_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, buffer: int
) -> None:
    """A live save sends a page again when the guest wrote it meanwhile: a page that held data and then came as
    ZERO is zeros in the file, one that came as ZERO and then with data holds it; a ZERO record with another fill
    byte is that byte over the page. Long runs of ZERO records are taken in C (`_holes`) up to the first that is
    not a hole, wherever the reader's buffer ends."""
    monkeypatch.setattr(split, "READ_BUFFER", buffer)
    s = Stream()
    s.section(split.SECTION_START, 3, s.blocks([("pc.ram", RAM), ("pc.rom", ROM)]))
    first = b"".join(s.page("pc.ram", i * P, page_of(i) if i in (3, 9) else None) for i in range(16))
    s.section(split.SECTION_PART, 3, first + s.page("pc.rom", 0, page_of(0xAA)) + s.eos())
    again = s.page("pc.ram", 9 * P, None) + s.page("pc.ram", 10 * P, page_of(10))  # 9 zeroed, 10 written
    filled = struct.pack(">Q", 12 * P | split.FLAG_ZERO | split.FLAG_CONTINUE) + b"\x07"
    s.section(split.SECTION_END, 3, again + filled + s.page("pc.ram", 13 * P, None) + s.eos())
    s.out += DEVICES + b"\x00" + b"\x06" + struct.pack(">I", 2) + b"{}"
    got, ram = split_of(tmp_path, s)
    want = {3: page_of(3), 10: page_of(10), 12: bytes([7]) * P}
    for i in range(16):
        assert ram[i * P : (i + 1) * P] == want.get(i, bytes(P)), f"page {i}"
    assert got.pages == 3
    state = savefile.read(tmp_path / "state.save")
    _, pages, rest = records((tmp_path / "state.save").read_bytes()[state.stream_offset :])
    assert pages == [("pc.rom", 0, split.FLAG_PAGE)] and rest.startswith(DEVICES)


def damaged(tmp_path: Path, change: str) -> Path:
    s = Stream()
    if change == "subsection":
        s.out += b"\x05"
    s.section(split.SECTION_START, 3, s.blocks([("pc.ram", RAM * 4096 if change == "larger" else RAM)]))
    if change == "xbzrle":
        s.section(split.SECTION_PART, 3, struct.pack(">Q", 0x40) + b"\x06pc.ram" + s.eos())
    elif change == "block":
        s.section(split.SECTION_START, 4, s.eos(), name="block")
    elif change == "past-the-end":
        s.section(split.SECTION_PART, 3, s.page("pc.ram", RAM, page_of(1)) + s.eos())
    elif change == "zero-past-the-end":  # (at the end of a run of holes)
        holes = b"".join(s.page("pc.ram", i * P, None) for i in range(4))
        s.section(split.SECTION_PART, 3, holes + s.page("pc.ram", RAM, None) + s.eos())
    if change != "missing-pages":
        s.section(split.SECTION_PART, 3, b"".join(s.page("pc.ram", i * P, None) for i in range(16)) + s.eos())
    s.out += DEVICES
    data = bytes(s.out)
    if change == "truncated":
        data = data[:40]
    fake_save(tmp_path / "vm.save", sized(RAM), data)
    return tmp_path / "vm.save"


# larger: the stream (QEMU's, a guest's if it took its QEMU over) says the RAM is larger than the domain (libvirt's
# header) says: root would size the memory file by it, and fill it
CHANGES = ["subsection", "xbzrle", "block", "past-the-end", "zero-past-the-end", "missing-pages", "truncated", "larger"]


@pytest.mark.parametrize("change", CHANGES)
def test_what_the_split_does_not_know_is_refused_and_leaves_nothing(tmp_path: Path, change: str) -> None:
    save = damaged(tmp_path, change)
    fd = os.open(tmp_path / "ram", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        with pytest.raises(split.StreamError, match="in the domain" if change == "larger" else None):
            split.split(save, fd, tmp_path / "state.save")
        assert os.fstat(fd).st_size <= RAM  # never sized past the domain's RAM
    finally:
        os.close(fd)
    assert not (tmp_path / "state.save").exists()


def test_the_split_of_a_save_without_ram_is_refused(tmp_path: Path) -> None:
    s = Stream()
    s.section(split.SECTION_START, 3, s.blocks([("pc.rom", ROM)]))
    s.out += DEVICES
    fake_save(tmp_path / "vm.save", template_xml(), bytes(s.out))
    fd = os.open(tmp_path / "ram", os.O_RDWR | os.O_CREAT, 0o600)
    with pytest.raises(split.StreamError, match="machine's RAM"):
        split.split(tmp_path / "vm.save", fd, tmp_path / "state.save")
    os.close(fd)


# --- the domain's memory backend ---


def session_xml() -> str:
    s = dataclasses.replace(spec(), fwcfg_files={"template": Path("/s/fwcfg/template")})
    return domain.for_restore(template_xml(), s)


def test_a_shared_session_maps_the_file_privately_as_its_ram() -> None:
    xml = rambackend.with_memory(session_xml(), "/proc/42/fd/7")
    args = qemu_args(xml)
    i = args.index("-object")
    backend = json.loads(args[i + 1])
    assert backend == {
        "qom-type": "memory-backend-file",
        "id": split.SHARED_BLOCK,
        "mem-path": "/proc/42/fd/7",
        "size": 2048 * 1024**2,
        "share": False,
        "readonly": False,
        "discard-data": False,
    }
    assert args[args.index("-machine") + 1] == f"memory-backend={split.SHARED_BLOCK}"
    assert rambackend.memory_of(xml) == "/proc/42/fd/7"
    assert "restrict=on" in args[1]  # the network stays as it was


def test_a_backend_named_again_replaces_the_one_there() -> None:
    once = rambackend.with_memory(session_xml(), "/proc/42/fd/7")
    again = rambackend.with_memory(once, None)  # a shared session's own save, restored whole
    args = qemu_args(again)
    assert args.count("-object") == 1 and args.count("-machine") == 1
    assert json.loads(args[args.index("-object") + 1])["qom-type"] == "memory-backend-ram"
    assert rambackend.memory_of(again) is None
    assert rambackend.memory_of(session_xml()) is None


def test_the_backend_leaves_the_guest_abi_alone() -> None:
    before, after = ET.fromstring(session_xml()), ET.fromstring(rambackend.with_memory(session_xml(), "/x"))  # noqa: S314
    assert [e.tag for e in before.iter() if "qemu" not in e.tag] == [e.tag for e in after.iter() if "qemu" not in e.tag]


# --- sealed memory files ---


def test_a_sealed_file_refuses_every_change_and_stays_private_to_write(tmp_path: Path) -> None:
    src = tmp_path / "ram"
    with src.open("wb") as f:
        f.truncate(64 * P)
        f.seek(5 * P)
        f.write(page_of(5))
    fd = sealed.create("test", 64 * P)
    try:
        assert sealed.fill(fd, src) == P
        sealed.seal(fd)
        assert sealed.sealed(fd)
        with pytest.raises(PermissionError):
            os.pwrite(fd, b"x", 0)
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 0)
        libc = ctypes.CDLL(None, use_errno=True)
        punch = 0x01 | 0x02  # FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE: what QEMU 7.2's balloon asks
        assert libc.fallocate(fd, punch, ctypes.c_long(5 * P), ctypes.c_long(P)) == -1
        assert ctypes.get_errno() == errno.EPERM
        with pytest.raises(PermissionError):
            mmap.mmap(fd, 64 * P, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        private = mmap.mmap(fd, 64 * P, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
        assert private[5 * P : 6 * P] == page_of(5)
        private[5 * P : 6 * P] = page_of(9)  # a guest's write: its own copy
        again = mmap.mmap(fd, 64 * P, mmap.MAP_PRIVATE, mmap.PROT_READ)
        assert again[5 * P : 6 * P] == page_of(5)  # never seen by another mapping, nor by the file
        assert os.pread(fd, P, 5 * P) == page_of(5)
        private.close()
        again.close()
    finally:
        os.close(fd)


def test_only_a_sealed_file_is_handed_to_a_holder() -> None:
    fd = sealed.create("test", P)
    try:
        with pytest.raises(ValueError, match="sealed"):
            sealed.hold(fd, (64055, 64055), detached=True)
    finally:
        os.close(fd)


# --- how libvirt confines QEMU, and why a host cannot share ---

CAPS = """<capabilities><host>
  <secmodel><model>none</model><doi>0</doi></secmodel>
  <secmodel><model>dac</model><doi>0</doi>
    <baselabel type='kvm'>+64055:+64055</baselabel><baselabel type='qemu'>+64055:+108</baselabel></secmodel>
</host></capabilities>"""


def test_libvirts_capabilities_say_which_account_runs_qemu() -> None:
    c = node.Confinement.of(CAPS)
    assert c.models == ("dac",)
    assert c.accounts == {"kvm": (64055, 64055), "qemu": (64055, 108)}
    assert sharing._confinement_problem(c, "tcg") is None


@pytest.mark.parametrize(
    ("caps", "said"),
    [
        (CAPS.replace("<model>none</model>", "<model>selinux</model>"), "selinux"),
        (CAPS.replace("+64055:+108", "+0:+0"), "as root"),
        (CAPS.replace("<baselabel type='qemu'>+64055:+108</baselabel>", ""), "does not say"),
    ],
)
def test_a_host_that_cannot_share_says_why(caps: str, said: str) -> None:
    why = sharing._confinement_problem(node.Confinement.of(caps), "tcg")
    assert why is not None and said in why


class _Hv:
    """A hypervisor that could share (root aside): QEMU 7.2 confined by DAC as libvirt-qemu."""

    def qemu_version(self) -> str:
        return "7.2.0"

    def confinement(self) -> node.Confinement:
        return node.Confinement.of(CAPS)


@pytest.mark.parametrize("value", ["0", "off", "No", "false"])
def test_sharing_turned_off_says_so(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(sharing.SWITCH, value)
    why = sharing.problem(_Hv(), "tcg")  # type: ignore[arg-type]
    assert why == f"turned off ({sharing.SWITCH}={value})"


def test_sharing_is_on_unless_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.delenv(sharing.SWITCH, raising=False)
    assert sharing.problem(_Hv(), "tcg") is None  # type: ignore[arg-type]
    monkeypatch.setenv(sharing.SWITCH, "1")
    assert sharing.problem(_Hv(), "tcg") is None  # type: ignore[arg-type]


@contextlib.contextmanager
def held_here(name: str, size: int, allocated: int = 0) -> Iterator[tuple[sealed.Held, os.stat_result]]:
    """A sealed memfd of `size` bytes (`allocated` of them given pages), recorded as held by this process (so that
    no test stops its holder), and its stat."""
    fd = sealed.create(f"vmsandbox-{name}", size)
    try:
        if allocated:
            os.posix_fallocate(fd, 0, allocated)
        sealed.seal(fd)
        st = os.fstat(fd)
        yield sealed.Held(os.getpid(), pids.process_start(os.getpid()) or "", fd, st.st_ino, st.st_size), st
    finally:
        os.close(fd)


def test_a_held_copy_grown_well_past_the_template_memory_is_refreshed(tmp_path: Path) -> None:
    """tmpfs gives a hole a page of its own at a session's first write there: a copy grown past twice the
    template's memory (and some slack) is replaced by a fresh one for the sessions to come."""
    tmpl = template.Template(tmp_path, {})
    with tmpl.ram.open("wb") as f:
        f.write(b"x" * (1 << 20))

    def grown(allocated: int) -> bool:  # a held copy of 1 GiB with `allocated` bytes of pages, sealed
        with held_here("grown", 1 << 30, allocated) as (held, _):
            return sharing._grown(held, tmpl)

    assert not grown(0)  # holes only
    assert not grown(sharing.REFRESH_SLACK)
    assert grown(sharing.REFRESH_SLACK + (8 << 20))


ROLLUP = """559a607b9000-7fff8a162000 ---p 00000000 00:00 0                          [rollup]
Rss:              334368 kB
Pss:              314874 kB
Pss_Shmem:         94060 kB
Shared_Clean:      23080 kB
Shared_Dirty:       1024 kB
Private_Clean:       396 kB
Private_Dirty:    310892 kB
Anonymous:        287744 kB
AnonHugePages:    100352 kB
"""


def test_a_process_memory_use_is_read_from_its_smaps_rollup(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "smaps_rollup").write_text(ROLLUP)
    used = usage.of_process(42, tmp_path)
    assert used == usage.Usage(rss_mib=326, pss_mib=307, shared_mib=23, private_mib=303, anonymous_mib=281)
    assert used.as_dict()["shared_mib"] == 23
    assert usage.of_process(43, tmp_path) is None  # gone, or not ours to read


def test_a_domain_memory_use_is_its_qemu_by_libvirts_pid_file(tmp_path: Path) -> None:
    pids, proc = tmp_path / "pids", tmp_path / "proc"
    pids.mkdir()
    (proc / "42").mkdir(parents=True)
    (proc / "42" / "smaps_rollup").write_text(ROLLUP)
    (proc / "42" / "cmdline").write_bytes(b"qemu-system-x86_64\0-name\0guest=vmsandbox-a,debug-threads=on\0")
    (pids / "vmsandbox-a.pid").write_text("42")
    (pids / "vmsandbox-b.pid").write_text("42")  # stale: pid 42 is another domain's QEMU now
    assert usage.of_domain("vmsandbox-a", pids, proc) == usage.of_process(42, proc)
    assert usage.of_domain("vmsandbox-b", pids, proc) is None
    assert usage.of_domain("vmsandbox-c", pids, proc) is None


def test_a_qemu_that_rewrites_its_command_line_is_still_its_domains(tmp_path: Path) -> None:
    """A QEMU taken over by its guest may rewrite its command line (to hide from the memory guard): it is still
    found by its start time, which the kernel keeps, before libvirt wrote its pid file; a pid reused after that is
    not the domain's, whatever its command line."""
    pids_dir, proc = tmp_path / "pids", tmp_path / "proc"
    pids_dir.mkdir()
    (proc / "42").mkdir(parents=True)
    (proc / "stat").write_text("cpu 1 2 3\nbtime 1000000\nprocesses 9\n")
    (proc / "42" / "cmdline").write_bytes(b"nothing-to-see\0")
    ticks = os.sysconf("SC_CLK_TCK")

    def started(at: float) -> None:  # /proc/42/stat with its start `at` seconds after boot
        fields = ["S"] + ["0"] * 18 + [str(int(at * ticks))] + ["0"] * 10
        (proc / "42" / "stat").write_text(f"42 (qemu (x) y) {' '.join(fields)}\n")

    pidfile = pids_dir / "vmsandbox-a.pid"
    pidfile.write_text("42")
    os.utime(pidfile, (1000000 + 500, 1000000 + 500))  # libvirt wrote it 500 s after boot
    started(499.5)
    assert usage.qemu_pid("vmsandbox-a", pids_dir, proc) == 42  # its command line is no longer its own: found
    started(900)  # pid 42 is a process started long after the pid file: not the domain's
    assert usage.qemu_pid("vmsandbox-a", pids_dir, proc) is None
    (proc / "42" / "stat").write_text("garbage")
    assert usage.qemu_pid("vmsandbox-a", pids_dir, proc) is None


def test_a_typical_session_is_the_median_of_those_that_can_be_read(tmp_path: Path) -> None:
    pids, proc = tmp_path / "pids", tmp_path / "proc"
    pids.mkdir()
    for pid, name, pss_kib in ((41, "a", 100 * 1024), (42, "b", 300 * 1024), (43, "c", 200 * 1024)):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "smaps_rollup").write_text(ROLLUP.replace("314874", str(pss_kib)))
        (proc / str(pid) / "cmdline").write_bytes(f"qemu\0-name\0guest=vmsandbox-{name},x\0".encode())
        (pids / f"vmsandbox-{name}.pid").write_text(str(pid))
    assert usage.footprint(["vmsandbox-a", "vmsandbox-b", "vmsandbox-c", "vmsandbox-gone"], pids, proc) == 200
    assert usage.footprint(["vmsandbox-gone"], pids, proc) is None


def test_the_holes_of_the_shared_files_sessions_map_are_reserved_once_per_file(tmp_path: Path) -> None:
    """A save reads every page of a session's memory: a hole of a tmpfs file read through a private mapping gets a
    page of its own. What a held file the running QEMUs map has not got yet is owed, once per file; a file no
    holder of root's holds (one a QEMU made up, however large) counts nothing."""
    memfd = sealed.create("vmsandbox-tcg-test", 64 << 20)
    madeup = sealed.create("vmsandbox-made-up", 1 << 40)  # a terabyte of holes, held by no holder
    try:
        os.pwrite(memfd, b"x" * (4 << 20), 0)  # 4 MiB held, 60 MiB of holes
        sealed.seal(memfd)
        st = os.fstat(memfd)
        entry = tmp_path / "holder.json"
        me = sealed.Held(os.getpid(), pids.process_start(os.getpid()) or "", memfd, st.st_ino, st.st_size)
        entry.write_text(json.dumps(me.as_dict()))
        pids_dir, proc = tmp_path / "pids", tmp_path / "proc"
        pids_dir.mkdir()
        me_dir = proc / str(os.getpid())  # a QEMU holding both files: this process (its fds are taken from it)
        me_dir.mkdir(parents=True)
        (me_dir / "cmdline").write_bytes(b"qemu\0-name\0guest=vmsandbox-a,x\0")
        (me_dir / "fd").symlink_to(f"/proc/{os.getpid()}/fd")
        (pids_dir / "vmsandbox-a.pid").write_text(str(os.getpid()))
        found = usage.shared_files(pids_dir, proc)
        assert found[st.st_dev, st.st_ino] == usage.SharedFile(st.st_dev, st.st_ino, 64, 60)
        assert len(found) == 2  # the made-up one is seen, and counts nothing below
        assert usage.reserved_mib([entry], pids_dir, proc) == 60
        assert usage.reserved_mib([entry], pids_dir, tmp_path / "none") == 0  # no QEMU maps it: nothing owed
        with mmap.mmap(memfd, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ) as m:  # as a save reads every page
            for at in range(0, len(m), mmap.PAGESIZE):
                m[at]
        assert usage.reserved_mib([entry], pids_dir, proc) == 0
    finally:
        os.close(memfd)
        os.close(madeup)


def test_this_machines_available_memory_leaves_out_what_is_reserved() -> None:
    stats = {"total": 24 * 1024 * 1024, "free": 512 * 1024}
    meminfo = "MemAvailable: 3145728 kB\n"
    n = node.Node.of("h", "9", "7", 4, stats, "<capabilities/>", None, meminfo=meminfo, reserved_mib=1024)
    assert (n.available_mib, n.reserved_mib) == (2048, 1024)
    far = node.Node.of("h", "9", "7", 4, stats, "<capabilities/>", None, reserved_mib=1024)  # (another host)
    assert (far.available_mib, far.reserved_mib) == (512, 0)


def test_a_holder_whose_fd_became_a_fifo_is_not_alive_and_root_never_waits_on_it(tmp_path: Path) -> None:
    """A process of the holder's account may put a FIFO at the fd number root checks: root's open must not wait
    for a writer that never comes (it held the entry's lock: every later warm start would wait too)."""
    import threading

    from vmsandbox import pids

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # no writer: a blocking open of it waits for one
    try:
        held = sealed.Held(os.getpid(), pids.process_start(os.getpid()) or "", fd, os.fstat(fd).st_ino, 0)
        answers: list[bool] = []
        asked = threading.Thread(target=lambda: answers.append(held.alive()), daemon=True)
        asked.start()
        asked.join(5)
        assert answers == [False]
    finally:
        os.close(fd)


def test_root_takes_a_holders_file_and_never_opens_what_is_at_its_number(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A process of QEMU's account may trace a holder and put any file at the number root looks at: a terminal
    (opened by root, it would become root's controlling one), a watchdog (opened, armed), a FUSE file (asked its
    size, it may never answer). Root takes a copy of the descriptor (pidfd_getfd) and asks nothing of a file that
    is no memfd: here a terminal, a pipe, a file of a disk and a tmpfs file are each not alive, and no path under
    /proc is ever opened; the sealed memfd it handed over is."""
    opened: list[str] = []
    real_open = os.open

    def recording(path: object, *args: object, **kwargs: object) -> int:
        opened.append(str(path))
        return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", recording)
    me = (os.getpid(), pids.process_start(os.getpid()) or "")
    master, terminal = os.openpty()
    reading, writing = os.pipe()
    on_disk = os.open(tmp_path / "file", os.O_RDWR | os.O_CREAT, 0o600)
    on_tmpfs = os.open("/dev/shm", os.O_RDWR | os.O_TMPFILE, 0o600)  # tmpfs, as memfds are, but another mount
    memfd = sealed.create("vmsandbox-held", 1 << 20)
    try:
        for fd in (terminal, reading, on_disk, on_tmpfs):
            st = os.fstat(fd)
            assert not sealed.Held(*me, fd, st.st_ino, st.st_size).alive()
        sealed.seal(memfd)
        st = os.fstat(memfd)
        held = sealed.Held(*me, memfd, st.st_ino, st.st_size)
        assert held.alive()
        found = held.stat()
        assert found is not None and found.inode == st.st_ino
        assert not sealed.Held(*me, memfd, st.st_ino + 1, st.st_size).alive()  # another file at that number
        assert not sealed.Held(me[0], "1", memfd, st.st_ino, st.st_size).alive()  # another process of that pid
        assert [p for p in opened if p.startswith("/proc") and "/fd/" in p] == []
    finally:
        for fd in (master, terminal, reading, writing, on_disk, on_tmpfs, memfd):
            os.close(fd)


def test_a_runtime_directory_others_may_write_is_refused_to_root(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from vmsandbox import paths
    from vmsandbox.errors import VmsandboxError

    shared = tmp_path / "run"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    monkeypatch.setenv("VMSANDBOX_RUNTIME_DIR", str(shared))
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    with pytest.raises(VmsandboxError, match="not root's alone") as err:
        paths.memory_holders_dir()
    assert err.value.hint is not None and "unset it" in err.value.hint
    monkeypatch.setenv("VMSANDBOX_RUNTIME_DIR", str(tmp_path / "not-yet"))  # made by root when first used
    assert paths.memory_holders_dir() == tmp_path / "not-yet" / "memory"


def test_an_account_that_may_not_read_roots_holders_finds_none(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Root's holders write in a directory of root's alone (/run/vmsandbox, 0700): a member of the libvirt group's
    `doctor`, `host ls` and `rm --stale` read no holder there, and fail on none (seen: "permission denied"); root
    denied it is told."""
    from vmsandbox import paths

    class Unreadable(type(tmp_path)):  # type: ignore[misc]  # what stat() of a path under a 0700 directory gives
        def is_dir(self) -> bool:
            raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(paths, "memory_holders_dir", lambda: Unreadable(tmp_path / "run" / "memory"))
    with pytest.raises(PermissionError):  # root denied its own directory is told so: it would count nothing
        sealed.holder_entries()
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert sealed.holder_entries() == [] and sealed.held_files() == [] and usage.held_keys() == set()
    assert holders.give_back() == [] and list(sharing.sweep(None, lambda *a: "")) == []  # type: ignore[arg-type]
    held = tmp_path / "held"
    held.mkdir()
    (held / "b.json").write_text("{}")
    (held / "a.json").write_text("{}")
    monkeypatch.setattr(paths, "memory_holders_dir", lambda: held)
    assert sealed.holder_entries() == [held / "a.json", held / "b.json"]


def test_gc_leaves_a_holder_record_a_warm_start_is_writing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """gc reads and removes a holder's record under its lock, as a warm start writes it, and never removes the
    lock file: a holder started meanwhile is never left unrecorded (nothing would ever stop it)."""
    from vmsandbox import paths
    from vmsandbox.confine import access

    monkeypatch.setattr(paths, "memory_holders_dir", lambda: tmp_path)
    entry = tmp_path / "abc.json"
    entry.write_text("{}")  # unreadable: a holder that ended, as gc sees it
    said: list[str] = []

    def tidy(verb: str, what: str, do: object) -> str:
        said.append(verb)
        do()  # type: ignore[operator]
        return what

    with access.flocked(entry.with_suffix(".lock")) as mine:
        assert mine
        assert list(sharing.sweep(None, tidy)) == []  # type: ignore[arg-type]  # busy: left alone
    assert entry.exists()
    assert len(list(sharing.sweep(None, tidy))) == 1 and said == ["remove"]  # type: ignore[arg-type]
    assert not entry.exists() and entry.with_suffix(".lock").exists()


def test_a_host_where_root_cannot_take_a_holders_file_shares_no_memory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Root checks a holder by taking a copy of its descriptor (pidfd_getfd: Linux 5.6, and a ptrace attach, which
    Yama's ptrace_scope 3 refuses even root): where it cannot, sessions restore copies and say why — never a holder
    started again and again at every warm start, each holding a copy."""
    yama = tmp_path / "ptrace_scope"
    monkeypatch.setattr(sealed, "YAMA", yama)
    yama.write_text("1\n")
    assert sealed.taking_problem() is None  # (this kernel is newer than 5.6)
    yama.write_text("3\n")
    assert "ptrace_scope is 3" in (sealed.taking_problem() or "")
    yama.unlink()
    real = os.uname()
    old = type("U", (), {"release": "5.4.0-150-generic", "sysname": real.sysname})()
    monkeypatch.setattr(os, "uname", lambda: old)
    assert "no pidfd_getfd" in (sealed.taking_problem() or "")


def test_gc_stops_a_holder_whose_copy_grew_once_no_session_maps_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A save of a session fills the holes of its template's copy (up to the guest's RAM); a warm start replaces a
    grown copy no session maps, but a template nobody starts from again kept it for good: gc gives it back. A
    fresh copy stays (warm starts map it), and a grown one a session still maps stays, or may map (a QEMU root could
    not look at)."""
    from vmsandbox import paths

    monkeypatch.setattr(paths, "memory_holders_dir", lambda: tmp_path / "holders")
    monkeypatch.setattr(template, "is_current", lambda _where, _hv: True)
    mapped: dict[tuple[int, int], usage.SharedFile] = {}
    blind: list[bool] = []  # a QEMU root cannot look at runs: it may map the copy
    monkeypatch.setattr(usage, "mapped_keys", lambda: None if blind else set(mapped))
    tmpl = tmp_path / "tmpl"
    tmpl.mkdir()
    (tmpl / template.Template(tmpl, {}).ram.name).write_bytes(b"x" * (1 << 20))
    (tmp_path / "holders").mkdir()
    said: list[str] = []

    def tidy(verb: str, what: str, do: object) -> str:  # (never done: the holder here is this process)
        said.append(verb)
        return what

    def swept(allocated: int) -> list[str]:
        with held_here("swept", 1 << 30, allocated) as (held, st):
            (tmp_path / "holders" / "t.json").write_text(json.dumps({**held.as_dict(), "template": str(tmpl)}))
            mapped.clear()
            first = list(sharing.sweep(None, tidy))  # type: ignore[arg-type]
            mapped[st.st_dev, st.st_ino] = usage.SharedFile(st.st_dev, st.st_ino, 1024, 0)
            assert list(sharing.sweep(None, tidy)) == []  # type: ignore[arg-type]  # a session maps it: it stays
            return first

    assert swept(0) == []  # a fresh copy stays
    (grown,) = swept(sharing.REFRESH_SLACK + (8 << 20))
    assert "its copy grew, and no session maps it" in grown and said == ["stop"]
    blind.append(True)
    assert swept(sharing.REFRESH_SLACK + (8 << 20)) == [] and said == ["stop"]  # it may be mapped: it stays


def test_the_guard_gives_back_every_copy_no_session_maps_and_leaves_the_rest(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Before it stops a session, the memory guard stops the holders of the copies no QEMU maps, grown or fresh
    (each said with its size); a copy a session maps stays, and so do one a warm start is loading (its lock) and
    one a warm start was handed and its QEMU does not map yet (its lease). While a QEMU runs that root could not
    look at, none is given back: it may map any of them (stopped, its holes would leave the reservation)."""
    from vmsandbox import paths
    from vmsandbox.confine import access

    records = tmp_path / "holders"
    records.mkdir()
    monkeypatch.setattr(paths, "memory_holders_dir", lambda: records)
    mapped: dict[tuple[int, int], usage.SharedFile] = {}
    blind: list[bool] = []  # a QEMU root cannot look at runs: it may map any copy
    monkeypatch.setattr(usage, "mapped_keys", lambda: None if blind else set(mapped))
    released: list[str] = []

    def release(entry: Path, _held: sealed.Held) -> bool:  # (the holder here is this process: never stopped)
        released.append(entry.stem)
        entry.unlink()  # its record goes with it
        return True

    monkeypatch.setattr(holders, "release", release)
    with contextlib.ExitStack() as stack:
        for name, allocated in (
            ("unmapped", 8 << 20),
            ("fresh", 0),
            ("mapped", 4 << 20),
            ("loading", 0),
            ("leased", 0),
        ):
            held, st = stack.enter_context(held_here(name, 64 << 20, allocated))
            (records / f"{name}.json").write_text(json.dumps({**held.as_dict(), "template": f"/t/{name}"}))
            if name == "mapped":
                mapped[st.st_dev, st.st_ino] = usage.SharedFile(st.st_dev, st.st_ino, 64, 0)
        lease = holders.lease(records / "leased.json")  # a warm start between its look and its QEMU's mapping
        with access.flocked(records / "loading.lock") as mine:
            assert mine
            blind.append(True)
            assert holders.give_back() == [] and released == []  # none while a QEMU root cannot see may map it
            blind.clear()
            freed = holders.give_back()
        os.close(lease)
    assert sorted(released) == ["fresh", "unmapped"]
    assert sorted(freed) == [("/t/fresh", 0), ("/t/unmapped", 8)]


def test_a_restored_qemu_that_maps_another_file_than_the_holders_never_runs_on_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A holder killed and its pid taken by a process of QEMU's account with its own memfd at the same number: the
    QEMU restored (paused) opened that file, not the one root checked. Told apart by the file's device and inode."""
    from vmsandbox.session.place.local import start

    with held_here("checked", 1 << 20) as (held, st):
        shared = sharing.Shared((st.st_dev, st.st_ino), lambda: os.dup(held.fd), Path("/nowhere"), "memory.ram")
        record = Record("s", "/p", "v", "tcg", "", 1, 512, 1024, 0, "u", 1000, 1000, "qemu:///system")
        theirs = usage.SharedFile(st.st_dev, st.st_ino + 1, 1, 0)
        monkeypatch.setattr(usage, "shared_file", lambda _domain: theirs)
        with pytest.raises(VmsandboxError, match="not the one root handed it"):
            start._maps_the_held_file(record, shared)
        monkeypatch.setattr(usage, "shared_file", lambda _domain: None)  # (it maps none: its memory is its own)
        with pytest.raises(VmsandboxError):
            start._maps_the_held_file(record, shared)
        monkeypatch.setattr(usage, "shared_file", lambda _domain: usage.SharedFile(st.st_dev, st.st_ino, 1, 0))
        start._maps_the_held_file(record, shared)


def test_a_live_saves_pages_sent_again_leave_the_last_content_zeros_included(tmp_path: Path) -> None:
    """A live save sends a page again when the guest wrote it during the save; a page it zeroed meanwhile comes
    as a ZERO record after the data it held: the file holds zeros there, not the old data."""
    s = Stream()
    s.section(split.SECTION_START, 3, s.blocks([("pc.ram", RAM)]))
    first = b"".join(s.page("pc.ram", i * P, page_of(0x55) if i in (1, 2, 3) else None) for i in range(16))
    s.section(split.SECTION_PART, 3, first + s.eos())
    again = s.page("pc.ram", 1 * P, None) + s.page("pc.ram", 2 * P, page_of(0x66)) + s.page("pc.ram", 5 * P, None)
    s.section(split.SECTION_END, 3, again + s.eos())
    s.out += DEVICES
    got, ram = split_of(tmp_path, s)
    assert ram[1 * P : 2 * P] == bytes(P)  # zeroed after it was sent: zeros
    assert ram[2 * P : 3 * P] == page_of(0x66) and ram[3 * P : 4 * P] == page_of(0x55)
    assert ram[5 * P : 6 * P] == bytes(P)
    assert got.pages == 2  # pages 2 and 3 hold data
