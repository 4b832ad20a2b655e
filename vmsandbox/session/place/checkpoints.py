"""A session's checkpoints as data, wherever the place keeps what they hold: each is a directory in the session's
with its record (checkpoint.json: label, time, the chain of overlays the system disk read then); on this machine
that directory also holds memory.save and workspace.raw (local.disks), on another host volumes do
(remote.checkpoint). Taking, rolling back and removing them is session.moments.checkpoint's."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmsandbox import filewrite, paths, ui
from vmsandbox.errors import VmsandboxError

MEMORY = "memory.save"
WORKSPACE = "workspace.raw"
META = "checkpoint.json"
MOST = 16  # checkpoints a session keeps


@dataclass(frozen=True)
class Checkpoint:
    label: str
    created: float
    chain: list[str]  # the overlays the system disk read then, oldest first; the last is frozen for this one
    path: Path
    live: bool = False  # taken while the VM ran on: its memory holds the workspace frozen (guest.freeze)

    @property
    def overlay(self) -> str:
        return self.chain[-1]

    @property
    def memory(self) -> Path:
        return self.path / MEMORY

    @property
    def workspace(self) -> Path:
        return self.path / WORKSPACE

    def size(self) -> int:
        """Bytes on disk: the saved memory, the workspace copy and the frozen overlay."""
        kept = (self.memory, self.workspace, self.path.parent.parent / self.overlay)
        return sum(f.stat().st_blocks * 512 for f in kept if f.exists())

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, "created": self.created, "overlay": self.overlay, "bytes": self.size()}

    def write(self) -> None:
        data: dict[str, Any] = {"label": self.label, "created": self.created, "chain": self.chain}
        if self.live:
            data["live"] = True
        filewrite.write_atomically(self.path / META, json.dumps(data, indent=1))


def listed(files: paths.SessionPaths) -> list[Checkpoint]:
    """The session's checkpoints, oldest first (ones being taken, `.tmp-*`, are not)."""
    found = []
    if files.checkpoints.is_dir():
        for d in files.checkpoints.iterdir():
            if d.name.startswith(".") or not (d / META).is_file():
                continue
            try:
                data = json.loads((d / META).read_text())
                live = data.get("live", False) is True
                found.append(Checkpoint(str(data["label"]), float(data["created"]), list(data["chain"]), d, live))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                ui.warn(f"checkpoint {d} is damaged ({exc}); `rm -r` it to drop it")
    return sorted(found, key=lambda c: c.created)


def unread(files: paths.SessionPaths, found: list[Checkpoint]) -> set[str]:
    """The checkpoint directories not among `found` (what `listed` gave: it skips, and says, the damaged ones)."""
    if not files.checkpoints.is_dir():
        return set()
    read = {c.path.name for c in found}
    return {d.name for d in files.checkpoints.iterdir() if d.is_dir() and not d.name.startswith(".")} - read


def find(files: paths.SessionPaths, name: str, label: str) -> Checkpoint:
    for c in listed(files):
        if c.label == label:
            return c
    labels = ", ".join(c.label for c in listed(files)) or "none"
    raise VmsandboxError(
        f"session {name} has no checkpoint {label!r} (it has: {labels})",
        hint=f"`vmsandbox checkpoint create {name} LABEL` takes one",
    )
