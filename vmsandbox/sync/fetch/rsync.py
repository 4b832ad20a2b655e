"""rsync between the host and a guest, with the host side of rsync unprivileged.

The guest's rsync is hostile: whatever it sends, the host's rsync parses (file lists, names, modes, deltas).
So the host's rsync runs as an unprivileged account (`confine`), with resource limits, in a directory only
that account can write. The SSH connection itself stays ours: the session's keys and its multiplexed master
connection belong to root, and an unprivileged rsync must not hold them.

How the two meet: rsync's "remote shell" (`-e`) is a tiny relay, `sh` and two `cat`s, that first tells us
the command rsync wants run on the other side, then copies bytes between rsync and one end of a socket pair.
We check that command (it must be an rsync server for the path we asked for), run it in the guest over the
session's SSH connection with the other end of the socket pair as its stdin and stdout, and wait for both.
"""

from __future__ import annotations

import contextlib
import shlex
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vmsandbox import proc
from vmsandbox.confine import accounts
from vmsandbox.confine.accounts import Identity, Limits
from vmsandbox.confine.jail import Jail
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest.ssh import Endpoint
from vmsandbox.sync.fetch import meter

PREAMBLE_LIMIT = 64 * 1024
PREAMBLE_TIMEOUT = 30.0
RELAY_NAME = "vmsandbox-relay"


def relay_shell(fd: int) -> str:
    """rsync's `-e` value: report our argv (a count, then each argument, NUL-terminated) on fd, then relay
    stdin to fd (in the background; stdin kept on another fd, as a shell gives background jobs /dev/null) and
    fd to stdout until the guest's side is done, ending then as ssh would when the remote command ends."""
    alt = 3 if fd != 3 else 4
    script = (
        f'printf "%s\\0" "$#" "$@" >&{fd}; exec {alt}<&0; cat <&{alt} >&{fd} & cat <&{fd}; kill $! 2>/dev/null; exit 0'
    )
    # bash, not sh: dash takes only one-digit fds in a redirection, and fd is whatever the socket got
    return f"bash -c '{script}' {RELAY_NAME}"


def read_preamble(sock: socket.socket, *, timeout: float = PREAMBLE_TIMEOUT) -> list[str]:
    """The argv the relay reported (without consuming anything after it)."""
    sock.settimeout(timeout)
    buf = b""
    try:
        while True:
            fields = buf.split(b"\0")
            if len(fields) > 1 and fields[0].isdigit() and len(fields) - 2 >= int(fields[0]):
                count = int(fields[0])
                return [f.decode("utf-8", "surrogateescape") for f in fields[1 : count + 1]]
            if len(buf) > PREAMBLE_LIMIT:
                raise VmsandboxError("rsync's relay sent an oversized command line")
            byte = sock.recv(1)  # one at a time: what follows belongs to the guest's rsync
            if not byte:
                raise EOFError
            buf += byte
    finally:
        sock.settimeout(None)


@dataclass(frozen=True)
class Side:
    """The unprivileged host side: who runs rsync, under which limits, in which directory, and what of the host
    its jail holds (`only`: just these paths, in `cwd`; by default the whole of `cwd`)."""

    as_user: Identity | None
    limits: Limits | None
    cwd: Path
    only: tuple[Path, ...] | None = None


