"""Push: host edits made during the session sent into the guest, never over a change the guest made."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from vmsandbox import failpoint, paths, ui
from vmsandbox.confine import accounts as confine
from vmsandbox.guest.ssh import Endpoint
from vmsandbox.sync.fetch import delta, mirror
from vmsandbox.sync.fetch import rsync as transfer
from vmsandbox.sync.inward import capture
from vmsandbox.sync.review.compare import Status, compare, is_git_managed
from vmsandbox.sync.target import Target
from vmsandbox.sync.tree import manifest as tree
from vmsandbox.sync.tree import placeholders
from vmsandbox.sync.tree.hashcache import HashCache


def push(target: Target, endpoint: Endpoint, *, limit: int) -> tuple[list[str], list[str]]:
    """Send host edits made since the baseline into the running guest at endpoint. A path the guest also
    changed is not touched (reported as a conflict). Pushed paths become the new baseline. Returns (pushed,
    conflicts)."""
    files = target.files
    base = dict(capture.baseline(files))
    with ui.step("Fetching the guest's changes"):
        guest = mirror.fetch_live(endpoint, str(target.project), files, base, max_file_bytes=limit).view
    host = tree.scan(target.project, cache=HashCache.load(target.files.hashes("project")))
    # the same three-way view with the roles swapped: the host is the side whose changes travel
    changes = [c for c in compare(base, guest, host) if not is_git_managed(c.path)]
    send = [c for c in changes if c.status is Status.APPLY]
    conflicts = [c.path for c in changes if c.status is Status.CONFLICT]
    if send:
        remote = str(target.project).rstrip("/") + "/"
        # the host side reads the user's project as the user; the guest's rsync never talks to root here
        side = transfer.Side(target.owner, confine.GIT_LIMITS, target.project)
        with ui.step(f"Pushing {len(send)} host change(s) into the guest"):
            failpoint.hit("push.send")
            transfer.rsync(
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
        paths.write_atomically(files.baseline_manifest, json.dumps(tree.to_json(base)))
    return [c.path for c in send], conflicts


def _copy_entry(src_root: Path, dst_root: Path, rel: str) -> None:
    src, dst = src_root / rel, dst_root / rel
    if dst.is_dir() and not dst.is_symlink():
        shutil.rmtree(dst)
    else:
        dst.unlink(missing_ok=True)
    if not src.exists() and not src.is_symlink():
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_symlink():
        dst.symlink_to(os.readlink(src))  # noqa: PTH115 - exact target
    elif src.is_dir():
        dst.mkdir()
        shutil.copystat(src, dst)
    else:
        shutil.copy2(src, dst)
