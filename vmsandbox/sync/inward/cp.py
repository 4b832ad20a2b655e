"""`vmsandbox cp HOSTPATH NAME:PATH`: host files into a running guest (only that way: what comes out of a guest
comes through the review). The host side reads as the project's owner, so a copy never reads what that user
could not; what lands in the guest belongs to the guest's user."""

from __future__ import annotations

import posixpath
from pathlib import Path

from vmsandbox.confine import accounts
from vmsandbox.errors import UsageError
from vmsandbox.guest.ssh import Endpoint
from vmsandbox.sync.fetch import rsync
from vmsandbox.sync.target import Target


def guest_path(target: Target, given: str) -> str:
    """Where PATH is in the guest: as given when absolute, else under the project directory."""
    if "\0" in given or "\n" in given:
        raise UsageError(f"{given!r} is not a path")
    if not given:
        return str(target.project).rstrip("/") + "/"
    joined = given if given.startswith("/") else posixpath.join(str(target.project), given)
    return joined if not given.endswith("/") else joined.rstrip("/") + "/"


def copy_in(target: Target, endpoint: Endpoint, sources: list[Path], dest: str) -> str:
    """Copy each source (a file, or a directory with what is in it, as `cp -r` does) to `dest` in the guest;
    the guest path written to. Several sources go into `dest` as a directory."""
    missing = [s for s in sources if not s.exists() and not s.is_symlink()]
    if missing:
        raise UsageError(f"{missing[0]} does not exist", hint="give a file or directory of this machine")
    remote = guest_path(target, dest)
    if len(sources) > 1 and not remote.endswith("/"):
        remote += "/"
    who = target.owner
    for source in (s.absolute() for s in sources):
        # the host's rsync is jailed and sees the source alone (not the directory that holds it: a file of the
        # home directory would have shown it the whole home), run in the source's directory; the name goes as
        # `./NAME`, so a name that starts with `-` is a name, not one of rsync's options
        side = rsync.Side(who, accounts.GIT_LIMITS, source.parent, only=(source,))
        rsync.rsync(
            endpoint,
            ["-rlpt", "--mkpath", f"--chown={target.uid}:{target.gid}"],
            f"./{source.name}",
            f"{endpoint.host_alias}:{remote}",
            side=side,
            expect_sender=False,
            remote_path=remote,
            hint="the guest path must be in a directory the copy can make (`vmsandbox shell NAME ls -ld DIR`)",
        )
    return remote
