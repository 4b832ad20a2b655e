"""Memory shared between sessions on this machine: a warm start maps its template's memory copy-on-write
instead of loading a copy of it, and the forks of a session map the memory its fork checkpoint saved, as does
the session itself when it resumes (docs/internals.md, "Memory shared between sessions").

A save image is split (vm.memory.split) into the guest's RAM as a flat file and the rest; the RAM is copied into a
memfd, sealed (vm.memory.sealed: no process can change a byte of it any more) and held by a holder process of QEMU's
account (vm.memory.hold), where QEMU opens it: /proc/PID/fd/N. A session's domain names that path as its memory
backend, mapped privately (vm.rambackend.with_memory), and restores the rest: it loads no RAM at all, and the pages
it never writes stay one copy in the host's memory, however many sessions map them.

A template's holder outlives the command that started it (a file in the runtime directory says where it is; gc
stops it once the template is superseded); a fork's lives as long as the fork command (its QEMUs keep the file
mapped after: a memfd lives while anything maps it).

Where it cannot be done here, `problem()` says why, every session restores a copy of its memory as before, and
its record says so (record.memory_note: `inspect`; `doctor` and `hosts` say it of the host).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from vmsandbox import filewrite, paths, proc, ui
from vmsandbox.confine import access
from vmsandbox.errors import VmsandboxError
from vmsandbox.session.place.interface import Sharing, Tidy
from vmsandbox.session.place.local import template
from vmsandbox.vm import node
from vmsandbox.vm.memory import foreign, holders, sealed, split, usage
from vmsandbox.vm.virt import Hypervisor

SWITCH = "VMSANDBOX_SHARE_MEMORY"  # "0" (or off, no, false): every session loads a copy of its memory, as before
# A fork's memory is a session's own (what its agent read, its tokens), not a template's (public: the image's): a
# sealed copy of it could be read by every QEMU of this host, of every account, since they all run as one account
# and a holder's fd is theirs to open. So forks share it only when asked: "1" (or on, yes, true).
FORK_SWITCH = "VMSANDBOX_SHARE_FORK_MEMORY"
MIN_QEMU = (5, 0)  # -machine memory-backend= (the RAM backend chosen by id) came with QEMU 5.0
STATE = "memory.state"  # beside a checkpoint's memory.save: its split for forks
REFRESH_SLACK = 256 << 20  # a template's held copy grown past twice its memory and this: a fresh one (_grown)
HOLDER_EXIT_TIMEOUT = 10.0  # a fork's holder, told to end (its stdin closed), ends at once: past this it is killed


@dataclass(frozen=True)
class Shared:
    """A memory file sessions map: the holder that keeps it, and the save image to restore over it."""

    held: sealed.Held
    state: Path  # the save image without the RAM
    source: str  # what it is, for record.memory: a template's memory.ram, or the memory a fork was made at
    lease: int | None = None  # a template's: held from the look at its holder until the QEMU maps its file

    def release(self) -> None:
        """The QEMU maps the file now (or will not): gc and the memory guard may judge its holder again."""
        if self.lease is not None:
            with contextlib.suppress(OSError):
                os.close(self.lease)


def problem(hv: Hypervisor, accel: str) -> str | None:
    """Why sessions of accelerator `accel` cannot share memory here (None: they can)."""
    if os.environ.get(SWITCH, "1").strip().lower() in ("0", "off", "no", "false"):
        return f"turned off ({SWITCH}={os.environ[SWITCH]})"
    if os.geteuid() != 0:
        return (
            "vmsandbox runs unprivileged: only root may start the process of QEMU's account that hands QEMU a "
            "sealed memory file"
        )
    qemu = tuple(int(p) for p in hv.qemu_version().split(".")[:2])
    if qemu < MIN_QEMU:
        return f"QEMU {hv.qemu_version()} is older than {'.'.join(map(str, MIN_QEMU))} (no -machine memory-backend)"
    taking = sealed.taking_problem()
    if taking is not None:
        return taking
    return _confinement_problem(hv.confinement(), accel)


def _confinement_problem(c: node.Confinement, accel: str) -> str | None:
    kind = "kvm" if accel == "kvm" else "qemu"
    other = [m for m in c.models if m != "dac"]
    if other:
        return f"libvirt confines QEMU with {', '.join(other)} here: QEMU could not open the holder's memory file"
    owner = c.accounts.get(kind)
    if owner is None:
        return "libvirt does not say which account runs QEMU here (no DAC base label in its capabilities)"
    if owner[0] == 0:
        return "libvirt runs QEMU as root here (qemu.conf `user`), without the capabilities to open the memory file"
    return None


def owner(hv: Hypervisor, accel: str) -> tuple[int, int]:
    """QEMU's account (uid, gid); raises with why sessions cannot share memory here."""
    why = problem(hv, accel)
    if why is not None:
        raise VmsandboxError(why)
    return hv.confinement().accounts["kvm" if accel == "kvm" else "qemu"]


