"""The workspace going in: the project captured on the host as it is, and the disk the guest mounts at the
project's path.

Work stays on the host where it can (the guest CPU is slow under TCG): the tree is copied locally (a
reflink where the filesystem can), and the guest's ext4 disk is made on the host with `mkfs.ext4 -d`. The copy is
the person's (confine.rights): under sudo `cp` runs as who ran sudo, so it reads nothing they could not, and it
copies from the descriptor the project check walked (session.start.project.opened), never from a path another
account could change in between; what root reads of the project afterwards it reads from that copy. The
copy is the session's baseline: what every later comparison starts from. The mirror of the guest's tree is
made from it when a pull first needs it (sync.fetch.volume: the baseline's tree with placeholders for its
files, no second copy of the data, in a file system of its own under root): a session that is never pulled
never pays for it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
from collections.abc import Collection, Iterator
from pathlib import Path

from vmsandbox import failpoint, filewrite, proc
from vmsandbox.confine import accounts, beneath, rights
from vmsandbox.errors import VmsandboxError
from vmsandbox.paths import SessionPaths
from vmsandbox.sync.fetch import delta
from vmsandbox.sync.inward import leftout
from vmsandbox.sync.tree import manifest, views
from vmsandbox.vm import ext4

HEADROOM_BYTES = 8 * 1024**3  # room for what the agent adds (dependencies, builds) on the sparse disk
BYTES_PER_INODE = 8192
COPIES = 2  # the baseline and the workspace disk's data (the mirror holds placeholders: sync.placeholders)
RESERVE_BYTES = 64 * 1024**2


PRISTINE = "workspace.pristine.raw"  # a fan-out's one capture: its workspace disk as made, copied by each session


def capture(
    project: beneath.Root, files: SessionPaths, *, pristine: bool = False, leave_out: Collection[str] = ()
) -> manifest.Manifest:
    """Snapshot the project (tracked, untracked, ignored, .git; opened and checked by project.opened) into the
    session, but what its `.vmsandboxignore` names and `leave_out` (files that look like credentials: leftout.py);
    build the workspace disk (and with `pristine`, keep a copy of it as made, for copy_from)."""
    check_space(project, files.root)
    files.baseline.mkdir(mode=0o700)
    copy_tree(project, files.baseline)
    files.baseline.chmod(0o700)  # cp -a gave it the project's mode: keep the copy private
    failpoint.hit("run.capture")
    entries = manifest.scan(files.baseline)
    spec = leftout.ignore_spec(files.baseline, project.path)  # (the copy's: what the person could read)
    leftout.remove(files.baseline, entries, [*leave_out, *(leftout.ignored(entries, spec) if spec else [])])
    filewrite.write_atomically(files.baseline_manifest, json.dumps(manifest.to_json(entries)))
    used = sum(e.size for e in entries.values())
    size = max(2 * used, used + HEADROOM_BYTES)
    inodes = max(2 * len(entries), size // BYTES_PER_INODE)
    disk = files.workspace_disk
    ext4.make(files.baseline, disk, f"{size // 1024}k", label="workspace", inodes=inodes, extended=("root_owner=0:0",))
    disk.chmod(0o600)  # a copy of the project: for root (and QEMU, via libvirt) only
    if "lost+found" not in entries:
        ext4.remove_dir(disk, "lost+found")
    if pristine:
        copy_disk(files.workspace_disk, files.root / PRISTINE)
    delta.save(files.root, {})  # the mirror will be the baseline: the first pull reads only what the journal names
    return entries


def copy_tree(project: beneath.Root, dest: Path) -> None:
    """The project's tree into `dest` (an empty directory of ours), as `cp -a` copies it, with the person's rights:
    under sudo cp runs as who ran sudo (rights.person: uid, gid, groups) in `dest`, made theirs for the copy, so the
    kernel lets it read only what they may; and it reads the project through its descriptor (`/proc/self/fd/N`,
    the directory the check walked), whatever the project's path holds by then."""
    who = rights.person()
    if who is not None:
        os.chown(dest, who.uid, who.gid)
    source = f"/proc/self/fd/{project.fd}/."
    result = proc.run(
        ["cp", "-a", "--reflink=auto", source, "."],
        cwd=dest,
        as_user=who,
        env=accounts.clean_env(who) if who is not None else None,
        pass_fds=(project.fd,),
        check=False,
    )
    if result.returncode != 0:
        said = proc.tail_of(
            result.stderr.replace(f"{source}/", f"{project.path}/").replace(source, str(project.path)), lines=8
        )
        mine = f" ({who.name})" if who is not None else ""
        raise VmsandboxError(
            f"copying {project.path} failed: {said}",
            hint=f"every file of the project must be readable by you{mine} (vmsandbox copies it with your rights, "
            "under sudo too), and the state directory needs the space",
        )


