"""A session's workspace held still while its VM runs on: the guest freezes the workspace's file system
(`fsfreeze`) for as long as the host saves the VM's memory live and copies the workspace disk, so that a fork
made from that memory finds the disk as its memory last knew it. Processes that write into the workspace wait
meanwhile; everything else in the guest runs.

The guest thaws it by itself whatever the host does: when the host says so (a line), when the host's connection
ends (the host died: end of input), after HOLD_MAX seconds, or when it finds itself to be a fork — in a VM
restored from the memory saved while it was frozen, the fork's identity sets the fork's hostname first (guest
identity program: `become_fork`, then `apply`: the hostname before the workspace), and the script, finding
another hostname than the one it froze under, thaws within POLL seconds, while the identity's next step (the
workspace's owner) waits for it.

A checkpoint taken so keeps that memory too: a rollback restores the session with the workspace frozen and the
script waiting for a host that is gone, under the same hostname. The host then tells it (`end_restored`: SIGUSR1
to each script named in HELD, a directory of the guest's memory) that it runs in a restored VM, and it thaws and
ends the SSH sessions the VM was restored with, as a fork's does.
"""

from __future__ import annotations

import contextlib
import os
import select
import shlex
import time
from collections.abc import Iterator

from vmsandbox import proc
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest.ssh import Endpoint

HOLD_MAX = 600  # seconds the guest keeps the workspace frozen at most
HOLD_HOST = HOLD_MAX - 60  # seconds the host relies on it: a hold older than this is taken as thawed
GRACE = 120  # seconds a script that lost its host (or its bound) still looks for a fork's hostname
POLL = 0.05  # how often the frozen guest looks for the host's word and for another hostname in its fw_cfg
READY_TIMEOUT = 60.0  # the guest's `sync` and freeze, from the login on
CANNOT = 3  # the script's exit: this guest cannot (no workspace mount of its own, no hostname, no fsfreeze)
FROZEN = b"frozen\n"
LINE_MAX = 4096  # bytes of the guest's first line read at most
HOSTNAME = "/proc/sys/kernel/hostname"

# bash, as root in the guest: $1 the workspace's path, $2 the file that names the guest's hostname (the kernel's),
# $3 HOLD_MAX, $4 POLL, $5 GRACE, $6 HELD (its pid goes there while it runs). In a fork, or told by SIGUSR1 that
# it runs in a VM restored from the memory saved meanwhile (a rollback to a checkpoint taken live), it also ends
# the SSH sessions its source had (listed before the freeze: their connections are the source's, dead there),
# among them the egress link's, whose listener on the guest's proxy port the new egress link needs. Its bounds
# count the guest's uptime, not its wall clock, which a host's egress link steps (a step of the clock while the
# host copies the disk must not thaw it). Once it has thawed, its exit does not thaw again (a later freeze,
# another script's, is not its to end).
SCRIPT = r"""set -u
w=$1; name=$2; held=$6
up() { read -r u _ </proc/uptime; u=${u%.*}; }
command -v fsfreeze >/dev/null || exit 3
m=$(findmnt -n -o TARGET --target "$w") || exit 3
[ -n "$m" ] && [ "$m" != / ] || exit 3
was=; read -r was <"$name" || true
[ -n "$was" ] || exit 3
main=; read -r main 2>/dev/null </run/sshd.pid || true
stale=; [ -z "$main" ] || stale=$(pgrep -P "$main" -x 'sshd|sshd-session' | tr '\n' ' ')
restored=
trap 'restored=1' USR1
mkdir -p "$held" && echo $$ >"$held/$$" || exit 3
trap 'rm -f "$held/$$"' EXIT
sync
fsfreeze -f "$m" || exit 3
trap 'fsfreeze -u "$m" 2>/dev/null; rm -f "$held/$$"; echo thawed' EXIT
echo frozen
fork=; word=
up; end=$((u + $3))
while [ "$u" -lt "$end" ]; do
    rc=0; read -r -t "$4" _ || rc=$?
    if [ -n "$restored" ]; then fork=1; break; fi
    now=; read -r now <"$name" || true
    if [ "$now" != "$was" ]; then fork=1; break; fi
    if [ "$rc" -eq 0 ]; then word=1; break; fi
    [ "$rc" -gt 128 ] || break
    up
done
fsfreeze -u "$m" 2>/dev/null
trap 'rm -f "$held/$$"; echo thawed' EXIT
if [ -z "$fork" ] && [ -z "$word" ]; then
    # the end of its input or its bound, not the host's word: a fork whose identity comes later (its connection
    # reset first) still ends its source's sessions once it has its hostname
    up; end=$((u + $5))
    while [ "$u" -lt "$end" ]; do
        now=; read -r now <"$name" || true
        if [ -n "$restored" ] || [ "$now" != "$was" ]; then fork=1; break; fi
        sleep 0.2
        up
    done
fi
if [ -n "$fork" ] && [ -n "$stale" ]; then
    for p in $stale; do
        c=; read -r c 2>/dev/null </proc/$p/comm || true
        case $c in sshd|sshd-session) kill "$p" 2>/dev/null || true ;; esac
    done
fi
"""

