"""The guest's changes: gathered from where they are, compared three ways, and remembered once dealt with.

Where the changes come from, in order: the session's outbox (exported when its VM went away), the running VM
(its tree fetched into the host mirror), or the workspace disk of a VM that died or was stopped (mounted in a
reader VM, and fetched from there the same way: the host never parses the disk). The session layer says which
(it knows whether the VM runs, and starts the reader) and hands over a Target: what sync needs of a session.
What was applied or otherwise dealt with is recorded (decisions.json), so a change is reviewed once and an
interrupted pull can simply run again.
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmsandbox import failpoint, filewrite, ui
from vmsandbox.confine import beneath
from vmsandbox.guest.ssh import Endpoint
from vmsandbox.paths import SessionPaths
from vmsandbox.sync.fetch import delta, mirror
from vmsandbox.sync.git import refs
from vmsandbox.sync.inward import capture
from vmsandbox.sync.land import write
from vmsandbox.sync.provenance import attribute
from vmsandbox.sync.provenance.model import Provenance
from vmsandbox.sync.review import holds, merge
from vmsandbox.sync.review.threeway import Change, Status, compare
from vmsandbox.sync.target import Target
from vmsandbox.sync.tree import manifest, views
from vmsandbox.sync.tree.hashcache import HashCache

log = logging.getLogger(__name__)

OUTBOX_MANIFEST = "manifest.json"
OUTBOX_REFUSED = "refused.json"  # changes that can never be written, kept as a record (path, why, entry)
OUTBOX_FILES = "files"
OUTBOX_PATCH = "changes.patch"
BUNDLE = "git.bundle"


class Origin(enum.StrEnum):
    OUTBOX = "outbox"  # exported when the VM went away
    LIVE = "live"  # fetched from the running VM
    DISK = "disk"  # read from a dead VM's workspace disk


@dataclass
class Gathered:
    target: Target
    changes: list[Change]  # the guest's changes against the baseline (SAME ones left out)
    source: Path  # where the guest's content is read from
    refs_changed: bool  # the guest added or moved branches or tags (its commits can be fetched)
    origin: Origin
    git_refused: str | None  # why the guest's repository is not read at all
    limit: int  # the sync budget: bytes a pull writes at most (and the largest file the mirror takes)
    # the guest's new or moved branches and tags (name -> commit) as read: its commits are fetched at these
    # tips, never at the refs of a later moment (None: from the outbox's bundle, or no repository to read)
    tips: dict[str, str] | None = None
    provenance: Provenance | None = None  # who wrote what, as the guest's journal said (sync/provenance)

    @property
    def project(self) -> Path:
        return self.target.project


def gather(target: Target, *, endpoint: Endpoint | None, limit: int, disk: bool = False) -> Gathered:
    """The guest's changes against the baseline and the host: from the outbox if there is one, else from the
    running VM at `endpoint` (with `disk`: the reader VM of a dead VM's workspace disk), else (no endpoint: the
    workspace disk is gone too) from the mirror as the last fetch left it."""
    files = target.files
    base, guest, scope, source, origin = fetch(target, endpoint=endpoint, limit=limit, disk=disk)
    failpoint.hit("run.gather")
    # Only the paths where the guest's tree differs from the baseline are compared, and the host's side is
    # read only there (and where a guest's symlink leads): the project is not walked, but for its links (no
    # content read) when a change makes or removes one (risk.judge_links).
    cache = HashCache.load(files.hashes("project"))
    host = views.Lookup(target.project, cache)
    with beneath.Root.open(target.project, follow=True) as project:  # names compared as its file system does
        found = compare(base, host, guest, only=scope, host_links=project.links, fold=project.folds())
    changes = [c for c in found if c.status is not Status.SAME]
    cache.save(partial=True)
    merge.merge_all(changes, baseline=files.baseline, host=target.project, guest=source)
    holds.mark_held(target, changes, source)
    holds.mark_credentials(changes, source, files.baseline)
    _remove_leftover_temporaries(target.project, changes)
    tips, refused = _guest_refs(files, origin)
    refs_changed = bool(tips) if tips is not None else (files.outbox / BUNDLE).exists()
    asked = endpoint if origin is Origin.LIVE else None  # (no journal answers for a disk or an outbox)
    prov = attribute.for_review(files, changes, source, asked)
    return Gathered(target, changes, source, refs_changed, origin, refused, limit, tips, prov)


Fetched = tuple[manifest.Tree, manifest.Tree, frozenset[str], Path, Origin]


def fetch(target: Target, *, endpoint: Endpoint | None, limit: int, disk: bool = False) -> Fetched:
    """The baseline, the guest's tree, the paths where they differ, where the guest's content is read from and
    where it came from (see gather)."""
    files = target.files
    base = capture.baseline(files)
    guest: manifest.Tree
    if files.outbox.is_dir():
        kept = json.loads((files.outbox / OUTBOX_MANIFEST).read_text())
        guest = delta.view(base, {p: None if e is None else manifest.Entry.from_dict(e) for p, e in kept.items()})
        scope, source, origin = frozenset(kept), files.outbox / OUTBOX_FILES, Origin.OUTBOX
    elif endpoint is not None and not disk:
        with ui.step("Fetching the guest's changes"):
            fetched = mirror.fetch_live(endpoint, str(target.project), files, base, max_file_bytes=limit)
        guest, scope, source, origin = fetched.view, fetched.differs, files.guest_tree, Origin.LIVE
        log.info("session %s: %s", target.name, fetched.how)
    else:
        why = "the VM is stopped" if target.saved else "the VM is not running"
        if endpoint is None:
            fetched = mirror.fetch_nothing(files, base, f"{why} and its workspace disk is gone", max_file_bytes=limit)
        else:
            with ui.step("Fetching the guest's changes from its workspace disk (mounted in the reader VM)"):
                workdir = str(target.project)
                fetched, unread = mirror.fetch_from_disk(endpoint, workdir, files, base, max_file_bytes=limit, why=why)
            if unread:
                shown = "; ".join(unread[:3])  # (ui.warn escapes the guest's names)
                more = f" (and {len(unread) - 3} more)" if len(unread) > 3 else ""
                ui.warn(
                    f"part of the workspace disk could not be read (the guest left it damaged, or made it so): "
                    f"{shown}{more}. What could be read is reviewed; what could not is left out"
                )
        guest, scope, source, origin = fetched.view, fetched.differs, files.guest_tree, Origin.DISK
    return base, guest, scope, source, origin


def _guest_refs(files: SessionPaths, origin: Origin) -> tuple[dict[str, str] | None, str | None]:
    """The guest's new or moved branches and tags (None: from the outbox, whose bundle holds them), and why its
    repository is refused (if it is)."""
    if origin is Origin.OUTBOX:
        return None, None
    if not refs.is_real_dir(files.baseline / ".git"):
        return {}, None  # the project had no repository of its own
    try:
        refs.check_guest_gitdir(files.guest_tree / ".git")
        guest_refs = refs.read_refs(files.guest_tree / ".git")
    except refs.Refused as exc:
        return {}, exc.message
    return refs.changed_refs(refs.read_refs(files.baseline / ".git"), guest_refs), None


def _remove_leftover_temporaries(project: Path, changes: list[Change]) -> None:
    """A pull killed with SIGKILL can leave its temporary files (never the target files) behind, next to the
    paths it was writing: those the guest changed, which are changes still."""
    for where in sorted({c.path.rpartition("/")[0] for c in changes}):
        fd = manifest.open_dir_under(project, where)
        if fd is None:
            continue
        try:
            for name in os.listdir(fd):  # noqa: PTH208 - an fd reached without following symlinks
                if not name.startswith(write.TMP_PREFIX):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    if stat.S_ISREG(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                        os.unlink(name, dir_fd=fd)
        finally:
            os.close(fd)


# ---------------------------------------------------------------- what was dealt with


def _decided(files: SessionPaths) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(files.decisions.read_text())
    except FileNotFoundError:
        return {}
    return data


def mark(files: SessionPaths, changes: Iterable[Change]) -> None:
    """Remember these changes as dealt with (applied, or kept beside as conflicts)."""
    decided = _decided(files)
    for c in changes:
        decided[c.path] = c.guest.as_dict() if c.guest else None
    filewrite.write_atomically(files.decisions, json.dumps(decided))


def pending(g: Gathered) -> list[Change]:
    """Changes nobody has dealt with yet. UNSAFE ones can never be applied: they are reported, not pending."""
    decided = _decided(g.target.files)
    out = []
    for c in g.changes:
        if c.status is Status.UNSAFE:
            continue
        if c.path in decided and decided[c.path] == (c.guest.as_dict() if c.guest else None):
            continue
        out.append(c)
    return out
