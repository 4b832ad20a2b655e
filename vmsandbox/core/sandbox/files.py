"""A sandbox's files, from the host (interface.Files): each call one ssh command, the guest's side
(supervisor.py) run as the account the file is read or written as (`runuser`), so the guest's own permissions
decide. A relative path is relative to the session's project when it has one, else to that account's home."""

from __future__ import annotations

import json
import posixpath
import shlex
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import IO, Any

from vmsandbox import proc
from vmsandbox.core.sandbox.interface import ExistsError, NotFoundError, RefusedError
from vmsandbox.core.sandbox.model import Entry, EntryType
from vmsandbox.core.sandbox.names import GuestPath, GuestUser
from vmsandbox.core.sandbox.processes import CALL_TIMEOUT, guest_call
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest.ssh import Endpoint

CHUNK = 1024**2
ERRORS: dict[str, type[VmsandboxError]] = {"not_found": NotFoundError, "exists": ExistsError, "refused": RefusedError}


def _entry(said: dict[str, Any]) -> Entry:
    return Entry(
        name=str(said["name"]), type=EntryType(said["type"]), path=str(said["path"]), size=int(said["size"]),
        mode=int(said["mode"]), permissions=str(said["permissions"]), owner=str(said["owner"]),
        group=str(said["group"]), modified=datetime.fromtimestamp(float(said["modified"]), tz=UTC),
        symlink_target=said.get("target"),
    )  # fmt: skip


class GuestFiles:
    """interface.Files for one running session (`user`: the session's, for a call that names none; `workdir`:
    where a relative path starts, None: the account's home)."""

    def __init__(self, endpoint: Endpoint, user: str, workdir: str | None = None) -> None:
        self.endpoint, self.user, self.workdir = endpoint, user, workdir

    def _at(self, path: GuestPath) -> str:
        text = str(path)
        return posixpath.join(self.workdir, text) if self.workdir and not text.startswith("/") else text

    def _call(self, user: GuestUser | None, args: Sequence[str], data: IO[bytes] | None = None) -> Any:
        payload = data.read() if data is not None else None
        done = guest_call(self.endpoint, args, input=payload, as_user=str(user or self.user))
        try:
            said = json.loads(done.stdout) if done.stdout.strip() else None
        except ValueError:
            said = None
        if done.returncode == 3 and isinstance(said, dict) and said.get("error") in ERRORS:
            raise ERRORS[said["error"]](str(said.get("message", "refused"))[:300])
        if done.returncode != 0:
            raise RefusedError(f"the guest refused: {done.stderr.strip()[-300:] or done.returncode}")
        return said

    def stat(self, path: GuestPath, user: GuestUser | None) -> Entry:
        return _entry(self._call(user, ["stat", self._at(path)]))

    def list_dir(self, path: GuestPath, depth: int, user: GuestUser | None) -> Sequence[Entry]:
        return [_entry(e) for e in self._call(user, ["ls", self._at(path), str(max(depth, 1))])]

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
        child = proc.start([*self.endpoint.ssh_argv("-T", user="root"), "--", run])
        try:
            if child.stdout is not None:
                while data := child.stdout.read(CHUNK):
                    yield data
        finally:
            child.kill()
            child.wait(timeout=CALL_TIMEOUT)

    def write(self, path: GuestPath, user: GuestUser | None, data: IO[bytes]) -> Entry:
        return _entry(self._call(user, ["write", self._at(path)], data))
