"""Push: host edits made during the session sent into the guest, never over a change the guest made."""

from __future__ import annotations

import contextlib
import json
import os
import stat
from pathlib import Path

from vmsandbox import failpoint, filewrite, ui
from vmsandbox.confine import accounts, beneath
from vmsandbox.guest.ssh import Endpoint
from vmsandbox.sync.fetch import delta, mirror, rsync
from vmsandbox.sync.inward import capture
from vmsandbox.sync.review.threeway import Status, compare, is_git_managed
from vmsandbox.sync.target import Target
from vmsandbox.sync.tree import manifest, placeholders
from vmsandbox.sync.tree.hashcache import HashCache


def push(target: Target, endpoint: Endpoint, *, limit: int) -> tuple[list[str], list[str]]:
    """Send host edits made since the baseline into the running guest at endpoint. A path the guest also
    changed is not touched (reported as a conflict). Pushed paths become the new baseline. Returns (pushed,
    conflicts)."""
    files = target.files
    base = dict(capture.baseline(files))
    with ui.step("Fetching the guest's changes"):
        guest = mirror.fetch_live(endpoint, str(target.project), files, base, max_file_bytes=limit).view
    host = manifest.scan(target.project, cache=HashCache.load(target.files.hashes("project")))
    # the same three-way view with the roles swapped: the host is the side whose changes travel
    changes = [c for c in compare(base, guest, host) if not is_git_managed(c.path)]
    send = [c for c in changes if c.status is Status.APPLY]
    conflicts = [c.path for c in changes if c.status is Status.CONFLICT]
    if send:
        remote = str(target.project).rstrip("/") + "/"
        # the host side reads the user's project as the user; the guest's rsync never talks to root here
        side = rsync.Side(target.owner, accounts.GIT_LIMITS, target.project)
        with ui.step(f"Pushing {len(send)} host change(s) into the guest"):
            failpoint.hit("push.send")
            rsync.rsync(
                endpoint,
                [
                    "-a",
                    "--relative",
                    "--delete-missing-args",
                    "--files-from=-",
                    "--from0",
                    f"--chown={target.uid}:{target.gid}",
                ],
                remote,
                f"{endpoint.host_alias}:{remote}",
                side=side,
                expect_sender=False,
                remote_path=remote,
                input=b"".join(c.path.encode("utf-8", "surrogateescape") + b"\0" for c in send),
            )
        # placeholders stand for the baseline's data: those about to change there get it first
        placeholders.fill(files.guest_tree, files.baseline, base, [c.path for c in send])
        for c in send:  # the pushed state is what both sides now agree on
            _copy_entry(target.project, files.baseline, c.path)
            if c.host is None:
                base.pop(c.path, None)
            else:
                base[c.path] = c.host
        delta.forget(files.root)  # it was against the old baseline: the next pull reads the whole mirror
        filewrite.write_atomically(files.baseline_manifest, json.dumps(manifest.to_json(base)))
    return [c.path for c in send], conflicts


def _copy_entry(src_root: Path, dst_root: Path, rel: str) -> None:
    """The host's entry at `rel` (or its absence) copied into the baseline, beneath both (confine.beneath): a link on
    either side, at any depth, is copied or removed as a link, never followed (root never deletes or writes through
    a link the project holds, such as a directory the host made a link before its contents were copied)."""
    with beneath.Root.open(src_root, follow=True) as src, beneath.Root.open(dst_root) as dst:
        with contextlib.suppress(OSError, beneath.Outside):
            dst.remove(rel)
        st = src.lstat(rel)
        if st is None:
            return
        if stat.S_ISLNK(st.st_mode):
            target = src.readlink(rel)
            if target is not None:
                dst.replace(rel, lambda fd, tmp: os.symlink(target, tmp, dir_fd=fd), mode=0o755)
        elif stat.S_ISDIR(st.st_mode):
            fd, name = dst.parent(rel, mode=0o755)
            try:
                os.mkdir(name, 0o700, dir_fd=fd)
                made = os.open(name, beneath.DIR_FLAGS, dir_fd=fd)
            finally:
                os.close(fd)
            try:
                _settle(made, st)
            finally:
                os.close(made)
        elif (data := src.open_regular(rel, st)) is not None:
            try:
                dst.replace(rel, lambda fd, tmp: _copy_file(data, fd, tmp, st), mode=0o755)
            finally:
                os.close(data)


def _copy_file(src: int, dir_fd: int, name: str, st: os.stat_result) -> None:
    out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        while os.copy_file_range(src, out, manifest.CHUNK):
            pass
        _settle(out, st)
    finally:
        os.close(out)


def _settle(fd: int, st: os.stat_result) -> None:
    """The mode and times of `st` on what fd is (as a copy keeps them)."""
    os.fchmod(fd, stat.S_IMODE(st.st_mode))
    os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))
