"""What the API needs of vmsandbox, as narrow as E2B's protocol and the extension allow: the one interface the
edge calls (`Backend`) and the two it hands out bound to one running session (`Processes`, `Files`).

Every value in is already validated (names.py: a SessionName is a session name, a GuestPath names something a
guest can name); every value out is typed data (model.py). Methods are synchronous and may block (the edge
calls them in worker threads); they raise the errors below, or any VmsandboxError with its hint, never print.

Contracts the edge relies on (E2B's SDK expects them):
- A process outlives the request that started it, the client that watched it (a disconnect loses nothing) and a
  pause/resume of its session; its output is kept until read (up to a bound) and its exit until its session
  ends, so `Processes.output` can be called again from any cursor it returned.
- `kill` ends a session the way `vmsandbox rm` does: unreviewed changes are kept in the outbox.
- A review is frozen when made: `apply` takes items of that review only, by id and digest, and refuses an item
  whose guest side changed since (the review contract).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from datetime import datetime
from typing import IO, Protocol

from vmsandbox.core.sandbox.model import (
    Applied,
    Badge,
    Checkpoint,
    Choice,
    Entry,
    Output,
    ProcessInfo,
    ProcessSpec,
    Review,
    Sandbox,
    SandboxSpec,
    Signal,
)
from vmsandbox.core.sandbox.names import CheckpointLabel, GuestPath, GuestUser, SessionName, Token
from vmsandbox.errors import VmsandboxError


class NotFoundError(VmsandboxError):
    """No such session, checkpoint, review, process or file."""


class ConflictError(VmsandboxError):
    """Not in this state: already paused, a name taken, a checkpoint limit reached."""


class NotRunningError(ConflictError):
    """The session is paused or has ended: its guest cannot be reached now."""


class ExistsError(ConflictError):
    """make_dir on something that exists."""


class RefusedError(VmsandboxError):
    """A value the backend will not act on: a path it will not name, a user the guest does not have, stdin of a
    process started without it."""


class TooLargeError(VmsandboxError):
    """More than the backend holds or reads at once (a file over the read bound, a disk full)."""


class Processes(Protocol):
    """The processes of one running session, bound to it when made (`Backend.processes`)."""

    def start(self, spec: ProcessSpec) -> int:
        """Start a process and return its pid at once; it runs on after this call returns."""
        ...

    def output(self, pid: int, cursor: int | None, wait: float) -> Output:
        """What `pid` wrote after `cursor` (None: from now on), waiting up to `wait` seconds while there is nothing
        new and it runs. A batch is bounded (a few MiB); the edge calls again from the cursor it returned."""
        ...

    def running(self) -> Sequence[ProcessInfo]:
        """The processes started through `start` that have not ended."""
        ...

    def send_input(self, pid: int, data: bytes) -> None: ...

    def close_input(self, pid: int) -> None: ...

    def signal(self, pid: int, signal: Signal) -> None: ...


class Files(Protocol):
    """The files of one running session, as `user` (None: the session's user) sees them; a relative path is
    relative to that user's home. Each call acts once; nothing is cached between calls."""

    def stat(self, path: GuestPath, user: GuestUser | None) -> Entry: ...

    def list_dir(self, path: GuestPath, depth: int, user: GuestUser | None) -> Sequence[Entry]:
        """Entries below `path`, `depth` levels down (1: its own entries)."""
        ...

    def make_dir(self, path: GuestPath, user: GuestUser | None) -> Entry:
        """mkdir -p; ExistsError if it was there already."""
        ...

    def move(self, source: GuestPath, destination: GuestPath, user: GuestUser | None) -> Entry: ...

    def remove(self, path: GuestPath, user: GuestUser | None) -> None:
        """rm -r."""
        ...

    def read(self, path: GuestPath, user: GuestUser | None) -> Iterator[bytes]:
        """The file's content in chunks (the edge has checked its size with stat first and stops at its bound)."""
        ...

    def write(self, path: GuestPath, user: GuestUser | None, data: IO[bytes]) -> Entry:
        """Create or replace the file (and its missing parents) with `data`, owned by `user`."""
        ...


class Backend(Protocol):
    """Sessions: E2B's control plane and vmsandbox's extension."""

    def create(self, spec: SandboxSpec) -> Sandbox:
        """Make and boot a session; it runs when this returns."""
        ...

    def sandboxes(self) -> Sequence[Sandbox]:
        """Every running or paused session of this account."""
        ...

    def sandbox(self, name: SessionName) -> Sandbox: ...

    def born(self, name: SessionName) -> datetime | None:
        """When the session of that name was made (its Sandbox's started_at), None if there is none: what a
        sandbox's access token is bound to, read cheaply (its record, not libvirt)."""
        ...

    def kill(self, name: SessionName) -> None:
        """End it (running or paused), keeping its unreviewed changes in the outbox; ConflictError while the run
        that made it drives it (as for pause and rollback: the core's one rule, core.sessions.not_driven)."""
        ...

    def pause(self, name: SessionName) -> None:
        """Stop it with its memory kept; ConflictError if it is not running, or while a run drives it."""
        ...

    def resume(self, name: SessionName) -> Sandbox:
        """Start a paused session where it stopped (its processes with it); a running one is left as it is."""
        ...

    def set_end(self, name: SessionName, end_at: datetime) -> None:
        """When it ends; the edge ends a running session whose time has come (`kill`)."""
        ...

    def checkpoint(self, name: SessionName, label: CheckpointLabel | None) -> Checkpoint: ...

    def checkpoints(self, name: SessionName | None) -> Sequence[Checkpoint]:
        """The checkpoints of one session, or of every session."""
        ...

    def rollback(self, name: SessionName, label: CheckpointLabel) -> Sandbox:
        """Back to a checkpoint: memory, processes and disks (unsynced work kept in rolled-back/); ConflictError
        while a run drives it."""
        ...

    def fork(self, name: SessionName, label: CheckpointLabel | None, new: SessionName, end_at: datetime) -> Sandbox:
        """A new session from one's checkpoint (None: from its state now)."""
        ...

    def review(self, name: SessionName) -> Review:
        """Read the session's changes once and freeze them host-side."""
        ...

    def reviewed(self, name: SessionName, review: Token) -> Review:
        """A review made earlier, as it was made."""
        ...

    def apply(
        self, name: SessionName, review: Token, choices: Sequence[Choice], include: Collection[Badge] = ()
    ) -> Applied:
        """Apply the chosen items (or hunks of them) of that review to the host project, exactly as reviewed. A
        chosen item held for a hold `include` does not name (model.TAKES) is an InvalidError: nothing applied."""
        ...

    def processes(self, name: SessionName) -> Processes:
        """Its processes; NotRunningError if it is paused."""
        ...

    def files(self, name: SessionName) -> Files:
        """Its files; NotRunningError if it is paused."""
        ...
