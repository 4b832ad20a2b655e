"""Running commands in a session's guest through the system ssh (real PTYs, separate streams, exit codes)."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping

from vmsandbox import proc
from vmsandbox.guest.ssh import Endpoint

SSH_FAILED = 255  # what ssh exits with when the connection (not the command) failed


STEP = "/usr/local/lib/vmsandbox/step"  # the guest's step wrapper (journal.c): `step ID -- ARGV`


def remote_command(
    workdir: str, cmd: list[str] | None, env: Mapping[str, str] | None = None, *, step: str | None = None
) -> str:
    """The command line the guest's shell runs: cd into the project, the variables of `env` exported (names
    checked by the caller, values quoted), then CMD (argv, quoted) or a login shell; with `step` (a step's id,
    [a-z0-9]), under the guest's step wrapper, which registers the command's process as that step's root (an
    image without the wrapper runs the command as it is)."""
    target = shlex.join(cmd) if cmd else '"${SHELL:-/bin/bash}" -l'
    exports = "".join(f"export {k}={shlex.quote(v)} && " for k, v in (env or {}).items())
    run = f"exec {target}"
    if step is not None:
        if not step.isalnum() or not step.isascii() or len(step) > 32:
            raise ValueError(f"not a step id: {step!r}")
        run = f"{{ [ -x {STEP} ] && exec {STEP} {step} -- {target}; exec {target}; }}"
    return f"cd -- {shlex.quote(workdir)} && {exports}{run}"


def run_as_root(
    endpoint: Endpoint,
    script: str,
    *,
    check: bool = True,
    timeout: float | None = None,
    hint: str | None = None,
    max_output: int = proc.MAX_OUTPUT,
) -> proc.Result:
    """Run a shell command line as root in the guest (not in the project directory) and capture its output
    (capped: `max_output` bytes per stream)."""
    argv = [*endpoint.ssh_argv("-T", user="root"), "--", script]
    return proc.run(argv, check=check, timeout=timeout, hint=hint, max_output=max_output)


def attach(
    endpoint: Endpoint,
    workdir: str,
    cmd: list[str] | None,
    *,
    tty: bool | None = None,
    env: Mapping[str, str] | None = None,
    step: str | None = None,
) -> int:
    """Run CMD (or an interactive shell) in the guest in `workdir` (the project directory), with `env` set;
    returns its exit code.

    A shell gets a PTY when stdin is a terminal (window size, Ctrl-C, colours). A command gets none
    unless asked, so its stdout and stderr stay separate and binary-safe.
    """
    want_tty = tty if tty is not None else (cmd is None and sys.stdin.isatty())
    flags = ["-t"] if want_tty else ["-T"]
    argv = [*endpoint.ssh_argv(*flags), "--", remote_command(workdir, cmd, env, step=step)]
    return proc.run_attached(argv)


def captured(
    endpoint: Endpoint, workdir: str, cmd: list[str], *, max_output: int = proc.MAX_OUTPUT, step: str | None = None
) -> proc.Result:
    """Run CMD in the guest in the project directory, without a terminal; its output captured (capped)."""
    argv = [*endpoint.ssh_argv("-T"), "--", remote_command(workdir, cmd, step=step)]
    return proc.run(argv, check=False, max_output=max_output)
