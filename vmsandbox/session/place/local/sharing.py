"""Memory shared between sessions on this machine: a warm start maps its template's memory copy-on-write
instead of loading a copy of it, and the forks of a session map the memory its fork checkpoint saved, as does
the session itself when it resumes (docs/internals.md, "Memory shared between sessions").

A save image is split (vm.memory.split) into the guest's RAM as a flat file and the rest; the RAM is copied into a
memfd and sealed (vm.memory.sealed: no process can change a byte of it any more). Each session's QEMU runs as an
account of its own (confine.pool), and the kernel lets a process open /proc/PID/fd/N only of a process of its own
account: so for each restore, root hands the file to a relay of the session's account (vm.memory.hold, `eof`),
the domain names /proc/RELAY/fd/N as its memory backend, mapped privately (vm.rambackend.with_memory), restores
the rest, and the relay ends once its QEMU maps the file. The session loads no RAM at all, and the pages it never
writes stay one copy in the host's memory, however many sessions of however many accounts map them. No account
reaches the file but through a relay of its own, or a QEMU of its own that maps it.

A template's file is kept by root's keeper, which outlives the command that started it (a file in the runtime
directory says where it is; gc stops it once the template is superseded) and hands it to root alone; a fork's by
the fork command itself, as long as it lasts (its QEMUs keep the file mapped after: a memfd lives while anything
maps it). So a fork and its source share their copy by default: only their two accounts ever reach it.

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from vmsandbox import filewrite, paths, ui
from vmsandbox.confine import access
from vmsandbox.errors import VmsandboxError
from vmsandbox.session.place.interface import Sharing, Tidy
from vmsandbox.session.place.local import template
from vmsandbox.vm import node
from vmsandbox.vm.memory import foreign, holders, sealed, split, usage
from vmsandbox.vm.virt import Hypervisor

SWITCH = "VMSANDBOX_SHARE_MEMORY"  # "0" (or off, no, false): every session loads a copy of its memory, as before
# A fork's memory is a session's own (what its agent read, its tokens), not a template's (public: the image's): it is
# shared only where the source and each fork run under accounts of their own (confine.pool), so that no other
# session's QEMU can reach the copy; "0" (or off, no, false) turns it off even so.
FORK_SWITCH = "VMSANDBOX_SHARE_FORK_MEMORY"
MIN_QEMU = (5, 0)  # -machine memory-backend= (the RAM backend chosen by id) came with QEMU 5.0
STATE = "memory.state"  # beside a checkpoint's memory.save: its split for forks
REFRESH_SLACK = 256 << 20  # a template's held copy grown past twice its memory and this: a fresh one (_grown)
HOLDER_EXIT_TIMEOUT = 10.0  # a fork's holder, told to end (its stdin closed), ends at once: past this it is killed


@dataclass(frozen=True)
class Shared:
    """A memory file sessions map: how to have a descriptor of it, and the save image to restore over it."""

    key: tuple[int, int]  # the sealed file's (device, inode): what a restored QEMU must map, and nothing else
    give: Callable[[], int]  # a descriptor of the file, root's own (the caller closes it)
    state: Path  # the save image without the RAM
    source: str  # what it is, for record.memory: a template's memory.ram, or the memory a fork was made at
    lease: int | None = None  # a template's: held from the look at its keeper until the QEMU maps its file

    def release(self) -> None:
        """The QEMU maps the file now (or will not): gc and the memory guard may judge its keeper again."""
        if self.lease is not None:
            with contextlib.suppress(OSError):
                os.close(self.lease)


@contextlib.contextmanager
def relayed(shared: Shared, account: tuple[int, int]) -> Iterator[str]:
    """The path at which a QEMU of `account` opens the shared file: a relay of that account holds it while this
    lasts (the restore that maps it), and ends after."""
    fd = shared.give()
    try:
        held, child = sealed.hold(fd, account, detached=False)
    finally:
        os.close(fd)
    try:
        yield held.path
    finally:
        sealed.end(child, HOLDER_EXIT_TIMEOUT)


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
    """The template's memory, sealed and kept (its keeper started now if none runs); raises with why not."""
    owner(hv, accel)  # (raises with why sessions cannot share memory here)
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
        if held is not None and isinstance(seen, foreign.Memfd) and not _serves(entry):
            held.stop()  # a holder of QEMU's account (before sessions had accounts of their own): a keeper instead
            seen = None
        if held is None or not isinstance(seen, foreign.Memfd):
            held = _start(tmpl, entry.with_suffix(".sock"))
            checked = held.look()
            if not isinstance(checked, foreign.Memfd):  # (one root cannot look at: none is left running for the next)
                held.stop()
                raise VmsandboxError(f"the memory keeper started, but root could not check it: {checked or 'it ended'}")
            said = {**held.as_dict(), "template": str(tmpl.path), "socket": str(entry.with_suffix(".sock"))}
            filewrite.write_atomically(entry, json.dumps(said) + "\n")
            seen = checked
        lease = holders.lease(entry)  # (taken before the lock is let go: no look of gc's or the guard's comes between)
    keeper, socket = held, entry.with_suffix(".sock")
    return Shared(seen.key, lambda: sealed.fetch(socket, keeper), tmpl.state, str(tmpl.ram), lease)


