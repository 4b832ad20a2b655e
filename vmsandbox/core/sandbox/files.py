"""A sandbox's files, from the host (interface.Files): each call one ssh command, the guest's side
(guestfiles.py) run as the account the file is read or written as (`runuser`), so the guest's own permissions
decide. A relative path is relative to the session's project when it has one, else to that account's home."""

from __future__ import annotations

import json
import os
import posixpath
import shlex
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import IO, Any

from vmsandbox import pids, proc
from vmsandbox.core.sandbox.guestside import CALL_TIMEOUT, SSH, guest_call, said
from vmsandbox.core.sandbox.interface import ExistsError, NotFoundError, RefusedError
from vmsandbox.core.sandbox.model import Entry, EntryType
from vmsandbox.core.sandbox.names import GuestPath, GuestUser
from vmsandbox.core.sessions import Endpoint
from vmsandbox.errors import VmsandboxError

CHUNK = 1024**2
GUEST_SIDE = "guestfiles.py"  # the guest's side of these calls (sent at each: guestside.guest_program)
IDLE = 60.0  # seconds a download waits for the guest's next bytes
ERRORS: dict[str, type[VmsandboxError]] = {"not_found": NotFoundError, "exists": ExistsError, "refused": RefusedError}


def _entry(told: Any) -> Entry:
    """An entry as the guest described it (its names are data: shown by whoever shows them); an answer that is
    not one is refused, never half-read."""
    try:
        target = told.get("target")
        return Entry(
            name=str(told["name"]), type=EntryType(told["type"]), path=str(told["path"]), size=int(told["size"]),
            mode=int(told["mode"]), permissions=str(told["permissions"]), owner=str(told["owner"]),
            group=str(told["group"]), modified=datetime.fromtimestamp(float(told["modified"]), tz=UTC),
            symlink_target=None if target is None else str(target),
        )  # fmt: skip
    except (AttributeError, KeyError, TypeError, ValueError, OverflowError, OSError):
        raise RefusedError("the guest's answer is not a file's description") from None


def _stdin(data: IO[bytes]) -> IO[bytes] | bytes:
    """What is written, as the guest's call takes it: a file streamed from its descriptor (never read whole
    here; a spooled upload goes to its disk file), else the bytes of a small one."""
    try:
        data.fileno()
    except (AttributeError, OSError, ValueError):
        return data.read()
    return data


class _Download:
    """A file's bytes as the guest sends them. `close()` ends it whatever it is doing (its ssh killed, from any
    thread), and a guest that sends nothing for IDLE seconds ends it too: no reader waits on a guest for good."""

    def __init__(self, child: proc.Child) -> None:
        self.child = child

    def __iter__(self) -> _Download:
        return self

    def __next__(self) -> bytes:
        out = self.child.stdout
        if out is None or self.child.returncode is not None:
            raise StopIteration
        ready = pids.readable(out, IDLE)
        data = os.read(out.fileno(), CHUNK) if ready else None
        if not data:
            self.close()
            if data is None:
                raise RefusedError(f"the guest sent nothing of the file for {IDLE:.0f} s", hint="read it again")
            raise StopIteration
        return data

    def close(self) -> None:
        self.child.kill()
        self.child.wait(timeout=CALL_TIMEOUT)


class GuestFiles:
    """interface.Files for one running session (`user`: the session's, for a call that names none; `workdir`:
    where a relative path starts, None: the account's home)."""

    def __init__(self, endpoint: Endpoint, user: str, workdir: str | None = None) -> None:
        self.endpoint, self.user, self.workdir = endpoint, user, workdir

    def _at(self, path: GuestPath) -> str:
        text = str(path)
        return posixpath.join(self.workdir, text) if self.workdir and not text.startswith("/") else text

    def _call(self, user: GuestUser | None, args: Sequence[str], data: IO[bytes] | None = None) -> Any:
        payload = _stdin(data) if data is not None else None
        done = guest_call(self.endpoint, args, input=payload, as_user=str(user or self.user), script=GUEST_SIDE)
        try:
            answer = json.loads(done.stdout) if done.stdout.strip() else None
        except ValueError:
            answer = None
        if done.returncode == 3 and isinstance(answer, dict) and answer.get("error") in ERRORS:
            raise ERRORS[answer["error"]](said(str(answer.get("message", "refused"))))
        if done.returncode != 0:
            raise RefusedError(f"the guest refused: {said(done.stderr) or done.returncode}")
        return answer

    def stat(self, path: GuestPath, user: GuestUser | None) -> Entry:
        return _entry(self._call(user, ["stat", self._at(path)]))

    def list_dir(self, path: GuestPath, depth: int, user: GuestUser | None) -> Sequence[Entry]:
        found = self._call(user, ["ls", self._at(path), str(max(depth, 1))])
        if not isinstance(found, list):
            raise RefusedError("the guest's answer is not a directory's listing")
        return [_entry(e) for e in found]

    def make_dir(self, path: GuestPath, user: GuestUser | None) -> Entry:
        return _entry(self._call(user, ["mkdir", self._at(path)]))

    def move(self, source: GuestPath, destination: GuestPath, user: GuestUser | None) -> Entry:
        return _entry(self._call(user, ["mv", self._at(source), self._at(destination)]))

    def remove(self, path: GuestPath, user: GuestUser | None) -> None:
        self._call(user, ["rm", self._at(path)])

    def read(self, path: GuestPath, user: GuestUser | None) -> Iterator[bytes]:
        entry = self.stat(path, user)
        if entry.type != EntryType.FILE:
            raise RefusedError(f"{entry.path} is not a file", hint="read a regular file")
        run = f"runuser -u {shlex.quote(str(user or self.user))} -- cat -- {shlex.quote(entry.path)}"
        argv = [*self.endpoint.ssh_argv(*SSH, user="root"), "--", run]
        return _Download(proc.start(argv, stderr=proc.DEVNULL))

    def write(self, path: GuestPath, user: GuestUser | None, data: IO[bytes]) -> Entry:
        return _entry(self._call(user, ["write", self._at(path)], data))
