"""The typed values that cross the backend interface (backend.py), in and out. Frozen, with no wire format:
the edge turns them into E2B's JSON, Connect's messages or the extension's JSON, and back."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from vmsandbox.core.sandbox.names import (
    BlueprintName,
    Digest,
    GuestPath,
    GuestUser,
    ProjectPath,
    SessionName,
    SnapshotRef,
    Token,
)

# --- sessions (E2B: sandboxes) ---


class State(enum.StrEnum):
    RUNNING = "running"
    PAUSED = "paused"  # stopped with its memory kept (`vmsandbox stop`): its processes come back on resume


@dataclass(frozen=True)
class SandboxSpec:
    """A session to make: from a blueprint, on a project (captured as `vmsandbox run PATH` does) or on none."""

    name: SessionName  # chosen by the edge (E2B lets the server name it)
    blueprint: BlueprintName
    project: ProjectPath | None
    end_at: datetime  # when it ends unless set_end moves it (its changes kept in the outbox)
    envs: Mapping[str, str] = field(default_factory=dict)  # every process's environment starts with these
    metadata: Mapping[str, str] = field(default_factory=dict)  # kept and listed, never interpreted


NO_END = datetime(9999, 12, 31, tzinfo=UTC)  # the end of a sandbox that has none: paused, or a person's own


@dataclass(frozen=True)
class Sandbox:
    name: SessionName
    blueprint: str
    state: State
    started_at: datetime
    end_at: datetime
    cpus: int
    memory_mib: int
    disk_mib: int
    metadata: Mapping[str, str] = field(default_factory=dict)
    project: str | None = None  # the host project it was captured from
    timed: bool = True  # whether the API keeps its end: a session started at the terminal has none (end_at far)


@dataclass(frozen=True)
class Checkpoint:
    snapshot: SnapshotRef
    taken_at: datetime


# --- processes ---


class Signal(enum.IntEnum):
    TERM = 15
    KILL = 9


class Stream(enum.StrEnum):
    STDOUT = "stdout"
    STDERR = "stderr"


@dataclass(frozen=True)
class ProcessSpec:
    cmd: str  # the program (E2B's SDK sends /bin/bash with `-l -c COMMAND` as args)
    args: tuple[str, ...] = ()
    envs: Mapping[str, str] = field(default_factory=dict)
    cwd: GuestPath | None = None  # None: the user's home
    user: GuestUser | None = None  # None: the session's user
    stdin: bool = False  # False: its stdin is /dev/null
    tag: str | None = None
    timeout: float | None = None  # killed (SIGKILL) this long after it starts, whoever is connected; None: never


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    spec: ProcessSpec


@dataclass(frozen=True)
class Chunk:
    stream: Stream
    data: bytes


@dataclass(frozen=True)
class Exit:
    code: int  # its exit code; -1 when a signal ended it
    status: str  # how it ended, as a person reads it: "exit status 1", "signal: killed"
    error: str | None = None  # why it could not run at all


@dataclass(frozen=True)
class Output:
    """What a process wrote after a cursor, in order, and the cursor after it. `exit` is set once the process
    has ended and this batch holds the last of its output."""

    chunks: tuple[Chunk, ...]
    cursor: int
    exit: Exit | None = None


# --- files ---


class EntryType(enum.StrEnum):
    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"
    OTHER = "other"  # a FIFO, socket or device: listed as E2B lists what it cannot type


@dataclass(frozen=True)
class Entry:
    name: str
    type: EntryType
    path: str  # absolute, in the guest
    size: int
    mode: int  # st_mode's permission bits (and setuid/setgid/sticky)
    permissions: str  # as `ls -l` shows them: "-rw-r--r--"
    owner: str
    group: str
    modified: datetime
    symlink_target: str | None = None


# --- reviews (vmsandbox's extension) ---


class Badge(enum.StrEnum):
    """Why an item waits for an explicit choice (sync.plan's reasons, one word each)."""

    QUARANTINED = "quarantined"  # a place where a file turns into code that runs on the host later
    IGNORED = "ignored"  # the project ignores it: not reviewable source
    BINARY = "binary"
    SECRET = "secret"  # noqa: S105  (what looks like a credential)
    CONFLICT = "conflict"  # the host changed it too
    MASS = "mass"  # one of a mass change
    UNSAFE = "unsafe"  # can never be written (a FIFO, a symlink leaving the tree)


@dataclass(frozen=True)
class Hold:
    badge: Badge
    reason: str


@dataclass(frozen=True)
class Hunk:
    id: Token
    old_start: int  # 1-based, as a unified diff counts
    old_lines: tuple[str, ...]
    new_start: int
    new_lines: tuple[str, ...]


@dataclass(frozen=True)
class ReviewItem:
    id: Token
    path: str  # relative to the project
    kind: str  # added, deleted, modified, type changed, mode changed, repository
    status: str  # apply, conflict, merged, same, unsafe (sync.compare.Status)
    digest: Digest  # the guest's side as it was when the review was read
    holds: tuple[Hold, ...] = ()
    hunks: tuple[Hunk, ...] = ()  # a text change, block by block; empty: taken or left whole


@dataclass(frozen=True)
class Review:
    """A session's changes as read once and frozen host-side: applying takes exactly this, never a second read."""

    id: Token
    session: SessionName
    made_at: datetime
    items: tuple[ReviewItem, ...]
    refused: tuple[str, ...] = ()  # what can never be written, and why


@dataclass(frozen=True)
class Choice:
    item: Token
    digest: Digest  # as the review gave it
    hunks: tuple[Token, ...] | None = None  # None: the whole item


@dataclass(frozen=True)
class Refusal:
    item: Token
    reason: str


@dataclass(frozen=True)
class Applied:
    applied: tuple[Token, ...]
    refused: tuple[Refusal, ...]  # chosen but not applied (the guest changed it since, a hold, a conflict)
    left: int  # changes still pending in the session