def _serves(entry: Path) -> bool:
    """Whether the entry's holder is root's keeper (it names its socket)."""
    with contextlib.suppress(OSError, ValueError, TypeError):
        return bool(json.loads(entry.read_text()).get("socket"))
    return False


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


def _start(tmpl: template.Template, socket: Path) -> sealed.Held:
    with ui.step("Loading the template's memory for sessions to share (once)"):
        fd = sealed.create(f"vmsandbox-{tmpl.path.name}", tmpl.ram.stat().st_size)
        try:
            sealed.fill(fd, tmpl.ram)
            sealed.seal(fd)
            held, _child = sealed.hold(fd, (0, 0), detached=True, serve=socket)
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
def of_checkpoint(save: Path, what: str, hv: Hypervisor, accel: str, account: int | None) -> Iterator[Sharing]:
    """While it lasts, restores from save image `save` (a fork's checkpoint: `what`, in words) in this process map
    one sealed copy of its RAM (split_of finds it): the source resuming and its forks share the pages none of them
    writes. Only where the source runs as an account of its own (`account`; each fork gets one too): else no
    other session's QEMU could be kept from the copy. Yields what was done; where it cannot be done, why (each
    restores a copy then)."""
    state = save.with_name(STATE)
    if os.environ.get(FORK_SWITCH, "1").strip().lower() in ("0", "off", "no", "false"):
        yield Sharing(None, f"turned off ({FORK_SWITCH}={os.environ[FORK_SWITCH]})")
        return
    if account is None:
        yield Sharing(
            None, "the session runs as libvirt's QEMU account, as every session of it: its memory is not shared"
        )
        return
    try:
        owner(hv, accel)
        state.unlink(missing_ok=True)
        with ui.step("Sealing the saved memory for the session and its forks to share"):
            made, fd = _seal_split(save, state)
    except (VmsandboxError, OSError) as exc:
        state.unlink(missing_ok=True)
        yield Sharing(None, exc.message if isinstance(exc, VmsandboxError) else str(exc))
        return
    st = os.fstat(fd)
    with _LOCK:
        _HELD[save] = Shared((st.st_dev, st.st_ino), functools.partial(os.dup, fd), state, what)
    try:
        yield Sharing(made.pages * split.PAGE)
    finally:
        with _LOCK:
            _HELD.pop(save, None)
        os.close(fd)  # (the QEMUs that map the file keep it)
        state.unlink(missing_ok=True)


def _seal_split(save: Path, state: Path) -> tuple[split.Split, int]:
    fd = sealed.create(f"vmsandbox-{save.parent.name}", 0)
    try:
        made = split.split(save, fd, state)
        sealed.seal(fd)
    except BaseException:
        os.close(fd)
        raise
    return made, fd


def split_of(save: Path) -> Shared | None:
    """The sealed copy of save image `save`'s memory this process holds (of_checkpoint), or None."""
    with _LOCK:
        return _HELD.get(save)
