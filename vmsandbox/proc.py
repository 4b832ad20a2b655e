"""The one chokepoint for subprocesses: argv lists only, logged, missing tools mapped to packages."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from vmsandbox import packages
from vmsandbox.confine import seccomp
from vmsandbox.confine.accounts import Identity, Limits
from vmsandbox.confine.jail import Jail
from vmsandbox.errors import VmsandboxError

log = logging.getLogger(__name__)


TAIL_CHARS = 2000  # what an error shows of a command's output, at most (the end of its last lines)


@dataclass(frozen=True)
class Result:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


class CommandError(VmsandboxError):
    """A command exited non-zero; carries the command, its exit code and the tail of its stderr."""

    def __init__(self, result: Result, *, hint: str | None = None) -> None:
        tail = tail_of(result.stderr, lines=8)
        super().__init__(
            f"`{shlex.join(result.argv)}` failed with exit code {result.returncode}" + (f": {tail}" if tail else ""),
            hint=hint,
        )
        self.result = result


def tail_of(output: str, *, lines: int, chars: int = TAIL_CHARS) -> str:
    """The end of a command's output as an error shows it: its last lines, and of them its last characters (one
    line of output may be hundreds of kB: a registry's answer)."""
    tail = "\n".join(output.strip().splitlines()[-lines:])
    return tail if len(tail) <= chars else "…" + tail[-chars:]


def which(tool: str) -> str:
    """Full path of `tool`, or a VmsandboxError naming the package that provides it."""
    found = shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin:/usr/bin:/bin")
    if found is None:
        package = packages.TOOL_PACKAGES.get(tool, tool)
        raise VmsandboxError(
            f"`{tool}` is not installed",
            hint=f"install it with `apt-get install {package}`",
        )
    return found


PIPE, DEVNULL = subprocess.PIPE, subprocess.DEVNULL
MAX_OUTPUT = 16 * 1024**2  # what is kept of a child's stdout and of its stderr: guest output has no bound
TRUNCATED = "\n[... output truncated by vmsandbox ...]\n"
Child = subprocess.Popen[bytes]  # what `start` returns and `finish` waits for


def run(
    argv: Sequence[str | Path],
    *,
    check: bool = True,
    input: str | bytes | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float | None = None,
    hint: str | None = None,
    as_user: Identity | None = None,
    limits: Limits | None = None,
    pass_fds: Sequence[int] = (),
    max_output: int = MAX_OUTPUT,
    on_line: Callable[[str], None] | None = None,
    jail: Jail | None = None,
) -> Result:
    """Run argv (never a shell string) and capture its output (at most `max_output` bytes of each stream);
    `on_line` sees each line of either stream as it comes (a long build's progress under its spinner).

    The child runs in its own process group; if we are interrupted (Ctrl-C, SIGTERM turned into
    SystemExit, a timeout) the whole group is terminated before the exception goes on, so no
    grandchild keeps writing into a directory we are about to remove. With `as_user` the child switches to
    that account (after changing into `cwd`) and with `limits` it runs under those resource limits; its
    process group is killed when it ends, so nothing it started outlives it. With `jail` it runs in bubblewrap
    (jail.py): the system's programs and the jail's own paths only, no network, its own PID namespace.
    """
    data = input.encode() if isinstance(input, str) else input
    stdin = subprocess.PIPE if data is not None else subprocess.DEVNULL
    child = start(argv, stdin=stdin, env=env, cwd=cwd, as_user=as_user, limits=limits, pass_fds=pass_fds, jail=jail)
    confined = as_user is not None or limits is not None or jail is not None
    return finish(
        child, input=data, check=check, timeout=timeout, hint=hint, max_output=max_output, reap_group=confined,
        on_line=on_line,
    )  # fmt: skip


