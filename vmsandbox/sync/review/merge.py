"""Three-way merge of a file both sides changed: `git merge-file`, jailed (it parses guest bytes).

When the host and the guest changed the same text file in places that do not overlap, the merge is made and
offered as "merged"; when hunks overlap, the result holds diff3 conflict markers (host | base | guest) and the
change stays a conflict: the host's file is never touched by `--yes`, the guest's version is kept beside it, and a
person may edit the merged text (the web review) before applying it. Nothing is lost either way.

The three versions reach git as memory files passed by descriptor: nothing of the guest is written to the host's
disk for it, and the jail sees none of the host's directories.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from vmsandbox import proc
from vmsandbox.confine import accounts
from vmsandbox.confine.jail import Jail
from vmsandbox.errors import VmsandboxError
from vmsandbox.sync.git import repository
from vmsandbox.sync.land import write
from vmsandbox.sync.review.threeway import Change, Merge, Status
from vmsandbox.sync.tree.manifest import FILE

log = logging.getLogger(__name__)

MERGE_LIMIT = 1024**2  # larger files are not merged (as diff.DIFF_LIMIT: a person could not review the result)
MERGE_TIMEOUT = 60
LABELS = ("host", "base", "guest")
MARKERS = (b"<<<<<<< ", b"||||||| ", b"=======", b">>>>>>> ")


def mergeable(c: Change) -> bool:
    """Both sides changed a regular file's content (a file deleted or turned into something else on either side
    is a conflict a merge cannot answer)."""
    return (
        c.status is Status.CONFLICT
        and all(e is not None and e.kind == FILE for e in (c.base, c.guest, c.host))
        and all(e is not None and e.size <= MERGE_LIMIT for e in (c.base, c.guest, c.host))
    )


def _text(data: bytes | None) -> bool:
    if data is None or b"\0" in data:
        return False
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


@contextlib.contextmanager
def _memory_files(*contents: bytes) -> Iterator[list[int]]:
    fds: list[int] = []
    try:
        for data in contents:
            fds.append(write.memory_file(data, inherited=True))  # git reads it through /proc/self/fd
        yield fds
    finally:
        for fd in fds:
            os.close(fd)


def merge_bytes(host: bytes, base: bytes, guest: bytes) -> Merge:
    """`git merge-file -p --diff3` of the three versions, in the jail, as the guest-data account."""
    who = accounts.guest_data_account()
    with _memory_files(host, base, guest) as fds:
        labels = [arg for label in LABELS for arg in ("-L", label)]
        result = proc.run(
            ["git", "merge-file", "-p", "--diff3", *labels, *(f"/proc/self/fd/{fd}" for fd in fds)],
            jail=Jail(),
            env=repository.git_env(who),
            as_user=who,
            limits=accounts.GIT_LIMITS,
            pass_fds=fds,
            check=False,
            timeout=MERGE_TIMEOUT,
            max_output=4 * MERGE_LIMIT,
        )
    if not 0 <= result.returncode < 128:  # git: the number of conflicts (capped at 127), negative on error
        raise VmsandboxError(f"git merge-file failed: {result.stderr.strip()}")
    return Merge(result.stdout.encode(), result.returncode)  # UTF-8 in (checked), UTF-8 out


def attempt(c: Change, *, baseline: Path, host: Path, guest: Path) -> Merge | None:
    """The merge of a conflicting text file (None where there is none to make: not text, too large, not a
    file on every side, or git failed, which the log says)."""
    if not mergeable(c):
        return None
    versions = [write.read_nofollow(root, c.path, limit=MERGE_LIMIT) for root in (host, baseline, guest)]
    if not all(_text(v) for v in versions):
        return None
    try:
        return merge_bytes(*(v or b"" for v in versions))
    except VmsandboxError as exc:
        log.warning("%s: no merge made (%s)", c.path, exc.message)
        return None


def merge_all(changes: list[Change], *, baseline: Path, host: Path, guest: Path) -> None:
    """Merge every conflicting text file: a clean merge makes the change MERGED; an overlapping one stays a
    conflict with its three-way text kept for the review."""
    for c in changes:
        found = attempt(c, baseline=baseline, host=host, guest=guest)
        if found is None:
            continue
        c.merge = found
        if found.clean:
            c.status = Status.MERGED


def has_markers(text: bytes) -> bool:
    """Whether a merged text still holds conflict markers at the start of a line (an edit that left some)."""
    return any(line.startswith(MARKERS) for line in text.splitlines())