# bash, as root in a VM just restored from memory saved while SCRIPT ran (a rollback to a checkpoint taken live):
# $1 HELD, $2 the workspace's path, $3 POLL, $4 the most polls. Each script named in HELD is told (SIGUSR1) and
# waited for (ENDED_WITHIN seconds in all: it thaws, then ends its source's sessions), else killed (its sessions
# then live on: exit FORCED); the workspace is thawed whatever.
RESTORED = r"""set -u
held=$1; w=$2
told=; forced=
for f in "$held"/*; do
    [ -e "$f" ] || continue
    p=${f##*/}
    c=; read -r c 2>/dev/null </proc/$p/comm || true
    if [ "$c" = bash ] && kill -USR1 "$p" 2>/dev/null; then told="$told $p"; else rm -f "$f"; fi
done
i=0
for p in $told; do
    while [ "$i" -lt "$4" ]; do
        st=; read -r _ _ st _ 2>/dev/null </proc/$p/stat || true
        case $st in ''|Z) break ;; esac
        sleep "$3"; i=$((i + 1))
    done
    c=; read -r c 2>/dev/null </proc/$p/comm || true
    st=; read -r _ _ st _ 2>/dev/null </proc/$p/stat || true
    if [ "$c" = bash ] && [ -n "$st" ] && [ "$st" != Z ]; then kill -KILL "$p" 2>/dev/null && forced=1; fi
    rm -f "$held/$p"
done
m=$(findmnt -n -o TARGET --target "$w" 2>/dev/null) || m=
if [ -n "$m" ] && [ "$m" != / ]; then fsfreeze -u "$m" 2>/dev/null || true; fi
[ -z "$forced" ] || exit 4
"""
HELD = "/run/vmsandbox/freeze"  # in the guest's memory (tmpfs): one file per running SCRIPT, named by its pid
ENDED_WITHIN = 10.0  # seconds a restored script has to thaw and end its source's sessions once told
FORCED = 4  # RESTORED's exit when a script had to be killed (the workspace thawed, its source's sessions not ended)


def argv(endpoint: Endpoint, workdir: str) -> list[str]:
    """The ssh command line that runs SCRIPT in the guest for the workspace at `workdir`."""
    args = [workdir, HOSTNAME, str(HOLD_MAX), str(POLL), str(GRACE), HELD]
    script = shlex.join(["bash", "-c", SCRIPT, "freeze", *args])
    # its own connection (-S none: not a shared master's, whose channel would outlive this client)
    return [*endpoint.ssh_argv("-T", "-S", "none", user="root"), "--", script]


