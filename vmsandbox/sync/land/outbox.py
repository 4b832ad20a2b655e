"""The outbox: where the changes of a session wait when its VM goes away before they were synced, so nothing is
lost. It holds the pending changes (manifest.json, the changed files, changes.patch), the guest's commits as
git.bundle, and refused.json, a record of what can never be written and why. `recover` reviews from it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from vmsandbox import failpoint, ui
from vmsandbox.errors import VmsandboxError
from vmsandbox.sync.git import refs, review
from vmsandbox.sync.git.fetch import fetch_commits
from vmsandbox.sync.land import write
from vmsandbox.sync.review import gather
from vmsandbox.sync.review.diff import diff_text
from vmsandbox.sync.review.gather import (
    BUNDLE,
    OUTBOX_FILES,
    OUTBOX_MANIFEST,
    OUTBOX_PATCH,
    OUTBOX_REFUSED,
    Gathered,
    Origin,
)
from vmsandbox.sync.review.take import Take
from vmsandbox.sync.review.threeway import Status
from vmsandbox.sync.tree.manifest import DIR, FILE, SYMLINK


def fresh_box(parent: Path, label: str) -> Path:
    """PARENT/LABEL-TIME, never one that exists (an export replaces its box): where a rollback keeps what it
    would otherwise lose."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    box, n = parent / f"{label}-{stamp}", 1
    while box.exists():
        n += 1
        box = parent / f"{label}-{stamp}-{n}"
    return box


def export(g: Gathered, *, box: Path | None = None) -> Path:
    """Keep every pending change in the outbox (manifest, the changed files, a patch, the git bundle), and a
    record of the refused ones (what they were and why they can never be written). `box`: another directory
    of the same layout instead (a rollback's)."""
    files = g.target.files
    todo = gather.pending(g)
    box = box or files.outbox
    box.parent.mkdir(mode=0o700, exist_ok=True)
    staging = box.with_name(box.name + ".new")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(mode=0o700)
    (staging / OUTBOX_FILES).mkdir(mode=0o700)
    keeper = write.Owner(os.geteuid(), os.getegid())
    manifest: dict[str, Any] = {}
    for c in write.order(todo):
        failpoint.hit("export.item")
        manifest[c.path] = c.guest.as_dict() if c.guest else None
        if c.guest is None:
            continue
        if c.guest.kind == FILE:
            write.copy_verified(g.source, staging / OUTBOX_FILES, c.path, c.guest, keeper)
        elif c.guest.kind == SYMLINK and c.guest.target is not None:
            write.write_symlink(staging / OUTBOX_FILES, c.path, c.guest.target, keeper)
        elif c.guest.kind == DIR:
            write.make_dir(staging / OUTBOX_FILES, c.path, c.guest.mode, keeper)
    refused = [
        {"path": c.path, "why": c.notes[0] if c.notes else "", "entry": c.guest.as_dict() if c.guest else None}
        for c in g.changes
        if c.status is Status.UNSAFE
    ]
    (staging / OUTBOX_MANIFEST).write_text(json.dumps(manifest, indent=1))
    (staging / OUTBOX_REFUSED).write_text(json.dumps(refused, indent=1))
    (staging / OUTBOX_PATCH).write_text("".join(diff_text(g, c) for c in todo))
    t = g.target
    if g.origin is not Origin.OUTBOX and g.refs_changed and refs.is_real_dir(t.project / ".git"):
        try:  # the reviewed commits go into the project's refs/remotes now; all of them into a bundle for later
            fetch_commits(g, take=Take(), keep_staged=True)
            t.repository.bundle(staging / BUNDLE, t.name)
        except VmsandboxError as exc:
            ui.warn(f"could not keep the guest's commits: {exc.message}")
        finally:
            with contextlib.suppress(VmsandboxError):
                review.drop_staged(t.repository, t.name)
    elif g.origin is Origin.OUTBOX and (box / BUNDLE).exists():
        shutil.copyfile(box / BUNDLE, staging / BUNDLE)
    if box.exists() and box != staging:
        shutil.rmtree(box)
    staging.rename(box)
    return box
