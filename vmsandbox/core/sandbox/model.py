"""The typed values that cross the backend interface (backend.py), in and out. Frozen, with no wire format:
the edge turns them into E2B's JSON, Connect's messages or the extension's JSON, and back."""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from vmsandbox.core.sandbox.names import (
    BlueprintName,
    Digest,
    GuestPath,
    GuestUser,
    InvalidError,
    ProjectPath,
    SessionName,
    SnapshotRef,
    Token,
)
from vmsandbox.core.views.madeby import Maker, Step

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
    """Why an item waits for an explicit choice (sync.review.plan's reasons, one word each)."""

    QUARANTINED = "quarantined"  # a place where a file turns into code that runs on the host later
    IGNORED = "ignored"  # the project ignores it: not reviewable source
    BINARY = "binary"
    SECRET = "secret"  # noqa: S105  (what looks like a credential)
    CONFLICT = "conflict"  # the host changed it too
    MASS = "mass"  # one of a mass change
    UNSAFE = "unsafe"  # can never be written (a FIFO, a symlink leaving the tree)


# The holds a choice must name in its request's `include` to be taken (what `--include-*` takes at the terminal;
# a secret is taken at the terminal only when a person chooses it): an id and a digest alone do not take them.
TAKES = {
    Badge.QUARANTINED: "--include-risky", Badge.IGNORED: "--include-ignored", Badge.BINARY: "--include-binary",
    Badge.MASS: "--include-mass", Badge.SECRET: "a person's own choice",
}  # fmt: skip


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
    made_by: tuple[Maker, ...] = ()  # who wrote it, as the guest's journal said (its word: never a reason to apply)


@dataclass(frozen=True)
class ReviewItem:
    id: Token
    path: str  # relative to the project
    kind: str  # added, deleted, modified, type changed, mode changed, repository
    status: str  # apply, conflict, merged, same, unsafe (sync.compare.Status)
    digest: Digest  # the guest's side as it was when the review was read
    holds: tuple[Hold, ...] = ()
    hunks: tuple[Hunk, ...] = ()  # a text change, block by block; empty: taken or left whole
    # what lands, beside its content (the digest binds them too): the guest side's type (file, dir, symlink, other;
    # None: deleted, or a nested repository's many paths), its permission bits as they land, a link's target
    entry_type: str | None = None
    mode: int | None = None
    target: str | None = None
    made_by: tuple[Maker, ...] = ()  # who wrote it (every writer of the file: its hunks say which wrote what)

    def untaken(self, include: Collection[Badge]) -> list[Hold]:
        """The holds on it that a choice does not take unless its request names them."""
        return [h for h in self.holds if h.badge in TAKES and h.badge not in include]


@dataclass(frozen=True)
class Review:
    """A session's changes as read once and frozen host-side: applying takes exactly this, never a second read."""

    id: Token
    session: SessionName
    made_at: datetime
    items: tuple[ReviewItem, ...]
    refused: tuple[str, ...] = ()  # what can never be written, and why
    steps: tuple[Step, ...] = ()  # the session's steps, in the order they started (what `made_by` names)
    traced: bool = False  # whether the guest's journal said who made what (its word, never a reason to apply)
    incomplete: str | None = None  # why what it said is partial


@dataclass(frozen=True)
class Choice:
    item: Token
    digest: Digest  # as the review gave it
    hunks: tuple[Token, ...] | None = None  # None: the whole item


MOST_DIGITS = 7  # an item's or a hunk's number: a review holds far fewer


def number(token: Token, kind: str = "i") -> int:
    """The number of an item's (`i3`) or a hunk's (`h0`) id, spelled exactly as the review gave it: the letter,
    then the number in ASCII digits without a leading zero. Any other spelling (`i03`, `I3`) is an InvalidError
    (400): one id, one spelling, so whatever matches ids (the check of holds) and whatever takes them (the apply)
    read the same item."""
    text = token.value
    digits = text[1:] if text[:1] == kind else ""
    canonical = digits.isascii() and digits.isdigit() and len(digits) <= MOST_DIGITS and str(int(digits)) == digits
    if not canonical:
        what = "an item" if kind == "i" else "a hunk"
        raise InvalidError(f"{text[:40]!r} is not {what} of a review", hint="use the ids the review gave, unchanged")
    return int(digits)


def check_taken(items: Sequence[ReviewItem], choices: Sequence[Choice], include: Collection[Badge]) -> None:
    """InvalidError (400) naming every chosen item held for what the request's `include` does not name, and what
    to add: a held item is taken only when asked for by its hold, as `--include-risky` asks at the terminal. Items
    are matched by their number (`number`: an id spelled otherwise is refused), as the apply takes them."""
    by_number = {number(i.id): i for i in items}
    held = [(c.item.value, by_number[n]) for c in choices if (n := number(c.item)) in by_number]
    missing = [(n, i, i.untaken(include)) for n, i in held if i.untaken(include)]
    if not missing:
        return
    kinds = sorted({h.badge.value for *_, holds in missing for h in holds})
    said = "; ".join(f"{n} ({i.path}): {', '.join(f'{h.badge.value}: {h.reason}' for h in holds)}"
                     for n, i, holds in missing[:5])  # fmt: skip
    more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
    flags = ", ".join(f"{k!r} ({TAKES[Badge(k)]} at the terminal)" for k in kinds)
    raise InvalidError(
        f"held items chosen without taking their hold: {said}{more}",
        hint=f"add {flags} to the request's include list to apply them, or leave them out",
    )


@dataclass(frozen=True)
class Refusal:
    item: Token
    reason: str


@dataclass(frozen=True)
class Applied:
    applied: tuple[Token, ...]
    refused: tuple[Refusal, ...]  # chosen but not applied (the guest changed it since, a hold, a conflict)
    left: int  # changes still pending in the session