def copy_from(source: SessionPaths, files: SessionPaths, workspace: Path | None) -> manifest.Manifest:
    """A session's capture copied from another's: its baseline and manifest, `workspace` as its workspace disk (a
    fan-out's capture made once with `pristine`, a checkpoint's copy; None: its disk is made on another host),
    and a mirror of its own that starts as the baseline."""
    check_space(source.baseline, files.root)
    proc.run(["cp", "-a", "--reflink=auto", source.baseline, files.baseline])
    shutil.copyfile(source.baseline_manifest, files.baseline_manifest)
    entries = manifest.from_json(json.loads(files.baseline_manifest.read_text()))
    if workspace is not None:
        copy_disk(workspace, files.workspace_disk)
    delta.save(files.root, {})  # (its mirror, made when a pull needs it, starts as the baseline)
    return entries


def copy_disk(source: Path, dest: Path, *, made: int | None = None) -> None:
    """A sparse copy of a raw disk (a reflink where the file system can), 0600, without the source's xattrs
    (libvirt's record of who uses a disk). A session's QEMU may write on into it meanwhile, and set its size:
    it is copied as it was when the copy began, and no larger than `made`, the size the host made it
    (record.workspace_bytes; None: a copy of the host's own, which no QEMU writes) — filewrite.copy_sparse."""
    filewrite.copy_sparse(source, dest, most=made)


def project_bytes(project: Path | beneath.Root) -> int:
    """What the project's files hold (symlinks not followed, holes not counted); a Root is walked from its
    descriptor, under sudo into the directories the person may list only (their copy fails at the others)."""
    if isinstance(project, Path):
        return _bytes(os.fwalk(project), None)
    who = rights.person()
    if who is not None and not rights.may(project.fd, who, rights.LIST):
        return 0
    return _bytes(os.fwalk(".", dir_fd=project.fd), who)


def _bytes(walked: Iterator[tuple[str, list[str], list[str], int]], who: accounts.Identity | None) -> int:
    total = 0
    for _top, dirs, names, top_fd in walked:
        if who is not None:
            dirs[:] = [d for d in dirs if rights.may_at(top_fd, d, who, rights.LIST)]
        for name in names:
            with contextlib.suppress(OSError):
                st = os.stat(name, dir_fd=top_fd, follow_symlinks=False)
                total += min(st.st_size, st.st_blocks * 512) if stat.S_ISREG(st.st_mode) else 0
    return total


def check_space(project: Path | beneath.Root, where: Path) -> None:
    """Before anything is copied: room for the baseline and the workspace disk (without reflinks, two copies
    of the project; the mirror starts with placeholders), plus a reserve."""
    need = COPIES * project_bytes(project) + RESERVE_BYTES
    free = shutil.disk_usage(where).free
    if need > free:
        named = project if isinstance(project, Path) else project.path
        raise VmsandboxError(
            f"capturing {named} needs about {need / 1024**2:.0f} MiB in {where.parent} ({COPIES} copies of the "
            f"project and a reserve); it has {free / 1024**2:.0f} MiB free",
            hint="free space there, or point VMSANDBOX_STATE_DIR at a bigger disk",
        )


def baseline(files: SessionPaths) -> views.Stored:
    """The manifest of what the session captured (its entries made as they are looked at)."""
    try:
        return views.Stored(json.loads(files.baseline_manifest.read_text()))
    except FileNotFoundError:
        raise VmsandboxError(
            "this session has no workspace baseline", hint="it was created before workspaces existed; destroy it"
        ) from None
