"""Provenance as data: a session's steps, the processes that wrote in its workspace, and for each changed file
which writer made each line of the guest's version and removed each line of the baseline's.

Everything but a step's command, times and exit code is the guest's word: a lying guest can only mislabel its own
changes. Shown to a person, never a reason to apply or hold anything.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

USAGE = ("versions_bytes", "paths", "writers", "processes")
BOUNDS = {"versions_bytes": 32 * 1024**2, "paths": 200_000, "writers": 100_000, "processes": 200_000}  # provenance.c
OUTSIDE = "outside"  # what a process no step started wrote (a daemon, a timer, a login nobody registered)
UNTRACED = "untraced"  # the group of what no writer was named for (front ends group by step id, OUTSIDE or it)
RESERVED = frozenset({OUTSIDE, UNTRACED})  # never a step's id (a guest naming one so would take over that group)

# badges: why a person should look twice at who wrote a hunk (kinds of writer, by property, not by name)
OUTSIDE_ANY_STEP = "outside any step"
STARTED_BY_A_PROGRAM = "started by a program"  # not the command typed: a program it ran started this one
INSTALL_SCRIPT = "install script"  # a package's install or build script (npm lifecycle, build backend, build.rs)
GIT_HOOK = "git hook"
UNNAMED = "unnamed writer"  # the journal could not say which process (it ended first, or its records were full)


@dataclass(frozen=True)
class Step:
    """One thing the session was asked to do: `exec`/`run`/`shell`/an API or MCP command, kept by the host."""

    id: str  # [a-z0-9]{1,32}, the host's
    command: str  # as typed (argv joined as a shell would read it; "shell" for an interactive shell)
    started: float  # epoch seconds
    ended: float | None = None  # None: still running (or the host died first)
    exit: int | None = None
    how: str = "exec"  # exec, run, shell, api, mcp, agent
    egress: tuple[str, ...] = ()  # the requests the egress proxy logged while it ran ("allowed GET host/path")

    def as_json(self) -> dict[str, Any]:
        return {"step": self.id, "command": self.command, "started": self.started, "ended": self.ended,
                "exit": self.exit, "how": self.how, "egress": list(self.egress)}  # fmt: skip


@dataclass(frozen=True)
class Writer:
    """A process that changed the workspace, as the guest's journal named it."""

    id: int  # the journal's number for it (unique in one answer)
    pid: int
    step: str  # the step it belongs to by ancestry (a step's id), or OUTSIDE
    depth: int | None  # 0: the step's own command; 1: a process that command started; ... None: not known
    exe: str  # its executable ("" when not known)
    argv: tuple[str, ...]  # () when not known
    role: str = ""  # what the guest's environment said it was: "npm:postinstall", "git-hook", "build-backend",
    # "build-script" (cargo), or ""

    @property
    def badges(self) -> tuple[str, ...]:
        found: list[str] = []
        if self.step == OUTSIDE:
            found.append(OUTSIDE_ANY_STEP)
        if self.role.startswith(("npm:", "build-backend", "build-script")):
            found.append(INSTALL_SCRIPT)
        if self.role == "git-hook":
            found.append(GIT_HOOK)
        if self.depth is not None and self.depth >= 2 and not found:
            found.append(STARTED_BY_A_PROGRAM)
        if not self.argv and not self.exe:
            found.append(UNNAMED)
        return tuple(found)

    def as_json(self) -> dict[str, Any]:
        return {"step": self.step, "pid": self.pid, "argv": list(self.argv), "exe": self.exe, "role": self.role,
                "depth": self.depth, "badges": list(self.badges)}  # fmt: skip


@dataclass(frozen=True)
class FileOrigin:
    """Who changed one file: every writer the journal saw on it, and (a text file whose versions were kept) the
    writer of each line of the guest's version and of each removal of a baseline line."""

    writers: tuple[int, ...]  # writer ids, in the order they first wrote it
    lines: tuple[int | None, ...] | None = None  # per line of the guest's version: who wrote it (None: as in
    # the baseline, or not known); None: no line-level answer (not text, too large, versions not kept)
    removed: Mapping[int, int] = field(default_factory=dict)  # baseline line index -> writer who removed it
    incomplete: str | None = None  # why this file's provenance is partial ("versions not kept: over 256 KiB")


@dataclass(frozen=True)
class Provenance:
    steps: tuple[Step, ...]
    writers: Mapping[int, Writer]
    files: Mapping[str, FileOrigin]  # by the change's path
    incomplete: str | None = None  # why the whole answer is partial (the journal restarted, records full, no
    # answer: "the guest's journal did not answer"), None when complete
    guest_word: bool = True  # always: shown as reported by the guest
    usage: tuple[int, ...] = ()  # the journal's own figures when it answered: bytes of versions kept, paths,
    # writers, processes followed (USAGE names them; bounded in the guest by BOUNDS)

    def step(self, step_id: str) -> Step | None:
        return self._by_id.get(step_id)

    @functools.cached_property
    def _by_id(self) -> dict[str, Step]:
        """Each step by its id, made once (a frozen dataclass without slots keeps it in its __dict__)."""
        return {s.id: s for s in reversed(self.steps)}  # (the first of an id, as a scan would find)


@dataclass(frozen=True)
class Maker:
    """One writer of a hunk, as front ends show it."""

    step: str  # a step's id, or OUTSIDE
    command: str  # the step's command ("" outside any step)
    argv: tuple[str, ...]
    exe: str
    badges: tuple[str, ...]

    def as_json(self) -> dict[str, Any]:
        return {"step": self.step, "command": self.command, "argv": list(self.argv), "exe": self.exe,
                "badges": list(self.badges)}  # fmt: skip