def start(
    argv: Sequence[str | Path],
    *,
    stdin: int | IO[Any] | None = subprocess.DEVNULL,
    stdout: int | IO[Any] | None = subprocess.PIPE,
    stderr: int | IO[Any] | None = subprocess.PIPE,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    as_user: Identity | None = None,
    limits: Limits | None = None,
    pass_fds: Sequence[int] = (),
    jail: Jail | None = None,
) -> subprocess.Popen[bytes]:
    """Start argv in its own process group (stderr captured unless told otherwise: a caller that reads only
    stdout passes DEVNULL, so a full stderr pipe never stalls the child); `finish` collects it. For the rare
    caller that must wire two processes together or stream what a child says; everyone else uses `run`."""
    args = [str(a) for a in argv]
    args[0] = which(args[0])
    filter_fd: int | None = None
    if jail is not None:
        filter_fd = seccomp.memfd()
        if filter_fd is None:
            log.warning("no seccomp table for this machine's architecture: the jail runs without its filter")
        else:
            pass_fds = (*pass_fds, filter_fd)
        args = jail.argv(args, cwd, seccomp_fd=filter_fd)
        args[0] = which(args[0])
    log.debug("run: %s%s", shlex.join(args), f" (as uid {as_user.uid})" if as_user else "")
    try:
        return subprocess.Popen(
            args,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_child_setup(limits),  # noqa: PLW1509 - prctl and setrlimit only, no locks taken
            pass_fds=tuple(pass_fds),
            **_identity(as_user),
        )
    finally:
        if filter_fd is not None:
            os.close(filter_fd)


def finish(
    child: subprocess.Popen[bytes],
    *,
    input: bytes | None = None,
    check: bool = True,
    timeout: float | None = None,
    hint: str | None = None,
    max_output: int = MAX_OUTPUT,
    reap_group: bool = False,
    on_line: Callable[[str], None] | None = None,
) -> Result:
    """Wait for a child from `start`, keeping at most `max_output` bytes of each stream. On any interruption
    its process group is killed; with `reap_group` also when it ends, so nothing it started outlives it
    (not for ssh, whose connection-sharing master is meant to stay)."""
    args = [str(a) for a in child.args]  # type: ignore[union-attr]
    try:
        stdout, stderr = _communicate(child, input, timeout, max_output, on_line)
    except subprocess.TimeoutExpired as exc:
        _kill_group(child)
        raise VmsandboxError(f"`{shlex.join(args)}` did not finish within {timeout or 0:.0f} s", hint=hint) from exc
    except BaseException:
        _kill_group(child)
        raise
    if reap_group:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)  # whatever it left running in its group
    result = Result(
        argv=tuple(args),
        returncode=child.returncode,
        stdout=stdout.decode(errors="replace"),
        stderr=stderr.decode(errors="replace"),
    )
    if check and result.returncode != 0:
        raise CommandError(result, hint=hint)
    return result


def _identity(who: Identity | None) -> dict[str, Any]:
    if who is None:
        return {}
    return {"user": who.uid, "group": who.gid, "extra_groups": list(who.groups)}


def _child_setup(limits: Limits | None) -> Callable[[], None]:
    def setup() -> None:
        _die_with_parent()
        if limits is not None:
            limits.apply()

    return setup


class _Sink:
    """One stream of a child: at most `cap` bytes kept (the rest read and dropped, so the child never blocks
    on a full pipe), each complete line handed to `on_line` as it arrives."""

    def __init__(self, cap: int, on_line: Callable[[str], None] | None) -> None:
        self.buf, self.cut, self.partial = bytearray(), False, b""
        self.cap, self.on_line = cap, on_line

    def drain(self, stream: IO[bytes]) -> None:
        while chunk := stream.read1(65536):  # type: ignore[attr-defined]
            room = self.cap - len(self.buf)
            self.buf += chunk[: max(room, 0)]
            self.cut |= len(chunk) > room
            if self.on_line is not None:
                *lines, partial = (self.partial + chunk).split(b"\n")
                self.partial = partial[-4096:]
                for line in lines:
                    self.on_line(line.decode(errors="replace").rstrip("\r"))
        stream.close()

    def value(self) -> bytes:
        return bytes(self.buf) + (TRUNCATED.encode() if self.cut else b"")


