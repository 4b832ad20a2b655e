"""Root's records of the holders of templates' memory (paths.memory_holders_dir: one JSON file per template, named
by session.place.local.sharing): read, judged under their lock and lease, stopped — and every copy no session maps
given back, which the memory guard does before it stops a session.

A warm start writes a record under its lock and holds a shared lease on it from its look at the holder until its
QEMU maps the file; gc and the guard stop a holder only when they take both alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

from vmsandbox.vm.memory import sealed, usage

RELEASE_WAIT = 2.0  # a holder told to end ends at once; one that does not (traced, held up) keeps its record


def read(entry: Path) -> sealed.Held | None:
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return sealed.Held.of(json.loads(entry.read_text()))
    return None


def template_of(entry: Path) -> str | None:
    """The template whose memory the record's holder holds, as the record says."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return str(json.loads(entry.read_text())["template"])
    return None


def lease(entry: Path) -> int:
    """A shared flock on the entry's lease (its descriptor: close it once the QEMU maps the file). Taken under the
    entry's lock, under which alone gc and the guard take it: never a wait."""
    fd = os.open(entry.with_suffix(".lease"), os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


@contextlib.contextmanager
def judged(entry: Path) -> Iterator[bool]:
    """Whether the entry's holder is gc's and the guard's to judge now: no warm start writes its record (its lock)
    nor is between its look at the holder and its QEMU's mapping (its lease)."""
    with _alone(entry.with_suffix(".lock")) as mine, _alone(entry.with_suffix(".lease")) as free:
        yield mine and free


@contextlib.contextmanager
def _alone(path: Path) -> Iterator[bool]:
    fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def release(entry: Path, held: sealed.Held) -> bool:
    """Stop the holder (the sessions that map its file keep it: a memfd lives while one maps it) and, once it has
    ended, its record (its lock and lease files stay: unlinked, two processes could each hold "the" lock)."""
    ended = held.stop(wait=RELEASE_WAIT)
    if ended:
        entry.unlink(missing_ok=True)
    return ended


def give_back() -> list[tuple[str, int]]:
    """Stop the holder of every template copy no session maps: what the memory guard gives back before it stops a
    session — (the template, the MiB its copy held) of each. A warm start seals a fresh copy when it needs one
    (~0.2 s). While a QEMU root cannot look at runs, none is: it may map any (its holder gone, the reservation would
    forget that file's holes)."""
    freed = []
    for entry in sealed.holder_entries():
        with judged(entry) as mine:
            held = read(entry) if mine else None  # (a warm start is loading this memory now: left)
            st = None if held is None else held.stat()
            mapped = None if st is None else usage.mapped_keys()  # (looked at now; None: a QEMU root cannot see)
            if held is None or st is None or mapped is None or st.key in mapped:
                continue
            where = template_of(entry) or entry.stem  # (read before its record goes)
            if release(entry, held):  # (one that runs on, traced or held up, holds its file: not given back)
                freed.append((where, st.blocks * 512 >> 20))
    return freed
