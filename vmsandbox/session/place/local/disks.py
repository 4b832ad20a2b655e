"""A local session's disks at its checkpoints: the VM saved into the checkpoint's directory (memory.save), the
workspace disk copied beside it (a reflink where the file system has them), the top overlay frozen under a new
one, and the chain folded where no checkpoint needs it (session.place.chain); a rollback's disks; a fork's."""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

from vmsandbox import paths, ui
from vmsandbox.confine import access
from vmsandbox.errors import VmsandboxError
from vmsandbox.session.place import chain, checkpoints
from vmsandbox.session.place.checkpoints import Checkpoint
from vmsandbox.session.place.interface import Launched
from vmsandbox.session.record import Record
from vmsandbox.sync.inward import capture
from vmsandbox.vm import qemuimg
from vmsandbox.vm.virt import Hypervisor

MAX_DEPTH = 3 + checkpoints.MOST + 2  # base, layer, template; a frozen overlay per checkpoint; the top


def freeze(record: Record, hv: Hypervisor, cp: Checkpoint, staging: Path, publish: Launched) -> None:
    """The VM saved into `staging` (which `publish` makes cp.path), its workspace disk copied beside it, a new top
    overlay; on failure, the session is left stopped on the saved memory, wherever it is by then."""
    memory = staging / checkpoints.MEMORY
    with ui.step(f"Saving {record.domain} (memory and devices)"):
        hv.save(record.domain, str(memory))
    try:
        with ui.step("Keeping the workspace disk"):
            capture.copy_disk(record.files.workspace_disk, staging / checkpoints.WORKSPACE)
        publish()
        new_top(record)
        tidy(record, live=False)
    except BaseException:
        leave_stopped(record, memory if memory.exists() else cp.memory)
        raise


def leave_stopped(record: Record, memory: Path) -> None:
    if memory.exists():
        shutil.copyfile(memory, record.files.saved_memory)
        record.saved = True
        record.save()
        ui.warn(f"session {record.name} is stopped; `vmsandbox start {record.name}` resumes it")


def new_top(record: Record) -> None:
    """Freeze the VM's top overlay and put a new one above it (the VM must be down)."""
    if os.geteuid() != 0 and record.system_disk.stat().st_uid == os.geteuid():
        # libvirt hands a VM's backing images to QEMU's account and, unlike the top one, never hands them back:
        # an entry of our own keeps a frozen overlay ours to read, fold and copy
        access.grant(record.system_disk, os.geteuid(), 6)
    top = f"overlay-{secrets.token_hex(4)}.qcow2"
    qemuimg.create_overlay(record.system_disk, record.files.root / top, depth=MAX_DEPTH)
    (record.files.root / top).chmod(0o600)
    record.overlays.append(top)
    record.save()


def tidy(record: Record, *, live: bool) -> None:
    """Fold the overlays no checkpoint needs into the ones above, delete the unreachable ones (session.place.chain)."""
    files = record.files
    have = checkpoints.listed(files)
    chains = [record.overlays, *(c.chain for c in have)]
    named = {record.overlays[-1], *(c.overlay for c in have)}
    p = chain.plan(chains, named, chain.present(files.root), live=live)
    if not p.folds and not p.dead:
        return
    chain.apply(files.root, chains, p)
    record.save()
    for c in have:
        c.write()


def rewind(record: Record, cp: Checkpoint) -> None:
    files = record.files
    new_top(record)
    with ui.step("Restoring the workspace disk"):
        tmp = files.root / f".{paths.SESSION_WORKSPACE_DISK}.rollback"
        capture.copy_disk(cp.workspace, tmp)
        tmp.replace(files.workspace_disk)
    tidy(record, live=False)


def copy_for_fork(source: Record, cp: Checkpoint, record: Record) -> None:
    """The fork's system disk: one overlay holding everything the checkpoint's chain held above its image."""
    src = source.files
    # the image the host put below it, else (a session made before it was recorded) what its bottom overlay says
    below = source.below or qemuimg.info(src.root / cp.chain[0]).backing_file
    if below is None:
        raise VmsandboxError(f"{src.root / cp.chain[0]} has no backing image")
    qemuimg.copy_above(src.root / cp.overlay, Path(below), record.system_disk)
    record.system_disk.chmod(0o600)