def _communicate(
    child: subprocess.Popen[bytes],
    data: bytes | None,
    timeout: float | None,
    cap: int,
    on_line: Callable[[str], None] | None = None,
) -> tuple[bytes, bytes]:
    """Like Popen.communicate, with each stream kept to `cap` bytes and its lines shown to `on_line`."""
    sinks = [_Sink(cap, on_line), _Sink(cap, on_line)]

    streams = [s for s in (child.stdout, child.stderr) if s is not None]

    def feed(stream: IO[bytes]) -> None:
        with contextlib.suppress(BrokenPipeError, OSError):
            stream.write(data or b"")
        with contextlib.suppress(BrokenPipeError, OSError):
            stream.close()

    threads = [threading.Thread(target=sinks[i].drain, args=(st,), daemon=True) for i, st in enumerate(streams)]
    if child.stdin is not None:
        threads.append(threading.Thread(target=feed, args=(child.stdin,), daemon=True))
    for t in threads:
        t.start()
    deadline = None if timeout is None else time.monotonic() + timeout
    child.wait(timeout=timeout)
    for t in threads:
        t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if t.is_alive():  # something the child started still holds its output open
            raise subprocess.TimeoutExpired(child.args, timeout or 0)
    out, err = (sink.value() for sink in sinks)
    return (out, err) if child.stdout is not None else (b"", out)


def run_attached(argv: Sequence[str | Path], *, env: Mapping[str, str] | None = None) -> int:
    """Run argv sharing our terminal (stdin, stdout, stderr); return its exit code."""
    args = [str(a) for a in argv]
    args[0] = which(args[0])
    log.debug("run_attached: %s", shlex.join(args))
    child = subprocess.Popen(
        args,
        env=dict(env) if env is not None else None,
        preexec_fn=_die_with_parent,  # noqa: PLW1509 - only calls prctl
    )
    try:
        return child.wait()
    except BaseException:
        # Ctrl-C reached the child through the terminal; give it a moment to finish on its own.
        try:
            child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        raise


def own_module(module: str, *args: str) -> list[str]:
    """The command line of one of vmsandbox's own modules run as a program: isolated (`-I`: neither the working
    directory, which may be a project's, nor PYTHON* variables put anything on its import path; a project's
    `ctypes.py` or `signal.py` must never be imported by a process that starts as root)."""
    return [sys.executable, "-I", "-m", module, *args]


def spawn_detached(
    argv: Sequence[str | Path], *, log_file: Path, env: Mapping[str, str] | None = None, stdin: bytes | None = None
) -> int:
    """Start a background daemon that outlives us (its own session, stdout and stderr to log_file; `stdin`, if
    given, written to its stdin, which is then closed: a few kB, within what a pipe holds)."""
    args = [str(a) for a in argv]
    args[0] = which(args[0])
    log.debug("spawn_detached: %s", shlex.join(args))
    fd = os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "ab") as out:
        child = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            start_new_session=True,
            cwd="/",  # a daemon holds no project directory (nor imports from one)
        )
    if child.stdin is not None:
        with child.stdin:
            child.stdin.write(stdin or b"")
    return child.pid


_PR_SET_PDEATHSIG = 1


def reap(child: subprocess.Popen[bytes], timeout: float) -> int:
    """Wait for a child that was told to end; past `timeout` seconds it (and its group) is killed. Its exit code."""
    try:
        return child.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(child)
        return child.wait()


def _die_with_parent() -> None:
    """In the child: get SIGTERM if vmsandbox dies, even by SIGKILL (no cleanup handler runs then)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _kill_group(child: subprocess.Popen[bytes]) -> None:
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, sig)
        try:
            child.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
        return
