"""What sync needs of a session (the session layer builds it from its record)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from vmsandbox.confine.accounts import Identity, invoking_user
from vmsandbox.paths import SessionPaths
from vmsandbox.sync.git.repository import Repository


@dataclass(frozen=True)
class Target:
    """What sync needs of a session (the session layer builds it from its record)."""

    name: str
    project: Path
    files: SessionPaths
    uid: int  # the invoking user: owner of what lands in the project, and who runs git in it
    gid: int
    saved: bool = False  # the VM is saved to disk (`vmsandbox stop`) and will mount its workspace again

    @functools.cached_property
    def owner(self) -> Identity | None:
        """Who the project's files and repository belong to, asked once (None: who runs vmsandbox already)."""
        return invoking_user(self.uid, self.gid)

    @functools.cached_property
    def repository(self) -> Repository:
        """The project's git repository, as its owner works in it."""
        return Repository(self.project, self.owner)
