"""The mirror of the guest's tree on the host, which every review compares against.

Changes come back with rsync's delta transfer into the mirror (it starts as a copy of the baseline): the paths
the guest's change journal names (sync.fetch.journal), or the whole tree when the journal cannot say. What the
mirror holds that differs from the baseline is kept between pulls (sync.fetch.delta), so a pull reads again only
what it fetched. If the VM died, a reader VM mounts its workspace disk and the whole tree is fetched from
there (session.end.diskreader): the host never parses a guest-written filesystem. The mirror holds guest
bytes, so it belongs to the unprivileged guest-data account (`confine`): the rsync receiver that fills it
runs as that account, jailed, with resource limits. Nothing
in it ever keeps a setuid, setgid or sticky bit or a world-writable mode; its root is 0700 inside the private
session directory. Reviews only read it, with lstat and O_NOFOLLOW.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from vmsandbox import proc
from vmsandbox.confine import accounts
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest.ssh import Endpoint
from vmsandbox.paths import SessionPaths
from vmsandbox.sync.fetch import delta, journal, meter, rsync, spend, volume
from vmsandbox.sync.tree import manifest, placeholders
from vmsandbox.sync.tree.hashcache import HashCache

# What the mirror never takes from the guest: owners, devices, FIFOs, sockets, and the mode bits that must
# never exist on the host (setuid, setgid, sticky, world-writable). Holes stay holes, and hard links stay links
# (50 links to a 4 MiB file are 4 MiB in the mirror, not 200; the review counts each path against the budget).
RSYNC_PULL = (
    "-a",
    "--hard-links",
    "--delete",
    "--sparse",
    "--no-owner",
    "--no-group",
    "--no-devices",
    "--no-specials",
    "--chmod=ug-s,o-wt",
    "--timeout=300",
)


@dataclass(frozen=True)
class Fetched:
    """The guest's tree as the mirror now holds it, and the paths where it differs from the baseline."""

    view: manifest.Tree
    differs: frozenset[str]
    how: str  # how the changes were found (for the log: which paths the journal named, or why a walk)


def _cache(files: SessionPaths) -> HashCache:
    """The mirror's hash cache: unchanged files' hashes from the last scan (sync.tree.hashcache), a placeholder's
    from its attribute (sync.tree.placeholders)."""
    return HashCache.load(files.hashes("mirror"), placeholders=True)


# The most entries a guest's tree may hold: it is read into memory on the host (a checkout of a large monorepo
# with its dependencies stays well below; a guest that makes millions of empty files does not).
MAX_GUEST_ENTRIES = 2_000_000
MAX_PULL_ENTRIES = MAX_GUEST_ENTRIES  # what one transfer may bring (its own name: tests lower it alone)


def _scan(files: SessionPaths) -> manifest.Manifest:
    try:
        return manifest.scan(files.guest_tree, cache=_cache(files), max_entries=MAX_GUEST_ENTRIES)
    except manifest.TooManyEntriesError as exc:
        raise VmsandboxError(
            f"the guest's tree holds more than {MAX_GUEST_ENTRIES:,} files and directories; it is not read",
            hint=f"remove what the guest generated (`vmsandbox shell {files.root.name}`), then pull again",
        ) from exc


def _held(files: SessionPaths, base: manifest.Tree, max_file_bytes: int) -> volume.Held:
    """The mirror, made if it is not there (sync.fetch.volume): its bound is FACTOR pulls' worth."""
    return volume.ensure(files, base, bound=spend.FACTOR * max_file_bytes, max_entries=MAX_GUEST_ENTRIES)


def _walked(files: SessionPaths, base: manifest.Tree, why: str, held: volume.Held) -> Fetched:
    guest = _scan(files)
    if not held.own:  # (in a file system of its own the kernel keeps the bound: no ledger to set)
        spend.rebase(files.root, files.guest_tree)
    found = delta.between(base, guest)
    delta.save(files.root, found)
    return _readable(files, base, Fetched(guest, frozenset(found), f"the whole tree was read: {why}"))


def _readable(files: SessionPaths, base: manifest.Tree, fetched: Fetched) -> Fetched:
    """The fetch, once every path where the guest differs holds data a review can read: a placeholder there
    (the guest changed only its mode) gets the baseline's data."""
    same_data = [p for p in sorted(fetched.differs) if _same_data(base.get(p), fetched.view.get(p))]
    lost = placeholders.fill(files.guest_tree, files.baseline, base, same_data)
    if lost:  # (the baseline no longer has that content: only if the mirror was tampered with)
        delta.forget(files.root)
        raise VmsandboxError(
            f"the mirror of the guest's tree stands for data the baseline no longer has at {lost[0]!r}",
            hint="pull again: the next pull reads the whole tree and fetches that file whole",
        )
    return fetched