@contextlib.contextmanager
def held(endpoint: Endpoint, workdir: str) -> Iterator[Holding | None]:
    """While it lasts, the guest's workspace at `workdir` is frozen (a Holding), or None where this guest cannot
    (its workspace is not a mount of its own, or it has no fsfreeze): the caller takes another way. Thawed at
    the end, whatever happened."""
    child = proc.start(argv(endpoint, workdir), stdin=proc.PIPE)
    try:
        said = _first_line(child, READY_TIMEOUT)
        if said != FROZEN:
            result = proc.finish(child, check=False, timeout=30)
            if result.returncode == CANNOT:
                yield None
                return
            why = proc.tail_of(result.stderr or said.decode(errors="replace"), lines=3) or f"exit {result.returncode}"
            raise VmsandboxError(f"the guest could not hold its workspace still: {why}")
        yield Holding(child)
    finally:
        _thaw(child)


class Holding:
    """The guest's workspace, frozen by `child` (an ssh running SCRIPT)."""

    def __init__(self, child: proc.Child) -> None:
        self.child = child
        self.since = time.monotonic()

    def still(self) -> None:
        """Raises unless the guest still holds it frozen (it thaws by itself after HOLD_MAX seconds, or when its
        connection ended): what was copied meanwhile may not be what the memory knows."""
        if self.child.poll() is not None or time.monotonic() - self.since > HOLD_HOST:
            raise VmsandboxError(
                "the guest thawed its workspace before its disk was copied",
                hint=f"a workspace whose disk takes over {HOLD_MAX} s to copy cannot be forked live",
            )


def _first_line(child: proc.Child, timeout: float) -> bytes:
    """What the child writes up to its first newline (or to its end), within `timeout` seconds."""
    if child.stdout is None:
        raise ValueError("started without a pipe for its output")
    fd, got, deadline = child.stdout.fileno(), b"", time.monotonic() + timeout
    while not got.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise VmsandboxError(f"the guest did not freeze its workspace within {timeout:g} s")
        chunk = os.read(fd, 64)
        if not chunk:
            break
        got += chunk
        if len(got) > LINE_MAX:  # (the guest writes it: no line of ours is that long)
            raise VmsandboxError("the guest answered the freeze with something else than a line of its word")
    return got


def _thaw(child: proc.Child) -> None:
    """The host's word to thaw (a line), then the script's end; killed if it does not end within 30 s."""
    if child.returncode is not None:  # (collected already)
        return
    with contextlib.suppress(VmsandboxError, OSError):
        proc.finish(child, input=b"thaw\n", check=False, timeout=30)


def end_restored(endpoint: Endpoint, workdir: str) -> None:
    """In a VM just restored from memory saved while its workspace was frozen (a rollback to a checkpoint taken
    live): the freeze scripts restored with it thaw the workspace and end the SSH sessions the VM was restored
    with (the egress link's among them), or are killed; the workspace is thawed in any case. Raises when the guest
    could not be asked, or a script had to be killed."""
    args = [HELD, workdir, str(POLL), str(int(ENDED_WITHIN / POLL))]
    script = shlex.join(["bash", "-c", RESTORED, "restored", *args])
    result = proc.run(
        [*endpoint.ssh_argv("-T", user="root"), "--", script], check=False, timeout=ENDED_WITHIN + READY_TIMEOUT
    )
    if result.returncode == FORCED:
        raise VmsandboxError(
            "a freeze script restored with the memory did not end when told: it was killed and the workspace "
            "thawed, but the SSH sessions the memory held were not ended (the egress proxy may take a minute)"
        )
    if result.returncode != 0:
        why = proc.tail_of(result.stderr or "", lines=3) or f"exit {result.returncode}"
        raise VmsandboxError(
            f"the restored guest did not thaw its workspace ({why}): writes into it wait until its freeze script "
            f"thaws it, after {HOLD_MAX // 60} minutes of the guest's running at most"
        )
