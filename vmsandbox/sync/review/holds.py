"""What a person can review comes back by default; the rest waits for an explicit choice.

A change under a path the project itself ignores is derived or cached, not source: nobody reads a virtualenv's
site-packages or a `node_modules` tree in a review, yet tools load them on their own (a `.pth` file runs at
every Python start). So such changes are *held*: `--yes` and "apply all" leave them pending (they go to the
session's outbox with the rest), the review says in one line how many there are, and `pull --include-ignored`
brings them when the user decides so. What "ignored" means is the project's own answer, not a list of ours:

- a project with git: its `.gitignore` files and `.git/info/exclude`, as git reads them (`git check-ignore`
  in the host's repository, as the user, over the host's own ignore files — never the guest's);
- a project without git: the derived trees every ecosystem makes (below).

Binary content is not reviewable either (a diff cannot show it): a file whose first 8,000 bytes hold a NUL (git's
own test) is applied only on an explicit choice — `y` at the prompt, or `--include-binary` — never by `--yes`
alone.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from vmsandbox import ui
from vmsandbox.confine import accounts, beneath
from vmsandbox.errors import VmsandboxError
from vmsandbox.sync.git import refs
from vmsandbox.sync.land import write
from vmsandbox.sync.review.threeway import Change, Status
from vmsandbox.sync.scan import credentials
from vmsandbox.sync.scan.credentials import SCAN_LIMIT
from vmsandbox.sync.tree import manifest

if TYPE_CHECKING:
    from vmsandbox.confine.accounts import Identity
    from vmsandbox.sync.target import Target

log = logging.getLogger(__name__)

# Directories that hold what a build, a package manager or an interpreter made (projects without git).
DERIVED_DIRS = frozenset(
    {
        ".venv", "venv", "node_modules", "__pycache__", "site-packages", "dist-packages", ".eggs", ".tox",
        ".nox", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".cache", ".gradle", ".next", ".nuxt",
        ".parcel-cache", ".turbo", ".svelte-kit", "build", "dist", "target", "out", "bower_components",
    }
)  # fmt: skip
DERIVED_SUFFIXES = (".egg-info", ".pyc", ".pyo", ".class", ".o")


IGNORED = "ignored by the project (.gitignore)"  # a change's `held` for a path git ignores


def derived(path: str) -> str | None:
    """Why a path of a project without git is derived (the component that makes it so), or None."""
    for part in path.split("/"):
        if part in DERIVED_DIRS or part.endswith(DERIVED_SUFFIXES):
            return part
    return None


BINARY_PROBE = 8000  # bytes looked at, as git does


def is_binary(source: Path, rel: str) -> bool:
    """Whether the file at `rel` under source (the guest's content) starts with a NUL within BINARY_PROBE bytes;
    read beneath source (confine.beneath: no link followed)."""
    with beneath.Root.open(source) as top:
        fd = top.open_regular(rel)
    if fd is None:
        return False
    try:
        return b"\0" in os.read(fd, BINARY_PROBE)
    finally:
        os.close(fd)


def mark_held(target: Target, found: Sequence[Change], source: Path) -> None:
    """Set `held` on each change to a path the project ignores and `binary` on each binary file (UNSAFE ones are
    refused anyway); `source` holds the guest's content."""
    candidates = [c for c in found if c.status is not Status.UNSAFE]
    if not candidates:
        return
    for c in candidates:
        c.binary = (
            c.guest is not None and c.guest.kind == manifest.FILE and c.guest.size > 0 and is_binary(source, c.path)
        )
    if not refs.is_real_dir(target.project / ".git"):
        for c in candidates:
            part = derived(c.path)
            if part is not None:
                c.ignored = f"derived ({part}), not source"
        return
    # a directory is asked about as one (`dir/`): git's `name/` patterns match only directories, and the
    # guest's new directory does not exist on the host for git to look at
    asked = {c.path + "/" if c.guest is not None and c.guest.kind == manifest.DIR else c.path: c for c in candidates}
    ignored = _git_ignored(target, list(asked))
    for query, c in asked.items():
        if query in ignored:
            c.ignored = IGNORED


def mark_credentials(found: Sequence[Change], source: Path, baseline: Path) -> None:
    """Set `secret` on each text file whose guest content holds what looks like a credential (credentials.py,
    jailed) on a line the guest wrote: such a change is applied only on a person's explicit choice. And mark
    risky each file that is a pickle naming code, whatever its name or protocol (a text pickle reads as text):
    loading it runs that code."""
    contents: dict[str, bytes] = {}
    pickles: dict[str, bytes] = {}
    large: list[Change] = []
    for c in found:
        g = c.guest
        if c.status is Status.UNSAFE or g is None or g.kind != manifest.FILE or g.size == 0:
            continue
        if g.size > SCAN_LIMIT:
            large.append(c)
            continue
        data = write.read_nofollow(source, c.path, limit=SCAN_LIMIT)
        if data is None:
            continue
        if credentials.may_be_pickle(data):
            pickles[c.path] = data
        if not c.binary:
            contents[c.path] = _new_lines(data, baseline, c)
    _large_pickles(large, source)
    if not contents and not pickles:
        return
    try:
        scanned = credentials.inspect(contents, jailed=True, pickles=pickles)
        findings = scanned.findings
    except VmsandboxError as exc:  # unscanned is not clean: each waits for a person, who is told why
        log.warning("the credential scan failed: %s", exc)
        ui.warn(f"the credential scan failed ({exc.message}): the {len(contents)} text change(s) wait for your choice")
        findings = {path: [credentials.Finding(path, "not scanned (the scanner failed)")] for path in contents}
        scanned = credentials.Scanned(findings, set(pickles))  # (what may be a pickle is held as one)
    for c in found:
        if c.path in findings:
            c.secret = credentials.summary(findings[c.path])
        if c.path in scanned.pickles and c.risky is None:
            c.risky = credentials.PICKLE


def _large_pickles(large: Sequence[Change], source: Path) -> None:
    """Files past the scan's size that start like a pickle: each read whole by a scanner process of its own (up
    to PICKLE_LIMIT; past it, held unread); marked risky when one names code."""
    for c in (c for c in large if c.risky is None):
        fd = write.open_nofollow(source, c.path)
        if fd is None:
            continue
        try:
            first = os.read(fd, 1)
        finally:
            os.close(fd)
        if not credentials.may_be_pickle(first):
            continue
        data = write.read_nofollow(source, c.path, limit=credentials.PICKLE_LIMIT)
        if data is None:
            c.risky = credentials.UNREAD_PICKLE
            continue
        try:
            named = c.path in credentials.inspect({}, jailed=True, pickles={c.path: data}).pickles
        except VmsandboxError as exc:  # unread is not clean
            log.warning("the pickle check of %s failed: %s", c.path, exc)
            named = True
        if named:
            c.risky = credentials.PICKLE


def _new_lines(data: bytes, baseline: Path, c: Change) -> bytes:
    """The guest's content with the lines the baseline's file already had emptied (numbering kept): what was
    there before is not the guest's to answer for, and the scanner's time goes to what it wrote."""
    old = write.read_nofollow(baseline, c.path, limit=SCAN_LIMIT) if c.base is not None else None
    if not old:
        return data
    before = set(old.splitlines())
    return b"\n".join(b"" if line in before else line for line in data.splitlines())


def _global_ignore(who: Identity | None) -> tuple[Path, ...]:
    """The user's own ignore file (git's default `core.excludesFile`), which the jail would otherwise hide."""
    home = accounts.clean_env(who)["HOME"]
    found = Path(home) / ".config" / "git" / "ignore"
    return (found,) if found.is_file() else ()


def _git_ignored(target: Target, rel_paths: list[str]) -> set[str]:
    """The paths git ignores in the host's repository (tracked files never are). On git's failure, the derived
    trees stand in, said in the log."""
    repo = target.repository
    data = "".join(p + "\0" for p in rel_paths)
    try:
        result = repo.run("check-ignore", "-z", "--stdin", check=False, input=data, readable=_global_ignore(repo.who))
    except VmsandboxError as exc:
        log.warning("git check-ignore could not run in %s (%s): derived trees held instead", target.project, exc)
        return {p for p in rel_paths if derived(p)}
    if result.returncode not in (0, 1):  # 1: nothing is ignored
        log.warning("git check-ignore failed in %s: %s", target.project, result.stderr.strip())
        return {p for p in rel_paths if derived(p)}
    return {p for p in result.stdout.split("\0") if p}
