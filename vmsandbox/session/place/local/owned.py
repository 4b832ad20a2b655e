"""What a session's QEMU owns on this machine: an account of its own (confine.pool), checked against its lease at
every start; its own copies of the files libvirt labels for it (kernel, initrd); and its disks' chain as the host
recorded it, the shared images in it never labelled for any account."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

from vmsandbox import proc, ui
from vmsandbox.confine import accounts, pool
from vmsandbox.errors import VmsandboxError
from vmsandbox.session.record import Record
from vmsandbox.vm import qemuimg

KERNEL, INITRD = "vmlinuz", "initrd.img"  # a session of its own account boots its own copies


def checked_account(record: Record) -> int | None:
    """The session's account, which must be one of the pool's, leased to this very session (a record that names
    root, or another session's account, is refused)."""
    if record.account is not None and not pool.holds(record.account, record.files.root):
        raise VmsandboxError(
            f"session {record.name} names account {record.account}, which is not its lease of the session accounts' "
            "pool",
            hint=f"`vmsandbox rm {record.name}`",
        )
    return record.account


def own_account(record: Record, *, lease: bool = True) -> None:
    """The session's QEMU gets an account of its own (confine.pool; `lease`: unless it builds an image, whose disk
    becomes one), held until the session is gone — where no pool was made, libvirt's QEMU account — and the files
    it opens that are not libvirt's to label (fw_cfg's) are made readable to it, and to it alone."""
    if lease and record.account is None:
        record.account = pool.lease(record.files.root)
        if record.account is not None:
            record.save()
            forget_keys(record.account)
    accounts.give_to_qemu(record.files.fwcfg_dir, record.account)


def forget_keys(uid: int) -> None:
    """The account's keyrings emptied of what a session before left (confine.keyrings, run as the account); where
    the kernel refuses (keyctl(2) filtered out, as container runtimes do), said, and the session goes on."""
    done = proc.run(proc.own_module("vmsandbox.confine.keyrings", str(uid)), cwd=Path("/"), check=False, timeout=30)
    if done.returncode != 0:
        ui.warn(f"the keyrings of session account {uid} were not emptied: {proc.tail_of(done.stderr, lines=2)}")


def own_copy(record: Record, source: Path, name: str) -> Path:
    """The session's own copy of a file its QEMU opens and libvirt labels for it (the kernel, the initrd): libvirt
    gives such a file to the one account that runs a QEMU on it, and refuses a second session of another account
    the image's own."""
    mine = record.files.root / name
    if source == mine:
        return mine
    if not mine.exists():
        tmp = mine.with_name(f".{name}.tmp")
        shutil.copyfile(source, tmp)
        tmp.chmod(0o400)
        tmp.replace(mine)
    return mine


def chain_of(record: Record) -> tuple[tuple[Path, str, bool], ...]:
    """The images below a session's system disk, from what the host made and recorded — never from a qcow2 header,
    which its guest may have rewritten (to name a file of root's in its directory: libvirt would give it to the
    session's account): its own overlays below the top (libvirt labels them its account's), then the shared
    image it rests on and that image's chain (root's, read-only: libvirt must never give them to a session's
    account). An image build's or a reader's disk (record.disk): the chain of the disk the host just made, every
    image below it shared. () for a session made before the host recorded it: libvirt probes, as it always did."""
    if record.disk is not None:
        return tuple((i.path, i.format, False) for i in qemuimg.chain(Path(record.disk))[1:])
    if record.below is None:
        return ()
    root = record.files.root
    own: list[tuple[Path, str, bool]] = []
    for name in reversed(record.overlays[:-1]):
        path = root / name
        if "/" in name or not stat.S_ISREG(path.lstat().st_mode):
            raise VmsandboxError(f"{path} is not an overlay of the session's", hint=f"`vmsandbox rm {record.name}`")
        own.append((path, "qcow2", True))
    shared = [(i.path, i.format, False) for i in qemuimg.chain(Path(record.below))]
    return (*own, *shared)
