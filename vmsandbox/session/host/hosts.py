"""`vmsandbox host ls`: every libvirt host asked at once what it is and what it holds. A host that does not answer
(in time) is listed with the reason; it is never an error for the others."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from vmsandbox import ui
from vmsandbox.errors import VmsandboxError
from vmsandbox.image import store
from vmsandbox.session.host import memoryguard
from vmsandbox.session.place import choose, hostspec
from vmsandbox.session.place.hostspec import HostSpec
from vmsandbox.session.place.room import fits
from vmsandbox.session.record import DOMAIN_PREFIX
from vmsandbox.session.settings import Settings
from vmsandbox.vm import sshcheck
from vmsandbox.vm.memory import foreign, usage
from vmsandbox.vm.node import REMOTE_HINT, Node, unreachable_hint

PROBE_TIMEOUT = 20.0  # a host behind a dead route would otherwise hold `hosts` for TCP's minutes
JOIN_GRACE = 1.0  # a probe ends by its own deadline: this is for a machine too busy to wake its thread on time
T = TypeVar("T")


@dataclass(frozen=True)
class Status:
    spec: HostSpec
    node: Node | None
    problem: str | None  # why it could not be asked (None: it answered)
    sessions: int = 0  # vmsandbox domains running there
    images: tuple[str, ...] = ()  # the images it holds whole
    hint: str | None = None  # the fix for `problem`
    memory_problem: str | None = None  # why its sessions load a copy of their template's memory (None: they map it)
    footprint_mib: int | None = None  # what one session running there takes now (PSS, median; None: not known)

    @property
    def accel(self) -> str:
        if self.node is None:
            return "-"
        with choose.host(self.spec) as host:  # its node says it: nothing is asked of the host again
            return host.facts.accelerator(self.node)

    def as_dict(self, memory_mib: int = 0) -> dict[str, Any]:
        """Its facts; given the configured session memory, `room`: how many more such sessions it admits now."""
        n = self.node
        facts = ("hostname", "libvirt", "qemu", "cpus", "memory_mib", "available_mib", "reserved_mib")
        kvm_problem = None
        if n is not None:
            with choose.host(self.spec) as host:
                kvm_problem = host.facts.kvm_problem(n)
        return {
            "name": self.spec.name,
            "uri": self.spec.uri,
            "reachable": n is not None,
            "problem": self.problem,
            "hint": self.hint,
            **{k: None if n is None else getattr(n, k) for k in facts},
            "accel": None if n is None else self.accel,
            "kvm_problem": kvm_problem,
            "sessions": self.sessions,
            "max_sessions": self.spec.max_sessions,
            "keep_free_mib": self.spec.keep_free_mib,
            "images": list(self.images),
            "memory_shared": n is not None and self.memory_problem is None,
            "memory_problem": self.memory_problem,
            "session_pss_mib": self.footprint_mib,
            "memory_guard": memoryguard.said(self.spec.name == hostspec.LOCAL),
            "room": None if n is None or not memory_mib else self.room(memory_mib),
        }

    def room(self, memory_mib: int) -> int:
        """How many more sessions of `memory_mib` it admits now (0 when unreachable)."""
        if self.node is None:
            return 0
        fit = fits(self.node.available_mib, self.spec.keep_free_mib, memory_mib, self.footprint_mib)
        if self.spec.max_sessions is not None:
            fit = min(fit, max(self.spec.max_sessions - self.sessions, 0))
        return fit


def _ask(spec: HostSpec) -> Status:
    """Ask one host's libvirt what it is and what it holds (connecting to it)."""
    try:
        with choose.host(spec) as host:
            hv = host.libvirt()
            node = hv.node()
            running = [d.name for d in hv.domains(DOMAIN_PREFIX) if not d.stopped]
            images = tuple(host.images.held())
            memory = host.facts.memory_problem(node)
            # this machine's QEMUs can be measured (their /proc); another host's are not asked
            footprint = usage.footprint(running) if spec.name == hostspec.LOCAL else None
        for skipped in foreign.unsaid():  # a holder or QEMU root's look passed over reading the node: said
            ui.warn(skipped)
    except VmsandboxError as exc:
        return Status(spec, None, exc.message, hint=exc.hint)
    return Status(spec, node, None, len(running), images, memory_problem=memory, footprint_mib=footprint)


class _Later(Generic[T]):
    """call() in a daemon thread (a host that never answers must not keep the command from ending); `ended` is
    set when it returns."""

    def __init__(self, call: Callable[[], T], ended: threading.Event) -> None:
        self._value: list[T] = []
        self._error: list[BaseException] = []
        self._ended = ended
        threading.Thread(target=self._run, args=(call,), daemon=True).start()

    def _run(self, call: Callable[[], T]) -> None:
        try:
            self._value.append(call())
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread as it is
            self._error.append(exc)
        finally:
            self._ended.set()

    @property
    def done(self) -> bool:
        """Whether call() returned (what it raised is raised here)."""
        if self._error:
            raise self._error[0]
        return bool(self._value)

    @property
    def value(self) -> T:
        return self._value[0]


