"""Starting a session's VM on another host: warm — restored there from that host's template (template.py)
over an overlay of the template's disk, its workspace volume hot-plugged, its identity sent to the guest's
identity port through libvirt — when a template can be had; cold (a full boot, identity from fw_cfg volumes)
otherwise, or when the warm start fails. The session says which, and why it was cold.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from vmsandbox import ui
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest import identity
from vmsandbox.image import store
from vmsandbox.session.place import templates
from vmsandbox.session.place.common import IDENTITY_TIMEOUT, template_for, warm_or_cold
from vmsandbox.session.place.hostspec import HostSpec
from vmsandbox.session.place.remote import images, log, save, template, tunnel, vm
from vmsandbox.session.place.remote.images import POOL
from vmsandbox.session.place.remote.template import RemoteTemplate
from vmsandbox.session.record import Record
from vmsandbox.vm import domain, savefile
from vmsandbox.vm.virt import Hypervisor


def boot(
    record: Record, image: store.Image, hv: Hypervisor, host: HostSpec, *, cold_start: bool, boot_timeout: int
) -> None:
    """Send what the VM needs to the host and start it there (warm if it can), its tunnel open, its sshd up."""
    images.ensure(hv, host, image)
    shape = templates.shape_of(record)
    unbuilt = f"no warm-start template on host {host.name}"
    tmpl = template_for(
        record, lambda: template.ensure(image, shape, hv, host, boot_timeout), cold=cold_start, unbuilt=unbuilt
    )
    sent = vm.send(record, image, hv, host, None if tmpl is None else hv.volumes(POOL)[tmpl.vol("disk.qcow2")])
    if tmpl is None:
        vm.cold(record, image, hv, host, sent, boot_timeout)
        return
    t = tmpl

    def undo(exc: VmsandboxError) -> None:
        record.start_note = f"the warm start on host {host.name} failed: {exc.message}"
        log.fetch(record, hv)
        condemned = template.mark_failed(
            hv, t, exc.message, record.name, project=record.project, own=isinstance(exc, savefile.SaveImageError)
        )
        ui.warn(
            f"{record.start_note}; booting cold (`vmsandbox logs {record.name}` shows its console)"
            + ("; its template failed another session's warm start too: later sessions boot cold" if condemned else "")
        )
        tunnel.close(record.files.root)
        hv.destroy(record.domain)

    if warm_or_cold(record, lambda: warm(record, hv, host, t, sent, boot_timeout), undo):
        template.started(hv, t)
    else:
        cold = dataclasses.replace(sent, overlay=vm.new_overlay(record, image, hv))
        vm.cold(record, image, hv, host, cold, boot_timeout)


# why sessions on another host load a copy of their memory (Facts.memory_problem, `hosts`, `inspect`)
UNSHARED = (
    "on another host no process of this machine can hand QEMU a sealed memory file, so each session there "
    "restores a copy of its template's memory"
)


def warm(record: Record, hv: Hypervisor, host: HostSpec, tmpl: RemoteTemplate, sent: vm.Sent, timeout: int) -> None:
    """Restore the template there as the session's VM, hot-plug its workspace volume, send its identity through
    libvirt, open its tunnel and wait for its sshd. Raises (the caller boots cold instead) when any of it fails."""
    saved = save.header_of(record, hv, tmpl.vol("save"))
    boot = domain.boot_of(saved.xml)

    def spec_of() -> domain.DomainSpec:  # its fw_cfg files its own (`template` too: a fork of it reads that)
        spec = vm.spec(record, sent, boot)
        return dataclasses.replace(spec, workspace_disk=None, channel=domain.LIBVIRTS_SOCKET)

    with ui.step(f"Restoring {record.domain} on host {host.name} from its warm-start template") as detail:
        save.restore_as(record, hv, tmpl.vol("save"), saved, spec_of)
        record.start = "warm"
        record.memory, record.memory_note = None, f"its template's memory is copied: {UNSHARED}"
        record.save()
        hv.attach(record.domain, domain.workspace_xml(Path(sent.workspace)))
        detail("identity")
        wait = min(IDENTITY_TIMEOUT, timeout)

        def exchange(data: bytes) -> bytes:
            return hv.exchange(record.domain, domain.IDENTITY_PORT, data, limit=identity.REPLY_LIMIT, timeout=wait)

        identity.send_through(exchange, record.files.fwcfg_dir, timeout=wait)
        detail("sshd")
        vm.open_tunnel(record)
        vm.wait_for_sshd(record, hv, host, timeout)
