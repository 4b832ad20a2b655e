"""What the mirror of a session's guest tree may spend of the host's disk, and how much more one transfer may.

A transfer may spend the least of:

- what a pull takes at once (`sync_limit`), held by the meter while rsync receives (sync.fetch.meter);
- what is left of the session's own bound, FACTOR times that (the mirror holds what the guest changed: more
  than one pull's worth, when a person pulls a large change in parts);
- what the host's file system has free, past a reserve of blocks and of inodes (checked before receiving).

**The session's bound is the kernel's under root.** The mirror lives in a file system of its own whose length
is that bound plus the project's own tree (sync.fetch.volume): the receiver is stopped by ENOSPC at the bound
whatever it makes, and a walk never has to catch up with it. Measured with `sync_limit: 16M`: a guest's 40,000
empty directories took 158 MiB of the host's disk when the bound below was counted; in a file system of its
own the transfer is stopped where the image ends (64 MiB and the project's share), whatever the meter saw.

**Without root it is this ledger** (no file system can be mounted, and project quotas need root to set their
limits): each session keeps what its mirror spends (blocks and inodes, as the file system counts them: the
meter's BLOCK per entry besides the bytes). The ledger grows by what each transfer spent (a bound from above:
rsync's replaced files free their old blocks); a full walk of the mirror sets it to what the mirror really
holds, as does the next transfer whenever the ledger, rather than `sync_limit`, would bound it. A transfer is
stopped when the meter sees it pass its budget, not before: what the receiver makes faster than its lines come
(empty directories: thousands in a fifth of a second) passes the budget by that much; a mirror that passed
the session's bound so is dropped from the disk at once (sync.fetch.mirror), and the next pull makes it anew.

Past a bound, either way: one line with the fix, and nothing applied.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from vmsandbox import filewrite, paths
from vmsandbox.errors import VmsandboxError
from vmsandbox.sync.fetch.meter import Budget, Tally
from vmsandbox.sync.tree import manifest

LEDGER = "mirror-spend.json"  # in the session directory
FACTOR = 4
FREE_RESERVE = 256 * 1024**2
INODE_RESERVE = 10_000


@dataclass
class Spend:
    bytes: int = 0
    entries: int = 0


def load(root: Path) -> Spend:
    try:
        data = json.loads((root / LEDGER).read_text())
        return Spend(int(data["bytes"]), int(data["entries"]))
    except (OSError, ValueError, KeyError, TypeError):
        return Spend()


def save(root: Path, spend: Spend) -> None:
    filewrite.write_atomically(root / LEDGER, json.dumps(asdict(spend)))


def add(root: Path, tally: Tally) -> None:
    """What one transfer spent, added to the session's ledger."""
    was = load(root)
    save(root, Spend(was.bytes + tally.spent, was.entries + tally.entries))


def measure(tree: Path) -> Spend:
    """What the mirror holds now, as the file system counts it: its blocks and its entries (no link followed)."""
    found = Spend()
    try:
        for _dirpath, dirnames, filenames, dir_fd in os.fwalk(tree, follow_symlinks=False):
            for name in dirnames + filenames:
                try:
                    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                found.bytes += st.st_blocks * 512
                found.entries += 1
    except RecursionError:
        raise manifest.deep(tree) from None
    return found


def rebase(root: Path, tree: Path) -> Spend:
    """The ledger set to what the mirror really holds."""
    found = measure(tree)
    save(root, found)
    return found


def room(
    files: paths.SessionPaths,
    limit: int,
    *,
    max_entries: int,
    pull_entries: int | None = None,
    kernel: int | None = None,
) -> Budget:
    """What the next transfer into the session's mirror may spend (see the module's notes): `limit` bytes and
    `pull_entries` entries at once (`max_entries`, the session's bound, unless less is given). The session's
    bound is counted here, or (`kernel`: that bound) kept by the mirror's own file system. Raises, saying which
    bound and the fix, when nothing is left."""
    ledger = kernel is None
    bound = FACTOR * limit if kernel is None else kernel
    spent = load(files.root) if ledger else Spend()
    if ledger and (bound - spent.bytes < limit or max_entries - spent.entries < max_entries // FACTOR):
        # the ledger is a bound from above (a stopped transfer's partial files were removed; replaced files
        # freed their blocks): where it, not `sync_limit`, would bound this transfer, the truth decides
        spent = rebase(files.root, files.guest_tree)
    fs = os.statvfs(files.root)  # the host's (the mirror's own file system, if it has one, is inside it)
    free = fs.f_bavail * fs.f_frsize - FREE_RESERVE
    inodes = fs.f_favail - max(INODE_RESERVE, fs.f_files // 100) if fs.f_files else max_entries
    hint = (
        f"remove what the guest need not send back (`vmsandbox shell {files.root.name}`), or raise `sync_limit` "
        "in ~/.config/vmsandbox/config.yaml"
    )
    if ledger and (spent.bytes >= bound or spent.entries >= max_entries):
        raise VmsandboxError(
            f"the mirror of session {files.root.name}'s guest tree takes {spent.bytes / 1024**2:,.0f} MiB in "
            f"{spent.entries:,} entries on this machine's disk, the most a session's may ({FACTOR} x sync_limit); "
            "nothing was applied",
            hint=hint,
        )
    if free <= 0 or inodes <= 0:
        raise VmsandboxError(
            f"no room left for the mirror of session {files.root.name}'s guest tree: its file system keeps "
            f"{FREE_RESERVE // 1024**2} MiB and {INODE_RESERVE:,} inodes free; nothing was applied",
            hint=f"free space where vmsandbox keeps its state ({paths.state_dir()})",
        )
    mine = f"to session {files.root.name}'s mirror, past its bound"
    choices = [
        (
            limit,
            max_entries if pull_entries is None else min(pull_entries, max_entries),
            "in one pull, more than a sync takes",
        ),
        *([(bound - spent.bytes, max_entries - spent.entries, mine)] if ledger else []),
        (free, inodes, "to the mirror, more than this machine's disk has free"),
    ]
    size, _, why = min(choices, key=lambda c: c[0])
    full = (
        "more than this machine's disk has free"
        if ledger
        else f"more than session {files.root.name}'s mirror may hold ({bound / 1024**2:,.0f} MiB, {FACTOR} x "
        "sync_limit), past its bound"
    )
    return Budget(bytes=size, entries=min(c[1] for c in choices), why=why, full=full)