def probe(spec: HostSpec, timeout: float = PROBE_TIMEOUT) -> Status:
    """Ask one host, within `timeout`. A host reached over ssh is sshed to at the same time (vm/sshcheck.py):
    when its libvirt does not answer, ssh's own words say why (libvirt's transport loses them); when ssh cannot
    get through, neither can libvirt, and that is the answer."""
    deadline = time.monotonic() + timeout
    ended = threading.Event()
    asked = _Later(lambda: _ask(spec), ended)
    checked = _Later(lambda: sshcheck.check(spec.uri, timeout), ended) if sshcheck.target(spec.uri) else None
    while True:
        ended.clear()  # before looking: an end after this wakes the wait below
        if asked.done and (asked.value.node is not None or checked is None or checked.done):
            break
        if checked is not None and checked.done and checked.value is not None:
            break
        if not ended.wait(deadline - time.monotonic()):
            break
    if asked.done and asked.value.node is not None:
        return asked.value
    if checked is not None and checked.done and (why := checked.value) is not None:
        return Status(spec, None, why.said, hint=why.hint)
    no_answer = f"no answer in {timeout:.0f} s"
    if checked is None:  # not over ssh (this machine, TLS): libvirt's words and their fix
        hint = unreachable_hint("", spec.uri, spec.uri)
        return asked.value if asked.done else Status(spec, None, no_answer, hint=hint)
    problem = asked.value.problem if asked.done else no_answer
    return Status(spec, None, problem, hint=_PAST_SSH if checked.done else REMOTE_HINT)


_PAST_SSH = (
    "ssh gets through, libvirt there does not answer: check that libvirtd runs there and that the account may "
    "use it (`virsh -c URI version` from here)"
)


def probe_all(specs: list[HostSpec], timeout: float = PROBE_TIMEOUT) -> list[Status]:
    """Every host asked at once, each within `timeout`; one that has not answered by then is listed as such."""
    found: dict[int, Status] = {}

    def ask(i: int, spec: HostSpec) -> None:
        found[i] = probe(spec, timeout)

    threads = [threading.Thread(target=ask, args=(i, s), daemon=True) for i, s in enumerate(specs)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout + JOIN_GRACE
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return [found.get(i) or Status(s, None, f"no answer in {timeout:.0f} s") for i, s in enumerate(specs)]


def named(settings: Settings, name: str) -> HostSpec:
    """The host a name (`local`, or one under `hosts:`) stands for."""
    return hostspec.named(settings.libvirt_uri, settings.hosts, name)


def check_holds_images(spec: HostSpec) -> None:
    """Raise (with the fix) unless images are sent to the host (this machine uses them where they are)."""
    if not choose.abilities(spec.uri).holds_images:
        raise VmsandboxError(
            f"host {spec.name} is this machine: its images are used where they are", hint="name another host"
        )


def hold_image(spec: HostSpec, image: store.Image) -> str:
    """`image` sent to the host unless it holds it whole already: what was done, in words."""
    check_holds_images(spec)
    with choose.host(spec) as host:
        sent = host.images.hold(image)
    return f"{'sent' if sent else 'already there'} (its pool at {spec.pool_path})"


@dataclass(frozen=True)
class Placement:
    spec: HostSpec  # where the session goes (`local`: this machine)
    reason: str


def room(s: Status, memory_mib: int) -> str | None:
    """Why a session of `memory_mib` does not fit on a host that answered (None: it fits)."""
    if s.node is None:
        return s.problem or "no answer"
    try:
        choose.check(s.spec)
    except VmsandboxError:
        return "not an ssh URI (sessions reach another host over ssh)"
    if s.spec.max_sessions is not None and s.sessions >= s.spec.max_sessions:
        return f"{s.sessions} session(s) run there, its max_sessions"
    if s.node.available_mib - memory_mib < s.spec.keep_free_mib:
        return f"{s.node.available_mib} MiB available, keep_free {s.spec.keep_free_mib} MiB"
    return None


def place(found: list[Status], memory_mib: int) -> Placement:
    """The simple rule: of the hosts with room under their limits, the one with the most memory available as
    libvirt reports it (this machine on a tie); this machine when none has room."""
    fits = [s for s in found if room(s, memory_mib) is None]
    if not fits:
        why = "; ".join(f"{s.spec.name}: {room(s, memory_mib)}" for s in found)
        return Placement(found[0].spec, f"no host has room under its limits ({why}); running on this machine")
    best = max(fits, key=lambda s: s.node.available_mib if s.node else 0)  # the first (this machine) on a tie
    mib = best.node.available_mib if best.node else 0
    return Placement(best.spec, f"{mib} MiB of memory available there, the most of {len(fits)} host(s) with room")
