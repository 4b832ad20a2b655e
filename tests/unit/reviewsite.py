"""What unit tests of reviews stand on: a session's directories and project in a temporary directory (the target
a review is made for), and a file's manifest entry for given content."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from vmsandbox.paths import SessionPaths
from vmsandbox.sync.target import Target
from vmsandbox.sync.tree.manifest import FILE, Entry


def file_entry(data: bytes, mode: int = 0o644) -> Entry:
    return Entry(FILE, mode, len(data), digest=hashlib.sha256(data).hexdigest())


def made_target(tmp_path: Path) -> Target:
    files = SessionPaths(tmp_path / "session")
    for d in (files.root, files.baseline, files.guest_tree, tmp_path / "project"):
        d.mkdir(parents=True, exist_ok=True)
    return Target("s", tmp_path / "project", files, os.getuid(), os.getgid())