def _same_data(base: manifest.Entry | None, guest: manifest.Entry | None) -> bool:
    """Whether a path where the guest differs holds the baseline's data there (only such a path can be a
    placeholder, unless the receiver moved one: then what a review reads fails its hash check, as any file
    that changed under it does)."""
    return base is not None and guest is not None and guest.kind == manifest.FILE and guest.digest == base.digest


def fetch_live(
    endpoint: Endpoint, workdir: str, files: SessionPaths, base: manifest.Tree, *, max_file_bytes: int
) -> Fetched:
    """Bring the guest's changes into the host mirror (rsync delta over the session's SSH) and read them.

    The guest's journal (sync.fetch.journal) names the paths that changed since the last fetch: only those travel
    and are read again. When it cannot say, the whole tree is fetched and read. The guest side runs as root
    so files the agent made with sudo come along; the host side is the unprivileged guest-data account, which
    may write no file larger than `max_file_bytes`."""
    held = _held(files, base, max_file_bytes)
    cursor = journal.load(files.root)
    known = delta.load(files.root)
    answer = journal.ask(endpoint, cursor)
    why = answer.why if known is not None else "no record of the mirror"
    if answer.paths is not None and answer.cursor is not None and known is not None:
        try:
            if answer.paths:  # placeholders named get their data first: rsync sends only the difference
                placeholders.fill(files.guest_tree, files.baseline, base, answer.paths)
                placeholders.unsettle(files.guest_tree, answer.paths)  # and their bytes are compared
                _rsync(endpoint, workdir, files, max_file_bytes, answer.paths, held=held)
                delta.refresh(files.guest_tree, base, known, answer.paths, _cache(files))
                delta.save(files.root, known)
        except proc.CommandError as exc:  # (a path that vanished meanwhile; a lying journal): walk instead
            why = f"fetching the paths it named failed (rsync exit {exc.result.returncode})"
        else:
            journal.save(files.root, answer.cursor)
            how = f"the journal named {len(answer.paths)} path(s)"
            return _readable(files, base, Fetched(delta.view(base, known), frozenset(known), how))
    delta.forget(files.root)  # the mirror is about to change under it
    _rsync(endpoint, workdir, files, max_file_bytes, None, held=held)
    fetched = _walked(files, base, why, held)
    if answer.cursor is not None:  # taken before this fetch began: the next one asks from there
        journal.save(files.root, answer.cursor)
    return fetched


def _rsync(
    endpoint: Endpoint,
    workdir: str,
    files: SessionPaths,
    max_file_bytes: int,
    only: list[str] | None,
    *,
    held: volume.Held,
    partial: bool = False,
    hint: str | None = None,
) -> list[str]:
    """rsync the guest's tree into the mirror: all of it, or `only` these paths, each with what is under it
    (deleted in the mirror where the guest has none). With `partial`, a transfer that could not read some
    paths (rsync's exit 23/24: it then deletes nothing in the mirror) is not an error: rsync's lines about
    them are returned."""
    who = accounts.guest_data_account()
    side = rsync.Side(who, accounts.guest_data_limits(max_file_bytes), files.guest_tree)
    remote = workdir.rstrip("/") + "/"
    options = [*RSYNC_PULL]
    if only is not None:
        options += ["--recursive", "--files-from=-", "--from0", "--delete-missing-args", "--force"]
    budget = spend.room(
        files,
        max_file_bytes,
        max_entries=MAX_GUEST_ENTRIES,
        pull_entries=MAX_PULL_ENTRIES,
        kernel=held.bound if held.own else None,
    )
    tally = meter.Tally()
    try:
        rsync.rsync(
            endpoint,
            options,
            f"{endpoint.host_alias}:{remote}",
            f"{files.guest_tree}/",
            side=side,
            expect_sender=True,
            remote_path=remote,
            input=None if only is None else b"".join(os.fsencode(p) + b"\0" for p in only),
            hint=hint or f"is the VM running? `vmsandbox ls`; its console: `vmsandbox logs {endpoint.session}`",
            budget=budget,
            tally=tally,
        )
    except meter.PassedError as exc:
        raise _refused(files, exc.what, endpoint.session, held) from exc
    except proc.CommandError as exc:
        if _FULL.search(exc.result.stderr):  # the file system refused before the meter read its word
            raise _refused(files, budget.full, endpoint.session, held) from exc
        _spent(files, held, tally)
        if partial and exc.result.returncode in (23, 24):
            return [line for line in exc.result.stderr.splitlines() if line.startswith("rsync: [sender]")]
        raise _explained(exc, max_file_bytes, files, held) from exc
    finally:
        if files.guest_tree.is_dir():  # (not if it was dropped)
            files.guest_tree.chmod(0o700)  # rsync gave it the mode of the guest's project directory
    _spent(files, held, tally)
    return []


