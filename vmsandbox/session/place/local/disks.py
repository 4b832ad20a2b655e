"""A local session's disks at its checkpoints: the VM saved into the checkpoint's directory (memory.save), the
workspace disk copied beside it (a reflink where the file system has them), the top overlay frozen under a new
one, and the chain folded where no checkpoint needs it (session.place.chain); a rollback's disks; a fork's."""

from __future__ import annotations

import os
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from vmsandbox import paths, ui
from vmsandbox.confine import access
from vmsandbox.errors import VmsandboxError
from vmsandbox.session.place import chain, checkpoints
from vmsandbox.session.place.checkpoints import Checkpoint
from vmsandbox.session.place.interface import Launched, Still
from vmsandbox.session.record import Record
from vmsandbox.sync.inward import capture
from vmsandbox.vm import livesave, qemuimg
from vmsandbox.vm.memory import usage
from vmsandbox.vm.virt import Hypervisor

MAX_DEPTH = 3 + checkpoints.MOST + 2  # base, layer, template; a frozen overlay per checkpoint; the top
LIVE_CHAIN = 8  # overlays from which a live save (each leaves one more) first folds those no checkpoint needs


def freeze(record: Record, hv: Hypervisor, cp: Checkpoint, staging: Path, publish: Launched) -> None:
    """The VM saved into `staging` (which `publish` makes cp.path), its workspace disk copied beside it, a new top
    overlay; on failure, the session is left stopped on the saved memory, wherever it is by then."""
    memory = staging / checkpoints.MEMORY
    with ui.step(f"Saving {record.domain} (memory and devices)"):
        hv.save(record.domain, str(memory))
    try:
        with ui.step("Keeping the workspace disk"):
            capture.copy_disk(record.files.workspace_disk, staging / checkpoints.WORKSPACE, made=_made(record))
        publish()
        new_top(record)
        tidy(record, live=False)
    except BaseException:
        leave_stopped(record, memory if memory.exists() else cp.memory)
        raise


def freeze_live(record: Record, hv: Hypervisor, cp: Checkpoint, staging: Path, publish: Launched, still: Still) -> bool:
    """The VM's memory saved into `staging` while it runs (livesave: its guest paused for the last pass only), its
    system disk switched to a new top overlay in that pause, its workspace disk copied while `still` holds the
    guest's workspace frozen; the VM runs on. From LIVE_CHAIN overlays, those right below its top that no
    checkpoint needs are first folded while it runs (fold_live). False where it cannot be done so (the session is
    not confined to an account of its own, its guest cannot freeze its workspace, or it still reads LIVE_CHAIN
    overlays of which a save would fold some): nothing else was changed then."""
    if record.account is None:  # (the frozen overlay would be libvirt's account's: not ours to copy)
        return False
    if len(record.overlays) >= LIVE_CHAIN:
        if fold_live(record, hv):
            cp.chain[:] = record.overlays  # what the top it freezes reads now
        if len(record.overlays) >= LIVE_CHAIN and _folds_when_saved(record):
            ui.info(
                f"  {record.name} reads through {len(record.overlays)} overlays: it is saved and resumed this "
                "once, which folds those no checkpoint needs"
            )
            return False
    files = record.files
    old, name = record.system_disk, f"overlay-{secrets.token_hex(4)}.qcow2"
    new = files.root / name
    overlay_above(record, new)
    # listed before the switch: should this process end before it, an empty overlay on top reads as the one below
    record.overlays.append(name)
    record.save()
    switched = False
    try:
        with still() as holding:
            if holding is None:
                return False
            frozen = time.monotonic()
            xml = livesave.snapshot_xml(hv.xml(record.domain) or "", staging / checkpoints.MEMORY, old, new)
            qemu = hv.qemu_version()
            live = livesave.passes_are_sound(record.accel, qemu, _binary(record.domain))
            how = "while it runs" if live else f"(paused for it: QEMU {qemu} under TCG misses writes made meanwhile)"
            with ui.step(f"Saving {record.domain}'s memory {how}"):
                paused = hv.save_live(record.domain, xml, live=live)
                switched = True
            with ui.step("Keeping the workspace disk"):
                capture.copy_disk(files.workspace_disk, staging / checkpoints.WORKSPACE, made=_made(record))
            holding.still()
        what = "the save's last pass" if live else "the save"
        ui.info(
            f"  {record.name} ran on in its QEMU: its guest paused {paused:.2f} s ({what}), writes into its "
            f"workspace held {time.monotonic() - frozen:.1f} s"
        )
    finally:
        if not switched and not _may_run_on(hv, record.domain, new):
            record.overlays.remove(name)
            record.save()
            new.unlink(missing_ok=True)
    publish()
    tidy(record, live=True)
    return True


