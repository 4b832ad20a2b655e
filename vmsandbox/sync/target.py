"""What sync needs of a session (the session layer builds it from its record)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vmsandbox.paths import SessionPaths


@dataclass(frozen=True)
class Target:
    """What sync needs of a session (the session layer builds it from its record)."""

    name: str
    project: Path
    files: SessionPaths
    uid: int  # the invoking user: owner of what lands in the project, and who runs git in it
    gid: int
    saved: bool = False  # the VM is saved to disk (`vmsandbox stop`) and will mount its workspace again
