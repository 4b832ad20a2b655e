"""What does not go into the VM: paths the project's `.vmsandboxignore` names (gitignore syntax), and files
that look like credentials, named before boot (credentials.py) and left out unless the user sends them.

Both are taken out of the session's copy of the project (the baseline) before the workspace disk is made from
it, so the guest never has them; the project itself is not touched. A pull later sees them as files the host
has and the baseline does not: a guest that writes one is a conflict, never an overwrite.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Collection
from pathlib import Path

import pathspec

from vmsandbox.confine import beneath
from vmsandbox.sync.review.holds import DERIVED_DIRS
from vmsandbox.sync.scan import credentials
from vmsandbox.sync.scan.credentials import Finding
from vmsandbox.sync.tree import manifest as tree

IGNORE_FILE = ".vmsandboxignore"
CONTENT_LIMIT = 64 * 1024  # files scanned for credentials going in (config files, not data)
MOST_SCANNED = 2000  # a project's files scanned at most (by name, every file is looked at)
SCANNED_SUFFIXES = (
    ".env", ".yaml", ".yml", ".json", ".toml", ".ini", ".cfg", ".conf", ".properties", ".xml", ".sh", ".txt",
    ".py", ".js", ".ts", ".rb", ".go", ".tf", ".config", ".pem", ".key", ".crt",
)  # fmt: skip
SKIPPED_DIRS = frozenset({".git", *DERIVED_DIRS})


def ignore_spec(project: Path) -> pathspec.GitIgnoreSpec | None:
    """The project's `.vmsandboxignore`, or None."""
    try:
        text = (project / IGNORE_FILE).read_text(errors="replace")
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    return pathspec.GitIgnoreSpec.from_lines(text.splitlines())


def ignored(manifest: tree.Tree, spec: pathspec.GitIgnoreSpec) -> list[str]:
    """The manifest's paths the spec matches (a matched directory stands for everything below it)."""
    out: list[str] = []
    for path in sorted(manifest):
        if any(path.startswith(top + "/") for top in out[-1:]):
            continue
        shown = path + "/" if manifest[path].kind == tree.DIR else path
        if spec.match_file(shown):
            out.append(path)
    return out


def remove(baseline: Path, manifest: tree.Manifest, left_out: Collection[str]) -> int:
    """Take `left_out` (paths of the manifest, files or whole directories) out of the baseline copy and its
    manifest; the number of entries removed. Removed beneath the baseline (confine.beneath): never through a
    link."""
    removed = 0
    with beneath.Root.open(baseline) as copy:
        for path in sorted(left_out):
            if manifest.get(path) is None:
                continue
            copy.remove(path)
            below = [p for p in manifest if p == path or p.startswith(path + "/")]
            for p in below:
                del manifest[p]
            removed += len(below)
    return removed


def credentials_in(project: Path) -> list[Finding]:
    """Files of the project that look like credentials: by name (all of them), by content (small text files
    of the kinds tokens are pasted into, outside `.git` and derived trees). The user's own files: scanned
    without a jail."""
    found: list[Finding] = []
    contents: dict[str, bytes] = {}
    for top, dirs, files in os.walk(project):  # never follows links
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        rel_top = os.path.relpath(top, project)
        for name in sorted(files):
            rel = name if rel_top == "." else f"{rel_top}/{name}"
            named = credentials.by_name(rel)
            if named is not None:
                found.append(named)
            elif len(contents) < MOST_SCANNED and (name.endswith(SCANNED_SUFFIXES) or name.startswith(".env")):
                data = _small_text(Path(top) / name)
                if data is not None:
                    contents[rel] = data
    for path, findings in sorted(credentials.scan(contents, jailed=False).items()):
        found.append(Finding(path, credentials.summary(findings).removeprefix("looks like a credential: ")))
    return sorted(found, key=lambda f: f.path)


def _small_text(path: Path) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = tree.read_at_most(fd, CONTENT_LIMIT)
    finally:
        os.close(fd)
    return data if data is not None and b"\0" not in data else None
