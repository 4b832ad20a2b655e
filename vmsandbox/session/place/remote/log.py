"""The serial console of a session on another host. virtlogd writes it there, into the host's pool as
`DOMAIN.console.log` (rotated at 2 MiB); `logs` reads a copy here, fetched through libvirt, and `logs
--follow` keeps that copy growing while it prints it. The guest writes the console: the copy is shown escaped,
as a local one is, and never more than CONSOLE_LIMIT is read at a time."""

from __future__ import annotations

import threading
import time

from vmsandbox import filewrite
from vmsandbox.errors import VmsandboxError
from vmsandbox.session.place.remote.images import POOL
from vmsandbox.session.record import Record
from vmsandbox.vm.virt import Hypervisor

CONSOLE_LIMIT = 4 * 1024 * 1024  # virtlogd rotates at 2 MiB: all of it
FOLLOW_SECONDS = 1.0


def _read(record: Record, hv: Hypervisor) -> bytes | None:
    return console_of(hv, f"{record.domain}.console.log")


def console_of(hv: Hypervisor, name: str) -> bytes | None:
    """Console volume NAME there, at most CONSOLE_LIMIT of it (None: no such volume)."""
    if name not in hv.volumes(POOL):
        return None
    return bytes(hv.download(POOL, name, keep=CONSOLE_LIMIT, length=CONSOLE_LIMIT).kept)


def fetch(record: Record, hv: Hypervisor) -> bytes:
    """The console as its host has it now, into the session's console log here (and returned)."""
    got = _read(record, hv)
    if got is not None:
        filewrite.write_atomically(record.files.console_log, got)  # (the guest's bytes, as virtlogd writes them)
    return got or b""


def refresh(record: Record, hv: Hypervisor, *, follow: bool) -> None:
    """`logs`: the copy here brought up to date; with `follow`, a daemon thread keeps appending what the host's
    console gains (all of a new file when virtlogd rotated it), until the command ends (on a connection of its
    own: it outlives the operation whose connection `hv` is)."""
    seen = fetch(record, hv)
    if follow:
        threading.Thread(target=_follow, args=(record, seen), daemon=True, name="console-follow").start()


def _follow(record: Record, seen: bytes) -> None:
    try:
        with Hypervisor(record.libvirt_uri) as hv:
            while True:
                time.sleep(FOLLOW_SECONDS)
                now = _read(record, hv)
                if now is None or now == seen:
                    continue
                new = now[len(seen) :] if now.startswith(seen) else now  # grown, or rotated
                with record.files.console_log.open("ab") as out:
                    out.write(new)
                seen = now
    except VmsandboxError:  # the host stopped answering: what was printed stays; the command goes on waiting
        return
