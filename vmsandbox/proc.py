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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from vmsandbox.errors import VmsandboxError

log = logging.getLogger(__name__)

# Which Debian package provides each tool we run. A missing tool is reported with its package.
TOOL_PACKAGES: Mapping[str, str] = {
    "qemu-img": "qemu-utils",
    "qemu-system-x86_64": "qemu-system-x86",
    "debootstrap": "debootstrap",
    "mkfs.ext4": "e2fsprogs",
    "chroot": "coreutils",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "rsync": "rsync",
    "virtlogd": "libvirt-daemon-system",
    "libvirtd": "libvirt-daemon-system",
    "git": "git",
    "mount": "mount",
    "debugfs": "e2fsprogs",
    "e2fsck": "e2fsprogs",
    "cp": "coreutils",
    "umount": "mount",
}


@dataclass(frozen=True)
class Result:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


class CommandError(VmsandboxError):
    """A command exited non-zero; carries the command, its exit code and the tail of its stderr."""

    def __init__(self, result: Result, *, hint: str | None = None) -> None:
        tail = "\n".join(result.stderr.strip().splitlines()[-8:])
        super().__init__(
            f"`{shlex.join(result.argv)}` failed with exit code {result.returncode}" + (f": {tail}" if tail else ""),
            hint=hint,
        )
        self.result = result


def which(tool: str) -> str:
    """Full path of `tool`, or a VmsandboxError naming the package that provides it."""
    found = shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin:/usr/bin:/bin")
    if found is None:
        package = TOOL_PACKAGES.get(tool, tool)
        raise VmsandboxError(
            f"`{tool}` is not installed",
            hint=f"install it with `apt-get install {package}`",
        )
    return found


def run(
    argv: Sequence[str | Path],
    *,
    check: bool = True,
    input: str | bytes | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float | None = None,
    hint: str | None = None,
) -> Result:
    """Run argv (never a shell string) and capture its output.

    The child runs in its own process group; if we are interrupted (Ctrl-C, SIGTERM turned into
    SystemExit, a timeout) the whole group is terminated before the exception goes on, so no
    grandchild keeps writing into a directory we are about to remove.
    """
    args = [str(a) for a in argv]
    args[0] = which(args[0])
    log.debug("run: %s", shlex.join(args))
    data = input.encode() if isinstance(input, str) else input
    child = subprocess.Popen(
        args,
        stdin=subprocess.PIPE if data is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env) if env is not None else None,
        cwd=cwd,
        start_new_session=True,
        preexec_fn=_die_with_parent,  # noqa: PLW1509 - only calls prctl, no locks taken
    )
    try:
        stdout, stderr = child.communicate(data, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        _kill_group(child)
        raise VmsandboxError(f"`{shlex.join(args)}` did not finish within {timeout:.0f} s", hint=hint) from exc
    except BaseException:
        _kill_group(child)
        raise
    result = Result(
        argv=tuple(args),
        returncode=child.returncode,
        stdout=stdout.decode(errors="replace"),
        stderr=stderr.decode(errors="replace"),
    )
    if check and result.returncode != 0:
        raise CommandError(result, hint=hint)
    return result


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


def spawn_detached(argv: Sequence[str | Path], *, log_file: Path, env: Mapping[str, str] | None = None) -> int:
    """Start a background daemon that outlives us (its own session, stdout and stderr to log_file)."""
    args = [str(a) for a in argv]
    args[0] = which(args[0])
    log.debug("spawn_detached: %s", shlex.join(args))
    with log_file.open("ab") as out:
        child = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )
    return child.pid


def process_start(pid: int) -> str | None:
    """The start time of pid (from /proc), to tell a live process from a reused pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def alive(pid: int | None, start: str | None) -> bool:
    """Whether the process that had `start` as its start time still runs (not a zombie, not a reused pid)."""
    if pid is None or start is None or process_start(pid) != start:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


_PR_SET_PDEATHSIG = 1


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
