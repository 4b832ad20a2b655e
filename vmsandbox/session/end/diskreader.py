"""Reading the workspace disk of a session whose VM is gone or stopped — in a VM, never with host parsers.

The disk was written by the guest: whoever controlled the guest chose every byte of it, including the
filesystem's own structures. The host parses none of it. A reader VM, restored from the warm-start template
(cold-booted when there is none), gets a qcow2 overlay on the disk as its workspace (the raw disk itself is
only read: its format is given, never probed), mounts it at the project's path with its own kernel (which
replays the journal of a VM that crashed, into the overlay), and is then read like a live session: rsync into
the mirror through the jailed receiver. A crafted filesystem can at worst take over that reader VM, which
then is one more hostile guest, with no network and nothing of the user's.

A reader's files are a dot-directory in the sessions directory (`.reader-NAME-XXXX`, never listed as a
session); gc removes one whose `vmsandbox` process died, and its domain.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import secrets
import shlex
import shutil
from collections.abc import Iterator
from pathlib import Path

from vmsandbox import paths, pids, ui
from vmsandbox.confine import access, accounts
from vmsandbox.egress.rules.netpolicy import Mode
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest import commands
from vmsandbox.guest.bootfiles import GuestUser
from vmsandbox.guest.ssh import Endpoint
from vmsandbox.image import store
from vmsandbox.session import settings
from vmsandbox.session.place import choose
from vmsandbox.session.place.interface import VM, Host, Tidy
from vmsandbox.session.record import Phase, Record
from vmsandbox.session.start import create
from vmsandbox.session.state import runs
from vmsandbox.vm import accel, qemuimg
from vmsandbox.vm.virt import Hypervisor

log = logging.getLogger(__name__)

PREFIX = paths.READER_PREFIX
OVERLAY = "workspace.qcow2"


@contextlib.contextmanager
def source(record: Record, vm: VM | None = None) -> Iterator[tuple[Endpoint | None, bool]]:
    """Where the guest's tree is read from, for as long as the block runs: (the running VM's endpoint, False),
    (a reader VM's endpoint, True) with the workspace disk of a VM that is gone or stopped mounted in it, or
    (None, False) when the outbox holds the changes. `vm`: the session's VM on the connection the caller's
    operation holds (else one is opened here, for the block)."""
    if record.files.outbox.is_dir():
        yield None, False
        return
    with contextlib.ExitStack() as held:
        there = vm or held.enter_context(choose.vm_of(record))
        if runs(there):
            yield there.reach(), False
            return
        disk = there.workspace_disk()
        with reading(record, disk, there.host) as reader:
            yield reader, True


@contextlib.contextmanager
def reading(record: Record, disk: Path, near: Host | None = None) -> Iterator[Endpoint | None]:
    """A reader VM with the session's workspace disk (`disk`, here) mounted at the project's path, for as long
    as the block runs; its endpoint (root's login is the same as a session's). None when there is no such disk
    here (the session was exported, or never made). `near`: a host the operation holds, used if it is the
    reader's."""
    if not disk.exists():
        yield None
        return
    config = settings.load()
    reader = _new(record, disk, config)
    try:
        with contextlib.ExitStack() as held:
            same = near is not None and near.spec.uri == reader.libvirt_uri
            host = near if same and near else held.enter_context(choose.host_of(reader))
            try:
                _boot(host, reader, record, config.boot_timeout)
                yield reader.endpoint()
            finally:
                host.libvirt().destroy(reader.domain)
    finally:
        shutil.rmtree(reader.files.root, ignore_errors=True)


def _new(session: Record, disk: Path, config: settings.Settings) -> Record:
    """The reader's record and files: the session's user and project path, the default VM shape (whose
    template is the one most likely made already), no network at all."""
    name = f"{PREFIX}{session.name}-{secrets.token_hex(2)}"
    files = paths.reader_paths(name)
    accounts.state_dirs()
    create.make_dir(files)
    choice = accel.choose(config.accel)
    reader = Record(
        name=name,
        project=session.project,
        image_version=store.current_image().version,
        accel=choice.accel.value,
        accel_reason=choice.reason,
        cpus=config.cpus,
        memory_mib=config.memory_mib,
        disk_mib=config.disk_mib,
        ssh_port=0,
        user=session.user,
        uid=session.uid,
        gid=session.gid,
        libvirt_uri=config.libvirt_uri,
        network=Mode.NONE,
        workspace=str(files.root / OVERLAY),
        workspace_backing=_readable_by_qemu(disk),
        owner_pid=os.getpid(),
        owner_start=pids.process_start(os.getpid()),
    )
    reader.save()
    qemuimg.overlay_on_raw(disk, reader.workspace_disk)
    reader.workspace_disk.chmod(0o600)
    # no workdir: the guest's own start-up never touches the disk (a disk that cannot be mounted must not
    # look like a failed warm start, which would mark the template failed); _mount mounts it
    create.write_identity(files, name, "vmsandbox-reader", GuestUser(session.user, session.uid, session.gid), None)
    fw = files.fwcfg_dir
    (fw / "env").write_text("")
    accounts.give_to_qemu(fw)
    return reader


def _readable_by_qemu(disk: Path) -> str | None:
    """The raw disk, once QEMU's account may read it through an ACL entry: the reader's domain names it so that
    libvirt never relabels it (it would give it to QEMU's account for good). None where no ACL can be set: then
    libvirt relabels it, as it must for QEMU to read it at all."""
    qemu = accounts.qemu_uid()
    if qemu is None:
        return None
    if qemu != os.geteuid():  # (QEMU running as us reads it as it is)
        try:
            access.let_read(disk, qemu)
        except VmsandboxError as exc:
            log.info("%s: %s; libvirt will give it to QEMU's account", disk, exc.message)
            return None
    return str(disk)


def _boot(host: Host, reader: Record, session: Record, boot_timeout: int) -> None:
    ui.info("The workspace disk is read in a VM of its own (the host parses none of it)")
    try:
        host.boot(reader, store.current_image(), cold=False, timeout=boot_timeout, launched=lambda: None)
    except VmsandboxError as exc:
        raise VmsandboxError(
            f"the VM that reads the workspace disk did not start: {exc.message}",
            hint=exc.hint or "`vmsandbox doctor` checks libvirt and the image",
        ) from exc
    _mount(reader, session)
    reader.status = Phase.READY
    reader.save()


# Read-only (the kernel still replays the journal of a VM that crashed, into the overlay), and nothing on it
# is ever run: only rsync reads it.
MOUNT_OPTIONS = "ro,noatime,nosuid,nodev,noexec"
MOUNT_TIMEOUT = 120


def _mount(reader: Record, session: Record) -> None:
    workdir = shlex.quote(session.project)
    script = (
        f"dev=$(/usr/local/lib/vmsandbox/workspace-dev 20) && mkdir -p {workdir} && "
        f'mount -t ext4 -o {MOUNT_OPTIONS} "$dev" {workdir}'
    )
    done = commands.run_as_root(reader.endpoint(), script, check=False, timeout=MOUNT_TIMEOUT)
    if done.returncode != 0:
        said = ui.printable((done.stderr or done.stdout).strip()[-300:], markup=False)
        raise VmsandboxError(
            f"the workspace disk of session {session.name} cannot be read: a VM could not mount it ({said})",
            hint=f"the guest left it damaged; its raw image is {session.files.workspace_disk} (never changed by "
            f"a read). `vmsandbox rm {session.name} --discard` removes the session",
        )


def sweep(sessions: Path, hv: Hypervisor, tidy: Tidy) -> Iterator[str]:
    """Readers whose `vmsandbox` process died (killed during a pull): their domain and files."""
    for root in sorted(sessions.glob(PREFIX + "*")):
        try:
            reader = Record.load(root.name)
        except VmsandboxError:
            reader = None
        if reader is not None and reader.owner_alive():
            continue
        what = f"a disk reader VM left by a killed command ({root.name})"
        yield tidy("remove", what, functools.partial(_drop, hv, root, reader))


def _drop(hv: Hypervisor, root: Path, reader: Record | None) -> None:
    if reader is not None:
        hv.destroy(reader.domain)
    shutil.rmtree(root, ignore_errors=True)
