"""A stand-in guest for the API's tests: a directory under tmp is its filesystem, host processes are its processes.

A guest path `/a/b` is `ROOT/a/b`; a relative one is relative to the guest user's home (`ROOT/home/user`). A path
that resolves outside ROOT (a symlink out) is refused, as a backend refuses a path it will not name. Processes
run as local subprocesses in their own process group, with the guest's home as HOME and their cwd mapped the same
way; the commands the tests send use relative paths only, so they touch nothing outside tmp. Their output is
kept whole (a list of chunks; a cursor is an index into it), their exit kept after they end.

These are the one place unit tests start subprocesses: the real Popen is taken before conftest forbids it.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import shutil
import signal as signals
import stat
import subprocess
import threading
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from vmsandbox.core.sandbox.interface import ExistsError, NotFoundError, RefusedError
from vmsandbox.core.sandbox.model import Chunk, Entry, EntryType, Exit, Output, ProcessInfo, ProcessSpec, Signal, Stream
from vmsandbox.core.sandbox.names import GuestPath, GuestUser

REAL_POPEN = subprocess.Popen  # taken at import, before the autouse fixture replaces it
HOME = "/home/user"
USERS = ("user", "root")
BATCH = 64  # chunks per output() answer
READ = 4096


class Guest:
    """One sandbox's filesystem root."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / HOME.lstrip("/")).mkdir(parents=True, exist_ok=True)

    def host(self, path: GuestPath, *, follow: bool = True) -> Path:
        """Where a guest path is here; RefusedError if it resolves outside the guest."""
        text = path.normal()
        absolute = text if path.absolute else f"{HOME}/{text}"
        found = self.root / absolute.lstrip("/")
        resolved = found.resolve() if follow else found.parent.resolve() / found.name
        if not resolved.is_relative_to(self.root.resolve()):
            raise RefusedError(f"{path} leads outside what the guest can name", hint="name a path inside the guest")
        return resolved

    def guest_path(self, host: Path) -> str:
        return "/" + str(host.relative_to(self.root.resolve())) if host != self.root.resolve() else "/"


def check_user(user: GuestUser | None) -> None:
    if user is not None and user.value not in USERS:
        raise RefusedError(f"the guest has no account {user.value!r}", hint="use `user` or `root`")


class FakeFiles:
    def __init__(self, guest: Guest) -> None:
        self.guest = guest

    def _entry(self, host: Path) -> Entry:
        try:
            st = host.lstat()
        except FileNotFoundError:
            raise NotFoundError(f"no such file or directory: {self.guest.guest_path(host)}") from None
        kind = (
            EntryType.SYMLINK
            if stat.S_ISLNK(st.st_mode)
            else EntryType.DIR
            if stat.S_ISDIR(st.st_mode)
            else EntryType.FILE
            if stat.S_ISREG(st.st_mode)
            else EntryType.OTHER
        )
        return Entry(
            name=host.name,
            type=kind,
            path=self.guest.guest_path(host),
            size=st.st_size,
            mode=st.st_mode & 0o7777,
            permissions=stat.filemode(st.st_mode),
            owner=pwd.getpwuid(st.st_uid).pw_name,
            group=grp.getgrgid(st.st_gid).gr_name,
            modified=datetime.fromtimestamp(st.st_mtime, UTC),
            symlink_target=str(host.readlink()) if kind is EntryType.SYMLINK else None,
        )

    def stat(self, path: GuestPath, user: GuestUser | None) -> Entry:
        check_user(user)
        return self._entry(self.guest.host(path, follow=False))

    def list_dir(self, path: GuestPath, depth: int, user: GuestUser | None) -> Sequence[Entry]:
        check_user(user)
        top = self.guest.host(path)
        if not top.is_dir():
            raise NotFoundError(f"no directory {path}")
        found: list[Entry] = []

        def walk(d: Path, level: int) -> None:
            for child in sorted(d.iterdir()):
                found.append(self._entry(child))
                if level < depth and child.is_dir() and not child.is_symlink():
                    walk(child, level + 1)

        walk(top, 1)
        return found

    def make_dir(self, path: GuestPath, user: GuestUser | None) -> Entry:
        check_user(user)
        host = self.guest.host(path)
        if host.exists():
            raise ExistsError(f"{path} exists")
        host.mkdir(parents=True)
        return self._entry(host)

    def move(self, source: GuestPath, destination: GuestPath, user: GuestUser | None) -> Entry:
        check_user(user)
        old, new = self.guest.host(source, follow=False), self.guest.host(destination, follow=False)
        if not old.exists() and not old.is_symlink():
            raise NotFoundError(f"no such file or directory: {source}")
        new.parent.mkdir(parents=True, exist_ok=True)
        old.rename(new)
        return self._entry(new)

    def remove(self, path: GuestPath, user: GuestUser | None) -> None:
        check_user(user)
        host = self.guest.host(path, follow=False)
        if host.is_dir() and not host.is_symlink():
            shutil.rmtree(host)
        elif host.exists() or host.is_symlink():
            host.unlink()
        else:
            raise NotFoundError(f"no such file or directory: {path}")

    def read(self, path: GuestPath, user: GuestUser | None) -> Iterator[bytes]:
        check_user(user)
        host = self.guest.host(path)
        if not host.is_file():
            raise NotFoundError(f"no such file: {path}")
        f = host.open("rb")

        def chunks() -> Iterator[bytes]:
            with f:
                while data := f.read(READ):
                    yield data

        return chunks()

    def write(self, path: GuestPath, user: GuestUser | None, data: IO[bytes]) -> Entry:
        check_user(user)
        host = self.guest.host(path)
        host.parent.mkdir(parents=True, exist_ok=True)
        with host.open("wb") as out:
            shutil.copyfileobj(data, out)
        return self._entry(host)