@dataclass(frozen=True)
class _Fold:
    dev: str  # the disk's target
    reads: list[str]  # the images it reads below its top, nearest first
    run: list[str]  # the overlays folded (chain.streamable)
    base: Path  # the image its top reads once they are
    bytes: int  # what they hold


def fold_live(record: Record, hv: Hypervisor) -> bool:
    """Fold the run of overlays right below the running VM's top that no checkpoint needs into the top
    (chain.streamable: QEMU's block stream, the guest running on), then delete them, once libvirt says the VM
    reads its chain without them. Whether it did; where it did not, it is said why, and the record and the files
    are as they were (a stream stopped part way has copied into the top only what the top read through already)."""
    fold = _planned(record, hv)
    if fold is None:
        return False
    what = "an overlay" if len(fold.run) == 1 else f"{len(fold.run)} overlays"
    try:
        with ui.step(f"Folding {what} no checkpoint needs into {record.name}'s top, while it runs"):
            hv.pull(record.domain, fold.dev, str(fold.base), within=livesave.fold_within(fold.bytes))
    except VmsandboxError as exc:
        ui.warn(exc.message)
        return False
    gone = {str(record.files.root / o) for o in fold.run}
    live = hv.xml(record.domain)
    after = livesave.backing(live, record.system_disk) if live is not None else None
    if after is None or after[1] != [image for image in fold.reads if image not in gone]:
        ui.warn(
            f"{record.name}'s overlays are kept: its VM does not read the chain the fold should have left "
            f"(libvirt's log of it: /var/log/libvirt/qemu/{record.domain}.log)"
        )
        return False
    record.overlays = [o for o in record.overlays if o not in fold.run]
    record.save()
    tidy(record, live=True)  # (no chain names them any more: deleted)
    return True


def _planned(record: Record, hv: Hypervisor) -> _Fold | None:
    """What fold_live would fold, if anything may be (else None, said where it is not for want of a run)."""
    live = hv.xml(record.domain)
    disk = livesave.backing(live, record.system_disk) if live is not None else None
    if record.below is None or disk is None:  # (a session made before its image was recorded: headers name it)
        return None
    files, vm = record.files, record.overlays
    have, chains, named = _tree(record)
    if damaged := sorted(checkpoints.unread(files, have)):
        ui.warn(f"{record.name}'s overlays are not folded while it runs: checkpoint {damaged[0]} cannot be read")
        return None
    run = chain.streamable(chains, named)
    if not run:
        return None
    need, free = sum((files.root / o).stat().st_blocks * 512 for o in run), shutil.disk_usage(files.root).free
    if need + qemuimg.COPY_ROOM > free:
        ui.warn(
            f"{record.name}'s overlays are not folded while it runs: copying {need / 1024**3:.1f} GiB of them needs "
            f"room that {files.root.parent} has not ({free / 1024**3:.1f} GiB free)"
        )
        return None
    first = vm.index(run[0])
    return _Fold(disk[0], disk[1], run, files.root / vm[first - 1] if first else Path(record.below), need)


def _folds_when_saved(record: Record) -> bool:
    """Whether saving the VM would fold overlays of its chain (chain.plan, as `tidy` does once it is down)."""
    _, chains, named = _tree(record)
    return any(o in record.overlays for o, _ in chain.plan(chains, named, set(), live=False).folds)


def _tree(record: Record) -> tuple[list[Checkpoint], list[list[str]], set[str]]:
    """The session's checkpoints, every chain still needed (the VM's first: `record.overlays` itself) and the
    overlays that must stay (the checkpoints' and the VM's top)."""
    have = checkpoints.listed(record.files)
    return have, [record.overlays, *(c.chain for c in have)], {record.overlays[-1], *(c.overlay for c in have)}