_FULL = re.compile(r"No space left on device \(28\)|Disk quota exceeded \(122\)")


def _spent(files: SessionPaths, held: volume.Held, tally: meter.Tally) -> None:
    if not held.own:  # (in a file system of its own the kernel counts)
        spend.add(files.root, tally)


def _refused(files: SessionPaths, what: str, session: str, held: volume.Held) -> VmsandboxError:
    """A transfer stopped at a bound; one line says so, with the fix. The mirror holds part of it, so the next
    pull reads the whole tree again. In a file system of its own that part is within the session's bound (the
    kernel's), and what earlier pulls brought stays for the next (a person may pull a large change in parts).
    Counted, the receiver may have passed the bound by what it made faster than the meter read: then the
    mirror is dropped from the host's disk (the next pull makes it anew), or no later pull would have room."""
    delta.forget(files.root)
    found = spend.Spend() if held.own else spend.rebase(files.root, files.guest_tree)
    if found.bytes >= held.bound or found.entries >= MAX_GUEST_ENTRIES:
        volume.drop(files)
    return VmsandboxError(
        f"the guest sent {what}: it was stopped while receiving, and nothing was applied",
        hint=f"remove what the guest need not send back (`vmsandbox shell {session}`), or raise `sync_limit` in "
        "~/.config/vmsandbox/config.yaml",
    )


def _explained(exc: proc.CommandError, max_file_bytes: int, files: SessionPaths, held: volume.Held) -> VmsandboxError:
    text = exc.result.stderr
    if held.own and "Input/output error (5)" in text:  # its image could not grow: the host's disk is full
        volume.drop(files)
        return VmsandboxError(
            f"the mirror of session {files.root.name}'s guest tree could not be written: {exc.message}",
            hint=f"free space where vmsandbox keeps its state ({files.root.parent}), then pull again",
        )
    if "File too large" in text or exc.result.returncode in (-25, 128 + 25):  # EFBIG / SIGXFSZ
        return VmsandboxError(
            f"a file in the guest is larger than the {max_file_bytes // 1024**2} MiB a sync takes per file: "
            + exc.message,
            hint="remove or shrink it in the guest (`vmsandbox shell NAME`), or raise `sync_limit` in "
            "~/.config/vmsandbox/config.yaml",
        )
    if "No space left" in text:
        return VmsandboxError(
            "no space left for the mirror of the guest's tree: " + exc.message,
            hint="free space in the state directory, or remove what the guest does not need to send back",
        )
    return exc


def fetch_from_disk(
    endpoint: Endpoint, workdir: str, files: SessionPaths, base: manifest.Tree, *, max_file_bytes: int, why: str
) -> tuple[Fetched, list[str]]:
    """The VM is gone or stopped: a reader VM (session.end.diskreader) has its workspace disk mounted at `workdir`.
    The whole tree is fetched from there as from a live VM (its journal knows nothing of the session's) and
    read; the host never parses the disk. What the reader's kernel could not read (a damaged or crafted
    filesystem) is left out, and said: the second value holds rsync's lines about it."""
    delta.forget(files.root)  # the mirror is about to change under it (the session's journal cursor stays good:
    # the disk holds at least what the guest had written when the cursor was taken)
    hint = f"the reader VM of session {files.root.name} failed; the disk is unchanged: try again"
    held = _held(files, base, max_file_bytes)
    unread = _rsync(endpoint, workdir, files, max_file_bytes, None, held=held, partial=True, hint=hint)
    fetched = _walked(files, base, why, held)
    # rsync wrote whole files where placeholders were: those the guest left as they were become placeholders
    # again, so the project is not held twice more
    placeholders.thin(files.guest_tree, base, (p for p in base if p not in fetched.differs))
    return fetched, unread


def fetch_nothing(files: SessionPaths, base: manifest.Tree, why: str, *, max_file_bytes: int) -> Fetched:
    """Nothing to fetch from (the workspace disk is gone): the mirror as the last fetch left it."""
    return _walked(files, base, why, _held(files, base, max_file_bytes))
