"""The jail every host process that parses guest bytes runs in: bubblewrap, the tool the first agent sandboxes
were built on.

An account of its own and resource limits (accounts.py) bound what such a process may touch as a user; the
jail bounds what it can reach at all, whatever it is tricked into doing:

- a mount namespace built from nothing: the system's programs and libraries (`SYSTEM`, read-only), a fresh
  /dev, /proc and a small /tmp, the directories it must read (read-only) and those it must write, and nothing
  else. What it is not given does not exist for it, whatever it is called: no home directory, no other
  session's state, no /run, /var or /tmp of the host, so no socket there either (a Unix socket on a read-only
  mount still accepts connections: libvirt's, docker's, an ssh agent's would have been a way out);
- no network (its own, empty network namespace, which also hides abstract sockets), no IPC, no other
  processes to see;
- its own PID namespace: when the jail's first process ends, the kernel kills everything left in it, so a
  `setsid` grandchild cannot outlive it (process-group kills alone never reached those);
- a new session (no TIOCSTI into our terminal) and death with its parent;
- no new user namespaces (bubblewrap's `--disable-userns`: a user namespace would hand the process every
  capability over mounts and networks of its own), and a seccomp filter (seccomp.py) that refuses the kernel's
  surfaces a reader of guest bytes never needs.

bubblewrap runs unprivileged (user namespaces) after the process switched to its account, so the account's
own uid is what the jail writes with.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# What every jailed tool needs of the host (rsync, git, sh and their libraries); links (merged /usr) stay links.
SYSTEM = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
TMP_BYTES = 64 * 1024**2  # the jail's own /tmp (memory): enough for git's temporary files


@dataclass(frozen=True)
class Jail:
    """What a jailed process may write, and what else it may read: everything else of the host but `SYSTEM`
    is not there."""

    writable: tuple[Path, ...] = ()
    readable: tuple[Path, ...] = ()

    def argv(self, command: Sequence[str], cwd: Path | None, *, seccomp_fd: int | None = None) -> list[str]:
        """`command` wrapped in bubblewrap (the caller resolves `bwrap` like any other tool), under the seccomp
        filter read from `seccomp_fd` (seccomp.memfd; the caller passes it on to the child)."""
        args = ["bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session"]
        if seccomp_fd is not None:
            args += ["--seccomp", str(seccomp_fd)]
        for top in map(Path, SYSTEM):
            if top.is_symlink():
                args += ["--symlink", str(top.readlink()), str(top)]
            elif top.is_dir():
                args += ["--ro-bind", str(top), str(top)]
        args += ["--dev", "/dev", "--proc", "/proc", "--size", str(TMP_BYTES), "--tmpfs", "/tmp"]  # noqa: S108
        for how, paths in (("--ro-bind", self.readable), ("--bind", self.writable)):
            for path in paths:
                for where in _names(path):
                    args += [how, where, where]
        args += ["--remount-ro", "/"]  # the jail's own root (a tmpfs): nothing may be made there
        if cwd is not None:
            args += ["--chdir", str(cwd)]
        return [*args, "--", *command]


def _names(path: Path) -> list[str]:
    """The path as given and, when a link above it leads elsewhere, as resolved: a tool may meet either (git
    writes resolved paths into a repository's alternates)."""
    given, resolved = os.path.abspath(path), os.path.realpath(path)  # noqa: PTH100 - the given form, unresolved
    return [given] if given == resolved else [given, resolved]
