"""What does not go into the VM: paths the project's `.vmsandboxignore` names (gitignore syntax), and files
that look like credentials, named before boot (credentials.py) and left out unless the user sends them.

Both are taken out of the session's copy of the project (the baseline) before the workspace disk is made from
it, so the guest never has them; the project itself is not touched. A pull later sees them as files the host
has and the baseline does not: a guest that writes one is a conflict, never an overwrite.

Under sudo root reads here only what the person could (confine.rights): the ignore file from the copy their own
process made, the credential scan from the project's descriptor, into what their rights let them read.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Collection
from pathlib import Path

import pathspec

from vmsandbox.confine import beneath, rights
from vmsandbox.confine.accounts import Identity
from vmsandbox.errors import VmsandboxError
from vmsandbox.sync.review.holds import DERIVED_DIRS
from vmsandbox.sync.scan import credentials
from vmsandbox.sync.scan.credentials import Finding
from vmsandbox.sync.tree import manifest

IGNORE_FILE = ".vmsandboxignore"
CONTENT_LIMIT = 64 * 1024  # files scanned for credentials going in (config files, not data)
MOST_SCANNED = 2000  # a project's files scanned at most (by name, every file is looked at)
SCANNED_SUFFIXES = (
    ".env", ".yaml", ".yml", ".json", ".toml", ".ini", ".cfg", ".conf", ".properties", ".xml", ".sh", ".txt",
    ".py", ".js", ".ts", ".rb", ".go", ".tf", ".config", ".pem", ".key", ".crt",
)  # fmt: skip
SKIPPED_DIRS = frozenset({".git", *DERIVED_DIRS})
IGNORE_LIMIT = 4 * 1024**2  # an ignore file, at most


def ignore_spec(copy: Path, project: Path | None = None) -> pathspec.GitIgnoreSpec | None:
    """The `.vmsandboxignore` at the top of `copy` (the capture's copy of the project, named `project` to the
    person), or None. A link to a file of the project is read there; one that leads out of it, or through another
    link, is refused: what it would name is not known, and leaving nothing out is not what the person meant."""
    shown = (project or copy) / IGNORE_FILE
    with beneath.Root.open(copy) as top:
        st = top.lstat(IGNORE_FILE)
        if st is None:
            return None
        rel = IGNORE_FILE
        if stat.S_ISLNK(st.st_mode):
            rel = top.readlink(IGNORE_FILE) or ""
            try:
                beneath.split(rel)
            except beneath.Outside:
                raise VmsandboxError(
                    f"{shown} is a link that leads out of the project, or back up ({rel})",
                    hint=f"make it a file of the project (`cp --remove-destination {rel} {shown}`)",
                ) from None
            if top.lstat(rel) is None:
                return None  # (a link to nothing: no ignore file)
        data = top.read(rel, limit=IGNORE_LIMIT)
    if data is None:
        raise VmsandboxError(
            f"{shown} cannot be read as an ignore file: it is not a regular file of the project (or over "
            f"{IGNORE_LIMIT // 1024**2} MiB)",
            hint="make it a plain file of patterns (gitignore syntax)",
        )
    return pathspec.GitIgnoreSpec.from_lines(data.decode(errors="replace").splitlines())


def ignored(entries: manifest.Tree, spec: pathspec.GitIgnoreSpec) -> list[str]:
    """The manifest's paths the spec matches (a matched directory stands for everything below it)."""
    out: list[str] = []
    for path in sorted(entries):
        if any(path.startswith(top + "/") for top in out[-1:]):
            continue
        shown = path + "/" if entries[path].kind == manifest.DIR else path
        if spec.match_file(shown):
            out.append(path)
    return out


def remove(baseline: Path, entries: manifest.Manifest, left_out: Collection[str]) -> int:
    """Take `left_out` (paths of the manifest, files or whole directories) out of the baseline copy and its
    manifest; the number of entries removed. Removed beneath the baseline (confine.beneath): never through a
    link."""
    removed = 0
    with beneath.Root.open(baseline) as copy:
        for path in sorted(left_out):
            if entries.get(path) is None:
                continue
            copy.remove(path)
            below = [p for p in entries if p == path or p.startswith(path + "/")]
            for p in below:
                del entries[p]
            removed += len(below)
    return removed


def credentials_in(project: Path) -> list[Finding]:
    """Files of the project that look like credentials: by name (all of them), by content (small text files
    of the kinds tokens are pasted into, outside `.git` and derived trees). The user's own files: scanned
    without a jail, from the project's descriptor (no link followed); under sudo only where the person may read."""
    who = rights.person()
    found: list[Finding] = []
    contents: dict[str, bytes] = {}
    with beneath.Root.open(project) as top:
        if who is not None and not rights.may(top.fd, who, rights.LIST):
            return []  # (their copy fails at the top: it says so)
        for rel_top, dirs, files, fd in top.walk():
            kept = (d for d in dirs if d not in SKIPPED_DIRS)
            dirs[:] = sorted(d for d in kept if who is None or rights.may_at(fd, d, who, rights.LIST))
            for name in sorted(files):
                rel = f"{rel_top}/{name}" if rel_top else name
                named = credentials.by_name(rel)
                if named is not None:
                    found.append(named)
                elif len(contents) < MOST_SCANNED and (name.endswith(SCANNED_SUFFIXES) or name.startswith(".env")):
                    data = _small_text(fd, name, who)
                    if data is not None:
                        contents[rel] = data
    for path, findings in sorted(credentials.scan(contents, jailed=False).items()):
        found.append(Finding(path, credentials.summary(findings).removeprefix("looks like a credential: ")))
    return sorted(found, key=lambda f: f.path)


def _small_text(dir_fd: int, name: str, who: Identity | None) -> bytes | None:
    """The file `name` of dir_fd if it is small text (never through a link); under sudo, if the person may read it."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (who is not None and not rights.may(fd, who, rights.READ, st)):
            return None
        data = manifest.read_at_most(fd, CONTENT_LIMIT)
    finally:
        os.close(fd)
    return data if data is not None and b"\0" not in data else None
