"""envd's Filesystem service (filesystem.Filesystem) over the backend's Files: stat, list, make, move, remove.
Watching a directory is not served (it needs events from the guest's kernel the backend does not relay)."""

from __future__ import annotations

from vmsandbox.api.envd import wire
from vmsandbox.api.envd.connect import Call, Kind, Method, RpcError
from vmsandbox.api.envd.process import reach
from vmsandbox.api.envd.wire import Message
from vmsandbox.api.threads import blocking
from vmsandbox.core.sandbox.interface import Backend, Files

SERVICE = "filesystem.Filesystem"
MAX_DEPTH = 64


class FilesystemService:
    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def methods(self) -> dict[str, Method]:
        served = {
            "Stat": self.stat,
            "MakeDir": self.make_dir,
            "Move": self.move,
            "ListDir": self.list_dir,
            "Remove": self.remove,
        }
        unserved = {"CreateWatcher": self.watch, "GetWatcherEvents": self.watch, "RemoveWatcher": self.watch}
        found = {f"/{SERVICE}/{name}": Method(Kind.UNARY, h) for name, h in (served | unserved).items()}
        found[f"/{SERVICE}/WatchDir"] = Method(Kind.SERVER_STREAM, self.watch)
        return found

    async def _files(self, call: Call) -> Files:
        return await reach(self.backend.files, call.sandbox)

    async def stat(self, call: Call, message: Message) -> Message:
        files = await self._files(call)
        found = await blocking(files.stat, wire.guest_path(message, "path"), call.user)
        return {"entry": wire.entry(found)}

    async def make_dir(self, call: Call, message: Message) -> Message:
        files = await self._files(call)
        found = await blocking(files.make_dir, wire.guest_path(message, "path"), call.user)
        return {"entry": wire.entry(found)}

    async def move(self, call: Call, message: Message) -> Message:
        source, destination = wire.guest_path(message, "source"), wire.guest_path(message, "destination")
        files = await self._files(call)
        found = await blocking(files.move, source, destination, call.user)
        return {"entry": wire.entry(found)}

    async def list_dir(self, call: Call, message: Message) -> Message:
        path = wire.guest_path(message, "path")
        depth = wire.integer(message, "depth") or 1  # envd reads 0 as 1
        if not 1 <= depth <= MAX_DEPTH:
            raise RpcError("invalid_argument", f"depth must be 1 to {MAX_DEPTH}")
        files = await self._files(call)
        found = await blocking(files.list_dir, path, depth, call.user)
        return {"entries": [wire.entry(e) for e in found]}

    async def remove(self, call: Call, message: Message) -> Message:
        files = await self._files(call)
        await blocking(files.remove, wire.guest_path(message, "path"), call.user)
        return {}

    async def watch(self, _call: Call, _message: Message) -> Message:
        raise RpcError(
            "unimplemented",
            "watching a directory is not served by vmsandbox's API",
            hint="poll with files.list, or run a watcher in the guest with commands.run",
        )
