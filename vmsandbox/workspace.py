"""The workspace: the project captured on the host, a disk the guest mounts at the same path, and the mirror
of the guest's tree that reviews compare against.

Work stays on the host where it can (the guest CPU is slow under TCG): the tree is copied locally, the guest's
ext4 disk is made on the host with `mkfs.ext4 -d`, and changes come back with rsync's delta transfer into a
host-side mirror that starts as a copy of the baseline. If the VM dies, the disk is read on the host.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from vmsandbox import proc, tree
from vmsandbox.errors import VmsandboxError
from vmsandbox.paths import SessionPaths
from vmsandbox.ssh import Endpoint

HEADROOM_BYTES = 8 * 1024**3  # room for what the agent adds (dependencies, builds) on the sparse disk
BYTES_PER_INODE = 8192


def capture(project: Path, files: SessionPaths) -> tree.Manifest:
    """Snapshot the project (tracked, untracked, ignored, .git) into the session; build the workspace disk."""
    files.baseline.mkdir(mode=0o700)
    proc.run(
        ["cp", "-a", "--reflink=auto", f"{project}/.", files.baseline],
        hint="is the project readable, and is there space in the state directory?",
    )
    files.baseline.chmod(0o700)  # cp -a gave it the project's mode: keep the copy private
    manifest = tree.scan(files.baseline)
    files.baseline_manifest.write_text(json.dumps(tree.to_json(manifest)))
    used = sum(e.size for e in manifest.values())
    size = max(2 * used, used + HEADROOM_BYTES)
    inodes = max(2 * len(manifest), size // BYTES_PER_INODE)
    proc.run(
        [
            "mkfs.ext4",
            "-q",
            "-L",
            "workspace",
            "-N",
            str(inodes),
            "-E",
            "lazy_itable_init=0,lazy_journal_init=0,root_owner=0:0",
            "-d",
            files.baseline,
            files.workspace_disk,
            f"{size // 1024}k",
        ]
    )
    files.workspace_disk.chmod(0o600)  # a copy of the project: for root (and QEMU, via libvirt) only
    if "lost+found" not in manifest:
        proc.run(["debugfs", "-w", "-R", "rmdir lost+found", files.workspace_disk])
    proc.run(["cp", "-a", "--reflink=auto", files.baseline, files.guest_tree])
    files.guest_tree.chmod(0o700)
    return manifest


def baseline(files: SessionPaths) -> tree.Manifest:
    try:
        return tree.from_json(json.loads(files.baseline_manifest.read_text()))
    except FileNotFoundError:
        raise VmsandboxError(
            "this session has no workspace baseline", hint="it was created before workspaces existed; destroy it"
        ) from None


def fetch_live(endpoint: Endpoint, workdir: str, files: SessionPaths) -> tree.Manifest:
    """Bring the guest's tree into the host mirror (rsync delta over the session's SSH) and scan it.

    Runs as root in the guest so files the agent made with sudo come along. The mirror lives in the
    session directory; nothing in it is ever followed or executed, only read with lstat/O_NOFOLLOW.
    """
    proc.run(
        [
            "rsync",
            "-a",
            "--delete",
            "--no-owner",
            "--no-group",
            "--no-devices",
            "--no-specials",
            "-e",
            f"{endpoint.rsync_rsh()} -l root",
            f"{endpoint.host_alias}:{workdir.rstrip('/')}/",
            f"{files.guest_tree}/",
        ],
        hint=f"is the VM running? `vmsandbox ls`; its console: `vmsandbox logs {endpoint.session}`",
    )
    return tree.scan(files.guest_tree)


def fetch_from_disk(files: SessionPaths) -> tree.Manifest:
    """The VM is gone: read its workspace disk on the host (no mount, no loop device) into the mirror."""
    if not files.workspace_disk.exists():
        return tree.scan(files.guest_tree)
    fresh = files.root / "guest.new"
    shutil.rmtree(fresh, ignore_errors=True)
    fresh.mkdir(mode=0o700)
    # A VM that crashed left its journal unreplayed: let e2fsck replay it (exit codes 1 and 2: fixed).
    fsck = proc.run(["e2fsck", "-f", "-p", files.workspace_disk], check=False)
    if fsck.returncode > 2:
        raise VmsandboxError(
            f"the workspace disk of session {files.root.name} is damaged: {fsck.stderr.strip()}",
            hint=f"its raw image is {files.workspace_disk}; try `e2fsck` on a copy of it",
        )
    proc.run(["debugfs", "-R", f"rdump / {fresh}", files.workspace_disk])
    shutil.rmtree(files.guest_tree, ignore_errors=True)
    fresh.rename(files.guest_tree)
    return tree.scan(files.guest_tree)