class Running:
    """One process: its output as chunks, its exit once it ended."""

    def __init__(self, spec: ProcessSpec, popen: subprocess.Popen[bytes]) -> None:
        self.spec = spec
        self.popen = popen
        self.chunks: list[Chunk] = []
        self.exit: Exit | None = None
        self.changed = threading.Condition()
        self.readers = [self._read(popen.stdout, Stream.STDOUT), self._read(popen.stderr, Stream.STDERR)]
        self.waiter = threading.Thread(target=self._wait, daemon=True)
        self.waiter.start()
        if spec.timeout:
            timer = threading.Timer(spec.timeout, self.signal, (Signal.KILL,))
            timer.daemon = True
            timer.start()

    def _read(self, pipe: IO[bytes] | None, stream: Stream) -> threading.Thread:
        def pump() -> None:
            assert pipe is not None
            while data := pipe.read1(READ):  # type: ignore[attr-defined]
                with self.changed:
                    self.chunks.append(Chunk(stream, data))
                    self.changed.notify_all()

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        return reader

    def _wait(self) -> None:
        code = self.popen.wait()
        for reader in self.readers:
            reader.join()
        for pipe in (self.popen.stdin, self.popen.stdout, self.popen.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        if code < 0:
            name = "killed" if -code == signals.SIGKILL else signals.Signals(-code).name.lower()
            end = Exit(-1, f"signal: {name}")
        else:
            end = Exit(code, f"exit status {code}")
        with self.changed:
            self.exit = end
            self.changed.notify_all()

    def output(self, cursor: int | None, wait: float) -> Output:
        with self.changed:
            at = len(self.chunks) if cursor is None else cursor
            self.changed.wait_for(lambda: len(self.chunks) > at or self.exit is not None, timeout=wait)
            batch = tuple(self.chunks[at : at + BATCH])
            after = at + len(batch)
            done = self.exit if after == len(self.chunks) else None
            return Output(batch, after, done)

    def signal(self, sig: Signal | int) -> None:
        if self.popen.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, int(sig))


class FakeProcesses:
    def __init__(self, guest: Guest, envs: dict[str, str]) -> None:
        self.guest = guest
        self.envs = envs
        self.table: dict[int, Running] = {}

    def start(self, spec: ProcessSpec) -> int:
        check_user(spec.user)
        cwd = self.guest.host(spec.cwd or GuestPath(HOME))
        home = self.guest.host(GuestPath(HOME))
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8"}
        popen = REAL_POPEN(
            [spec.cmd, *spec.args],
            cwd=cwd,
            env=env | self.envs | dict(spec.envs),
            stdin=subprocess.PIPE if spec.stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.table[popen.pid] = Running(spec, popen)
        return popen.pid

    def _one(self, pid: int) -> Running:
        found = self.table.get(pid)
        if found is None:
            raise NotFoundError(f"no process {pid}")
        return found

    def output(self, pid: int, cursor: int | None, wait: float) -> Output:
        return self._one(pid).output(cursor, wait)

    def running(self) -> Sequence[ProcessInfo]:
        return [ProcessInfo(pid, r.spec) for pid, r in self.table.items() if r.exit is None]

    def send_input(self, pid: int, data: bytes) -> None:
        stdin = self._one(pid).popen.stdin
        if stdin is None or stdin.closed:
            raise RefusedError(f"process {pid} takes no input", hint="start it with stdin=True")
        stdin.write(data)
        stdin.flush()

    def close_input(self, pid: int) -> None:
        stdin = self._one(pid).popen.stdin
        if stdin is not None:
            stdin.close()

    def signal(self, pid: int, signal: Signal) -> None:
        found = self._one(pid)
        if found.exit is not None:
            raise NotFoundError(f"process {pid} has ended")
        found.signal(signal)

    def each(self, sig: int) -> None:
        """Every running process gets `sig` (SIGSTOP on pause, SIGCONT on resume, SIGKILL at the end)."""
        for r in self.table.values():
            r.signal(sig)

    def end(self) -> None:
        """Kill every process and wait until each is reaped and its pipes closed."""
        self.each(signals.SIGKILL)
        self.each(signals.SIGCONT)
        for r in self.table.values():
            r.waiter.join()