def rsync(
    endpoint: Endpoint,
    options: Sequence[str],
    source: str,
    dest: str,
    *,
    side: Side,
    expect_sender: bool,
    remote_path: str,
    input: bytes | None = None,
    timeout: float | None = None,
    hint: str | None = None,
    budget: meter.Budget | None = None,
    tally: meter.Tally | None = None,
) -> proc.Result:
    """Run `rsync OPTIONS SOURCE DEST` on the host as side.as_user, where the remote end (`HOST:PATH` in
    SOURCE or DEST) is the guest, reached as root over the session's SSH connection.

    `expect_sender`: the guest's rsync sends (a pull) or receives (a push); the command the relay reports
    must say the same and name `remote_path`, or nothing is run in the guest. With `budget`, the receiver is
    stopped once it spent more than that (sync.fetch.meter: `meter.PassedError`); `tally` gets what it spent."""
    if budget is not None:
        options = [*options, *meter.OPTIONS]
    ours, theirs = socket.socketpair()
    try:
        piped, sends = input is not None, not expect_sender
        local = _start_local(options, source, dest, side, theirs.fileno(), piped=piped, sends=sends)
    except BaseException:
        ours.close()
        theirs.close()
        raise
    theirs.close()
    guest = _GuestSide()
    watch = meter.Meter(local.pid, budget, tally=tally) if budget is not None else None
    try:
        try:
            argv = read_preamble(ours)
        except EOFError:
            argv = []  # rsync failed before it needed the guest: its own error says why
        if argv:
            command = _checked(argv, endpoint, expect_sender=expect_sender, remote_path=remote_path)
            guest.start([*endpoint.ssh_argv("-T", user="root"), "--", command], ours.fileno(), timeout)
        ours.close()
        with watch or contextlib.nullcontext():
            result = proc.finish(
                local, input=input, check=False, timeout=timeout, hint=hint, reap_group=True,
                on_line=watch.line if watch is not None else None,
            )  # fmt: skip
    finally:
        ours.close()
        guest.join()
    if watch is not None and watch.passed is not None:
        raise meter.PassedError(watch.passed)
    ssh_result = guest.result()
    if result.returncode != 0:
        extra = f"\n{ssh_result.stderr.strip()}" if ssh_result is not None and ssh_result.stderr.strip() else ""
        raise proc.CommandError(
            proc.Result(result.argv, result.returncode, result.stdout, result.stderr + extra), hint=hint
        )
    return result


def _start_local(
    options: Sequence[str], source: str, dest: str, side: Side, fd: int, *, piped: bool, sends: bool
) -> proc.Child:
    """The host's rsync, as side.as_user, jailed: writing only where it receives, reading only what it sends."""
    return proc.start(
        # --blocking-io: the relay's cats expect blocking pipes (rsync makes them non-blocking otherwise)
        ["rsync", *options, "--blocking-io", "-e", relay_shell(fd), source, dest],
        stdin=proc.PIPE if piped else proc.DEVNULL,
        cwd=side.cwd,
        env=accounts.clean_env(side.as_user),
        as_user=side.as_user,
        limits=side.limits,
        pass_fds=(fd,),
        jail=Jail(readable=side.only or (side.cwd,)) if sends else Jail(writable=side.only or (side.cwd,)),
    )


class _GuestSide:
    """The ssh that runs the guest's half of rsync, waited for in a thread while we wait for our half."""

    def __init__(self) -> None:
        self._outcome: list[proc.Result | BaseException] = []
        self._thread: threading.Thread | None = None

    def start(self, argv: list[str], sock: int, timeout: float | None) -> None:
        child = proc.start(argv, stdin=sock, stdout=sock)

        def wait() -> None:
            try:
                self._outcome.append(proc.finish(child, check=False, timeout=timeout))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                self._outcome.append(exc)

        self._thread = threading.Thread(target=wait, daemon=True)
        self._thread.start()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join(timeout=30)

    def result(self) -> proc.Result | None:
        found = self._outcome[0] if self._outcome else None
        if isinstance(found, BaseException):
            raise found
        return found


def _checked(argv: list[str], endpoint: Endpoint, *, expect_sender: bool, remote_path: str) -> str:
    """The command line to run in the guest, as ssh would join it, after checking it is what we asked for."""
    host, *command = argv
    ok = (
        host == endpoint.host_alias
        and command[:2] == ["rsync", "--server"]
        and ("--sender" in command) == expect_sender
        and command[-1].replace("\\", "") in (remote_path, remote_path.rstrip("/") + "/")
    )
    if not ok:
        raise VmsandboxError(f"refusing to relay an unexpected rsync command: {shlex.join(argv)[:300]}")
    return " ".join(command)
