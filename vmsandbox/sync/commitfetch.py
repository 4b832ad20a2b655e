"""The guest's commits at the end of a review: fetched into a staging namespace, reviewed like files
(commitreview.py), promoted where they touch nothing held back."""

from __future__ import annotations

from dataclasses import dataclass

from vmsandbox import confine
from vmsandbox.sync import commitreview, commits, refs
from vmsandbox.sync.changes import BUNDLE, Gathered, Origin
from vmsandbox.sync.take import Take


@dataclass(frozen=True)
class Fetched:
    commits: list[str]  # one line per new commit under refs/remotes/vmsandbox-<name>/
    held: list[str]  # one line per branch or tag held back: its commits touch risky, ignored or binary paths
    refused: str | None = None  # refs that could not be fetched at all, and why


def fetch_commits(g: Gathered, *, take: Take, keep_staged: bool = False) -> Fetched:
    """The guest's new or moved branches and tags, fetched into a staging namespace (commits.py; from an outbox,
    from the bundle exported earlier), reviewed like files and promoted to refs/remotes/vmsandbox-<name>/*
    where they touch nothing held back (risky, ignored, binary; unless `take` takes that kind: commitreview.py).
    `keep_staged`: every staged ref stays (the outbox bundles them all, held ones too; the caller drops them)."""
    t = g.target
    if not g.refs_changed or not refs.is_real_dir(t.project / ".git"):
        return Fetched([], [])
    refused = None
    if g.origin is not Origin.OUTBOX:
        refused = commits.fetch(t.project, g.source, t.files.baseline, t.name, t.uid, t.gid)
    else:
        commits.fetch_bundle(t.project, t.files.outbox / BUNDLE, t.name, t.uid, t.gid)
    who = confine.invoking_user(t.uid, t.gid)
    try:
        promoted, held = commitreview.promote(t.project, who, t.name, take=take)
    finally:
        if not keep_staged:
            commitreview.drop_staged(t.project, who, t.name)
    lines = commits.new_commits(t.project, who, commits.remote_prefix(t.name)) if promoted else []
    return Fetched(lines, held, refused)