# --- a template's memory: one holder per template, for every session of every command ---


def of_template(tmpl: template.Template, hv: Hypervisor, accel: str) -> Shared:
    """The template's memory, sealed and held (its holder started now if none runs); raises with why not."""
    who = owner(hv, accel)
    template.split_memory(tmpl)
    entry = _entry(tmpl)
    entry.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with access.flocked(entry.with_suffix(".lock"), wait="Waiting for another vmsandbox that loads this memory"):
        held = holders.read(entry)
        seen = None if held is None else held.look()
        if isinstance(seen, str) and held is not None:  # (it runs, and holds no longer what root gave it)
            ui.warn(f"{seen}: that holder is stopped, and a fresh copy of the template's memory sealed")
            held.stop()
        elif held is not None and seen is not None and _grown(held, tmpl) and not _mapped(held):
            held.stop()  # no session maps it any more: a fresh copy gives its grown part back
            seen = None
        if held is None or not isinstance(seen, foreign.Memfd):
            held = _start(tmpl, who)
            checked = held.look()
            if not isinstance(checked, foreign.Memfd):  # (one root cannot look at: none is left running for the next)
                held.stop()
                raise VmsandboxError(f"the memory holder started, but root could not check it: {checked or 'it ended'}")
            filewrite.write_atomically(entry, json.dumps({**held.as_dict(), "template": str(tmpl.path)}) + "\n")
        lease = holders.lease(entry)  # (taken before the lock is let go: no look of gc's or the guard's comes between)
    return Shared(held, tmpl.state, str(tmpl.ram), lease)


def _grown(held: sealed.Held, tmpl: template.Template) -> bool:
    """Whether the held copy grew well past the template's memory: tmpfs gives a hole of the file a page of its own
    the first time it is read through a session's mapping (a copy-on-write fault, a save's read of every page),
    zeros that stay in the file for good — memory that only a fresh copy gives back. Only once no session maps
    it: a fresh copy while sessions still map the grown one would hold both, and grow too at the next save (one
    copy per template grows at most to the template's memory; usage.shared_file)."""
    st = held.stat()
    if st is None:
        return False
    return st.blocks * 512 > 2 * tmpl.ram.stat().st_blocks * 512 + REFRESH_SLACK


def _mapped(held: sealed.Held) -> bool:
    """Whether the QEMU of a running session maps the held file (or may: one root cannot look at)."""
    st = held.stat()
    mapped = None if st is None else usage.mapped_keys()
    return st is not None and (mapped is None or st.key in mapped)


def _entry(tmpl: template.Template) -> Path:
    """Where the holder of a template's memory says where it is (its name: the template's path and file)."""
    st = tmpl.ram.stat()
    key = hashlib.sha256(f"{tmpl.path.resolve()}:{st.st_dev}:{st.st_ino}".encode()).hexdigest()[:16]
    return paths.memory_holders_dir() / f"{key}.json"


def _start(tmpl: template.Template, who: tuple[int, int]) -> sealed.Held:
    with ui.step("Loading the template's memory for sessions to share (once)"):
        fd = sealed.create(f"vmsandbox-{tmpl.path.name}", tmpl.ram.stat().st_size)
        try:
            sealed.fill(fd, tmpl.ram)
            sealed.seal(fd, who)
            held, _child = sealed.hold(fd, who, detached=True)
        finally:
            os.close(fd)
    return held


