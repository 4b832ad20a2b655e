"""The jail every host process that parses guest bytes runs in: bubblewrap, the tool the first agent sandboxes
were built on.

An account of its own and resource limits (confine.py) bound what such a process may touch as a user; the
jail bounds what it can reach at all, whatever it is tricked into doing:

- a mount namespace where the whole file system is read-only except the directories it must write (its target);
- no network (its own, empty network namespace), no IPC, no other processes to see;
- its own PID namespace: when the jail's first process ends, the kernel kills everything left in it, so a
  `setsid` grandchild cannot outlive it (process-group kills alone never reached those);
- a new session (no TIOCSTI into our terminal) and death with its parent.

bubblewrap runs unprivileged (user namespaces) after the process switched to its account, so the account's
own uid is what the jail writes with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Jail:
    """What a jailed process may write (everything else it sees read-only)."""

    writable: tuple[Path, ...] = ()

    def argv(self, command: Sequence[str], cwd: Path | None) -> list[str]:
        """`command` wrapped in bubblewrap (the caller resolves `bwrap` like any other tool)."""
        args = [
            "bwrap",
            "--unshare-all",
            "--die-with-parent",
            "--new-session",
            "--ro-bind", "/", "/",
            "--dev", "/dev",
            "--proc", "/proc",
        ]  # fmt: skip
        for path in self.writable:
            args += ["--bind", str(path), str(path)]
        if cwd is not None:
            args += ["--chdir", str(cwd)]
        return [*args, "--", *command]