def _binary(domain: str) -> str | None:
    """The file the domain's QEMU process runs (None: not known)."""
    pid = usage.qemu_pid(domain)
    try:
        return str(Path(f"/proc/{pid}/exe").readlink()) if pid is not None else None
    except OSError:
        return None


def _may_run_on(hv: Hypervisor, domain: str, image: Path) -> bool:
    """Whether the VM may run on `image` after a live save that failed (libvirt fails it when its resume after
    the disk switch fails): unless its live XML says it does not, it is kept (an empty overlay on top reads as
    the one below)."""
    live = hv.xml(domain)
    return live is None or livesave.runs_on(live, image)


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
    overlay_above(record, record.files.root / top)
    record.overlays.append(top)
    record.save()


def overlay_above(record: Record, new: Path) -> None:
    """A new overlay `new` (0600) on the session's top one. Where the record names the image below its overlays,
    the top's header is not read (its QEMU may have rewritten it): the chain's depth is the record's, the size
    the larger of the session's disk and that image's; else (a session made before) qemu-img reads the chain."""
    if record.below is None:
        qemuimg.create_overlay(record.system_disk, new, depth=MAX_DEPTH)
    else:
        images = qemuimg.chain(Path(record.below))  # (shared images, root's: their headers are the host's)
        if len(images) + len(record.overlays) >= MAX_DEPTH:
            raise VmsandboxError(
                f"session {record.name} runs on {len(record.overlays)} overlays: no room for another",
                hint=f"remove checkpoints it no longer needs (`vmsandbox checkpoint rm {record.name} LABEL`)",
            )
        qemuimg.overlay_unopened(record.system_disk, new, _larger(record, images[0].virtual_size))
    new.chmod(0o600)


def most_bytes(record: Record, below: Path | None = None) -> int:
    """The size a session's disk reads as: the larger of its own and that of the image below its overlays
    (`below`, else the record's)."""
    return _larger(record, qemuimg.info(below or Path(record.below or "")).virtual_size)


def _larger(record: Record, below_bytes: int) -> int:
    return max(record.disk_mib * 1024 * 1024, below_bytes)


def trusted_below(record: Record) -> Path:
    """The image below a session's overlays: the record's; for a session made before the host recorded it, the
    one its bottom overlay's header names, only if that name is, as written, a path in this host's images
    directory (its QEMU may have rewritten the header to name a file of the host's, which a fold or a fork's copy
    would read into a disk its guest reads; the name is not looked up before it passes)."""
    if record.below is not None:
        return Path(record.below)
    named = qemuimg.info(record.files.root / record.overlays[0]).backing_file or ""
    images = str(paths.images_dir().absolute())
    if os.path.normpath(named) != named or not named.startswith(images + "/"):
        raise VmsandboxError(
            f"session {record.name} was made by an older vmsandbox, and its disk's first overlay names "
            f"{ui.printable(repr(named), markup=False)} as the image below it: not an image of this host's",
            hint=f"take its changes (`vmsandbox pull {record.name}`), then `vmsandbox rm {record.name}` and start anew",
        )
    return Path(named)


def tidy(record: Record, *, live: bool) -> None:
    """Fold the overlays no checkpoint needs into the ones above, delete the unreachable ones (session.place.chain)."""
    files = record.files
    have, chains, named = _tree(record)
    p = chain.plan(chains, named, chain.present(files.root), live=live)
    if not p.folds and not p.dead:
        return
    if p.folds:  # (read for folds only)
        base = trusted_below(record)
        below: tuple[Path, int] | None = (base, most_bytes(record, base))
    else:
        below = None
    chain.apply(files.root, chains, p, below)
    record.save()
    for c in have:
        c.write()


def _made(record: Record) -> int | None:
    """The size the host made the session's workspace disk (None: a session made before it was recorded)."""
    return record.workspace_bytes or None


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
    below = trusted_below(source)
    overlays = [src.root / name for name in reversed(cp.chain)]
    qemuimg.copy_above(overlays, below, record.system_disk, most_bytes(source, below))
    record.system_disk.chmod(0o600)
