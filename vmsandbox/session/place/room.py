"""Whether a host has room for one more session, one rule wherever a session starts (this machine or another
host): under its `max_sessions`, and with its `keep_free` still free if the newcomer came to fill all of its
memory (a session that maps its template's memory starts with a fraction of it, but may write every page).
And how many more sessions fit there now, from what its running sessions take (`host ls`)."""

from __future__ import annotations

from vmsandbox.errors import VmsandboxError
from vmsandbox.session.place.hostspec import LOCAL, HostSpec
from vmsandbox.session.record import DOMAIN_PREFIX
from vmsandbox.vm.virt import Hypervisor


def check(hv: Hypervisor, host: HostSpec, memory_mib: int) -> None:
    """Before anything is made there: the host's limits (`max_sessions`, `keep_free`) leave room for one more."""
    running = sum(1 for d in hv.domains(DOMAIN_PREFIX) if not d.stopped)
    if host.max_sessions is not None and running >= host.max_sessions:
        raise VmsandboxError(
            f"host {host.name} runs {running} session(s), its max_sessions",
            hint="destroy one there (`vmsandbox ls` shows the HOST), pick another --host, or raise its max_sessions",
        )
    available = hv.node().available_mib
    if available - memory_mib < host.keep_free_mib:
        here = host.name == LOCAL  # (this machine's keep_free is the default: only other hosts are configured)
        raise VmsandboxError(
            f"{'this machine' if here else f'host {host.name}'} has {available} MiB of memory available: a "
            f"{memory_mib} MiB session would leave less than its keep_free ({host.keep_free_mib} MiB)",
            hint="end a session (`vmsandbox ls`), give this one less --memory, or "
            + ("run it on another host (--host)" if here else "pick another --host, or lower that host's keep_free"),
        )


def fits(available_mib: int, keep_free_mib: int, memory_mib: int, footprint_mib: int | None) -> int:
    """How many more sessions of `memory_mib` `check` would admit, one after another, each taking
    `footprint_mib` once started (what one running there takes now; None: none runs, so its whole memory)."""
    spare = available_mib - keep_free_mib - memory_mib
    if spare < 0:
        return 0
    return spare // max(footprint_mib or memory_mib, 1) + 1
