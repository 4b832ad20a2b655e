"""The guest's commits at the end of a review: fetched into a staging namespace, reviewed like files
(review.py), promoted where they touch nothing held back."""

from __future__ import annotations

from dataclasses import dataclass

from vmsandbox.sync.git import refs, repository, review
from vmsandbox.sync.review.gather import BUNDLE, Gathered, Origin
from vmsandbox.sync.review.take import Take


@dataclass(frozen=True)
class Fetched:
    commits: list[str]  # one line per new commit under refs/remotes/vmsandbox-<name>/
    held: list[str]  # one line per branch or tag held back: its commits touch risky, ignored or binary paths
    refused: str | None = None  # refs that could not be fetched at all, and why


MOST_SHOWN = 50  # commits and files shown per ref


@dataclass(frozen=True)
class RefView:
    """A guest branch or tag as the review shows it before anything is fetched for good."""

    name: str
    commits: list[str]  # "abc1234 subject", newest first (the guest's words: escape them)
    files: list[str]  # every path its new commits touch
    held: list[str]  # "path (why)": what holds it back unless taken


def preview(g: Gathered) -> tuple[list[RefView], str | None]:
    """The guest's new or moved refs, staged, listed (commits, files, what holds them back) and dropped again;
    and why some could not be fetched. Nothing stays in the project's repository."""
    t = g.target
    if not g.refs_changed or not refs.is_real_dir(t.project / ".git"):
        return [], None
    refused = _stage(g)
    repo = t.repository
    views: list[RefView] = []
    try:
        for ref, _oid in review.staged_refs(repo, t.name):
            new = [ref, "--not", "--branches", "--tags", "--remotes"]
            log = repo.run("log", f"--max-count={MOST_SHOWN}", "--format=%h %s", *new)
            touched = repo.run("log", "--format=", "--name-only", *new, check=False)
            found = review.review(repo, ref)
            held = [f"{x.path} ({x.why})" for x in found.risky] if found else ["could not be listed"]
            files = list(dict.fromkeys(p for p in touched.stdout.splitlines() if p))[:MOST_SHOWN]
            views.append(RefView(ref.split("/", 3)[3], log.stdout.splitlines(), files, held))
    finally:
        review.drop_staged(repo, t.name)
    return views, refused


def _stage(g: Gathered) -> str | None:
    t = g.target
    if g.origin is not Origin.OUTBOX:
        return t.repository.fetch(g.source, t.files.baseline, t.name, g.tips or {})
    t.repository.fetch_bundle(t.files.outbox / BUNDLE, t.name)
    return None


def fetch_commits(g: Gathered, *, take: Take, keep_staged: bool = False) -> Fetched:
    """The guest's new or moved branches and tags, fetched into a staging namespace (repository.py; from an outbox,
    from the bundle exported earlier), reviewed like files and promoted to refs/remotes/vmsandbox-<name>/*
    where they touch nothing held back (risky, ignored, binary; unless `take` takes that kind: review.py).
    `keep_staged`: every staged ref stays (the outbox bundles them all, held ones too; the caller drops them)."""
    t = g.target
    if not g.refs_changed or not refs.is_real_dir(t.project / ".git"):
        return Fetched([], [])
    refused = _stage(g)
    repo = t.repository
    try:
        promoted, held = review.promote(repo, t.name, take=take)
    finally:
        if not keep_staged:
            review.drop_staged(repo, t.name)
    lines = repo.new_commits(repository.remote_prefix(t.name)) if promoted else []
    return Fetched(lines, held, refused)