def sweep(hv: Hypervisor, tidy: Tidy) -> Iterator[str]:
    """gc: the holders of templates that are gone, failed or superseded (new sessions never map them again; those
    that do keep their mapping), those whose copy grew and no session maps (the next warm start seals a fresh
    one), and the records of holders that ended."""
    for entry in sealed.holder_entries():
        # under the entry's lock, as a warm start writes it: a holder started meanwhile is never unrecorded
        with holders.judged(entry) as mine:
            if not mine:
                continue  # a warm start is loading this memory now: its record is current
            held, named = holders.read(entry), holders.template_of(entry)
            where = None if named is None else Path(named)
            seen = None if held is None else held.look()
            if isinstance(seen, str) and held is not None:  # it runs, and holds no longer what root gave it
                what = f"the memory holder of {where or entry} ({seen})"
                yield tidy("stop", what, functools.partial(holders.release, entry, held))
            elif held is None or where is None or seen is None:
                what = f"the record of a memory holder that ended ({entry})"
                yield tidy("remove", what, functools.partial(entry.unlink, missing_ok=True))
            elif not template.is_current(where, hv):
                what = f"the memory holder of {where} (pid {held.pid}: that template serves no new session)"
                yield tidy("stop", what, functools.partial(holders.release, entry, held))
            elif _grown(held, template.Template(where, {})) and not _mapped(held):
                # a copy grown by a save stays grown until that template's next warm start: up to its guest's RAM
                what = f"the memory holder of {where} (pid {held.pid}: its copy grew, and no session maps it)"
                yield tidy("stop", what, functools.partial(holders.release, entry, held))


# --- a checkpoint's memory, for the source and the forks made from it by one command ---

_HELD: dict[Path, Shared] = {}
_LOCK = threading.Lock()


@contextlib.contextmanager
def of_checkpoint(save: Path, what: str, hv: Hypervisor, accel: str) -> Iterator[Sharing]:
    """While it lasts, restores from save image `save` (a fork's checkpoint: `what`, in words) in this process map
    one sealed copy of its RAM (split_of finds it): the source resuming and its forks share the pages none of them
    writes. Yields what was done; where it cannot be done, why (each restores a copy then)."""
    state = save.with_name(STATE)
    if os.environ.get(FORK_SWITCH, "").strip().lower() not in ("1", "on", "yes", "true"):
        yield Sharing(None, f"a session's own memory is shared only with {FORK_SWITCH}=1")
        return
    try:
        who = owner(hv, accel)
        state.unlink(missing_ok=True)
        with ui.step("Sealing the saved memory for the session and its forks to share"):
            made, held, child = _seal_split(save, state, who)
    except (VmsandboxError, OSError) as exc:
        state.unlink(missing_ok=True)
        yield Sharing(None, exc.message if isinstance(exc, VmsandboxError) else str(exc))
        return
    with _LOCK:
        _HELD[save] = Shared(held, state, what)
    try:
        yield Sharing(made.pages * split.PAGE)
    finally:
        with _LOCK:
            _HELD.pop(save, None)
        # the holder ends (the QEMUs that map the file keep it); one held up (a process of its account may trace
        # it) is killed, and one that does not end even so is left, never waited for
        sealed.end(child, HOLDER_EXIT_TIMEOUT)
        state.unlink(missing_ok=True)


def _seal_split(save: Path, state: Path, who: tuple[int, int]) -> tuple[split.Split, sealed.Held, proc.Child]:
    fd = sealed.create(f"vmsandbox-{save.parent.name}", 0)
    try:
        made = split.split(save, fd, state)
        sealed.seal(fd, who)
        held, child = sealed.hold(fd, who, detached=False)
    finally:
        os.close(fd)
    return made, held, child


def split_of(save: Path) -> Shared | None:
    """The sealed copy of save image `save`'s memory this process holds (of_checkpoint), or None."""
    with _LOCK:
        return _HELD.get(save)
