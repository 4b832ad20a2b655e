"""Starting a session's VM: warm (restored from its image's template, then given its identity over the identity
port) when a template can be had, cold (a full boot, identity from fw_cfg) otherwise — and the session says
which, and why it was cold."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path

from vmsandbox import failpoint, filewrite, paths, pids, proc, ui
from vmsandbox.egress import control, ports
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest import identity, ssh
from vmsandbox.image import store
from vmsandbox.session.place import console, templates
from vmsandbox.session.place.common import IDENTITY_TIMEOUT, nothing, template_for, warm_or_cold
from vmsandbox.session.place.interface import Launched
from vmsandbox.session.place.local import bootwait, owned, sharing, template
from vmsandbox.session.record import Record
from vmsandbox.vm import accel, domain, qemuimg, rambackend, savefile
from vmsandbox.vm.domain import DomainSpec, Forward
from vmsandbox.vm.memory import bound, usage
from vmsandbox.vm.node import PortTakenError
from vmsandbox.vm.virt import Hypervisor

PORT_ATTEMPTS = 4
RESTORE_IMAGE = "restore.save"  # the session's copy of the template's memory, deleted once restored


def spec(record: Record, boot: tuple[Path, Path, str], *, warm: bool, workspace: bool) -> DomainSpec:
    """The session's VM on this machine, booting (or restored with) `boot`'s kernel, initrd and command line:
    with the `template` marker among its fw_cfg files when `warm` (read by a VM restored from a template), its
    workspace disk attached unless it is hot-plugged later."""
    files = record.files
    fwcfg = {f.name: f for f in sorted(files.fwcfg_dir.iterdir())}
    if not warm:
        fwcfg.pop("template", None)
    kernel, initrd, cmdline = boot
    if record.account is not None:
        kernel, initrd = owned.own_copy(record, kernel, owned.KERNEL), owned.own_copy(record, initrd, owned.INITRD)
    return DomainSpec(
        name=record.domain,
        session=record.name,
        session_dir=files.root,
        accel=accel.Accel(record.accel),
        cpus=record.cpus,
        memory_mib=record.memory_mib,
        disk=record.system_disk,
        kernel=kernel,
        initrd=initrd,
        cmdline=cmdline,
        console_log=files.console_log,
        forwards=(Forward(record.ssh_port, 22),),
        fwcfg_files=fwcfg,
        workspace_disk=record.workspace_disk if workspace else None,
        workspace_format=record.workspace_format,
        workspace_backing=record.workspace_backing_disk,
        channel=files.identity_socket,
        account=owned.checked_account(record),
        chain=owned.chain_of(record),
    )


def booting(image: store.Image) -> tuple[Path, Path, str]:
    return image.kernel, image.initrd, image.kernel_cmdline


def new_port(record: Record) -> None:
    """Give the session a free loopback port for the guest's SSH, with its pinned host key and ssh config."""
    files = record.files
    record.ssh_port = ports.free_port()
    ssh.write_known_hosts(files, record.ssh_port, files.host_key.with_suffix(".pub").read_text())
    record.endpoint().write_config()


def on_a_free_port(record: Record, launch: Callable[[], None], *, keep: bool = False) -> None:
    """Pick a free loopback port for the guest's SSH (with `keep`, try the session's own first) and launch the VM
    on it; another, if a process took the port between our pick and QEMU's bind."""
    last: VmsandboxError | None = None
    for attempt in range(PORT_ATTEMPTS):
        if attempt or not keep:
            new_port(record)
        try:
            launch()
        except PortTakenError as exc:
            last = exc
            continue
        bounded(record)
        guarded()
        return
    raise VmsandboxError(
        f"no free port for SSH after {PORT_ATTEMPTS} tries: {last}",
        hint="too many ports on 127.0.0.1 are taken; free some and retry",
    )


def bounded(record: Record) -> None:
    """The session's QEMU may not grow past its guest's RAM and QEMU's overhead (vm.memory.bound): the record says
    the limit, or why there is none."""
    pid = usage.qemu_pid(record.domain)
    why = "its QEMU was not found" if pid is None else bound.limit(pid, record.memory_mib)
    record.memory_limit_mib = bound.limit_mib(record.memory_mib) if why is None else None
    record.memory_limit_note = why or ""


def guarded() -> None:
    """This machine's memory guard watches the sessions of this sessions directory from now on: started unless it
    runs (root's only: it reads every QEMU's memory, and root's sessions are the ones it stops). Two commands may
    start one at once: the second ends, on the guard's lock."""
    if os.geteuid() != 0:
        return
    root = paths.sessions_dir()
    if pids.runs(root / paths.GUARD_PID, paths.GUARD_MODULE):
        return
    try:
        proc.spawn_detached(proc.own_module(paths.GUARD_MODULE), log_file=root / paths.GUARD_LOG)
    except (OSError, VmsandboxError) as exc:  # the session runs: without its guard, which is said
        ui.warn(f"this machine's memory guard did not start ({exc}): sessions run unguarded until the next one starts")


def cold(record: Record, image: store.Image, hv: Hypervisor, boot_timeout: int, launched: Launched = nothing) -> None:
    if record.disk is None:
        qemuimg.create_overlay(image.disk, record.system_disk, record.disk_mib * 1024 * 1024, depth=2)
        record.system_disk.chmod(0o600)
        record.below = str(image.disk)

    def launch() -> None:
        xml = domain.build_xml(spec(record, booting(image), warm=False, workspace=True))
        filewrite.write_atomically(record.files.domain_xml, xml)
        filewrite.own_file(record.files.console_log)
        hv.create(xml)

    on_a_free_port(record, launch)
    launched()
    record.start, record.identity_port = "cold", False
    record.memory, record.memory_note = None, "a cold boot: its memory is its own"
    record.save()
    failpoint.hit("run.boot")
    title = f"Booting {record.domain} ({record.accel.upper()}, {record.cpus} vCPU, {record.memory_mib} MiB)"
    b = bootwait.Booting(record.domain, record.files.console_log, record.name, record.accel, title)
    waited = bootwait.wait(
        b, hv, boot_timeout, lambda alive: ssh.wait_for_banner(record.ssh_port, timeout=boot_timeout, alive=alive)
    )
    record.boot_seconds = round(waited, 1)
    record.save()


def warm(
    record: Record,
    image: store.Image,
    tmpl: template.Template,
    hv: Hypervisor,
    boot_timeout: int,
    launched: Launched = nothing,
) -> None:
    """Restore the template over a fresh overlay of the session's own — mapping its memory (shared with every
    session of the template) where this machine can, else loading a copy — hot-plug the workspace disk, send the
    identity, wait for sshd. Raises (the caller boots cold instead) when any of it fails."""
    files = record.files
    qemuimg.create_overlay(tmpl.disk, record.system_disk, depth=3)
    record.system_disk.chmod(0o600)
    record.template, record.below = str(tmpl.path), str(tmpl.disk)
    saved = savefile.read(tmpl.memory)
    shared = _template_memory(record, tmpl, hv)

    def launch() -> None:
        xml = domain.for_restore(saved.xml, spec(record, booting(image), warm=True, workspace=False))
        restore_shared(record, hv, shared, xml, tmpl.memory)

    with ui.step(f"Restoring {record.domain} from its warm-start template") as detail:
        try:
            on_a_free_port(record, launch)
        finally:
            if shared is not None:
                shared.release()  # its QEMU maps the file now (or never will)
        launched()
        record.start = "warm"
        record.save()
        failpoint.hit("run.restore")
        xml = domain.workspace_xml(record.workspace_disk, record.workspace_format, record.workspace_backing_disk)
        hv.attach(record.domain, xml)
        detail("identity")
        # the guest answers once sshd listens (PID 1's job that started it has ended): no banner to wait for,
        # and a probe would cost the guest a login's start-up
        record.identity_port = identity.send(
            files.identity_socket, files.fwcfg_dir, timeout=min(IDENTITY_TIMEOUT, boot_timeout)
        )


def _template_memory(record: Record, tmpl: template.Template, hv: Hypervisor) -> sharing.Shared | None:
    """The template's memory for the session to map, or None (record.memory_note says why: it loads a copy)."""
    try:
        return sharing.of_template(tmpl, hv, record.accel)
    except (VmsandboxError, OSError, ValueError) as exc:  # (memory it cannot share is a copy, never a failed start)
        said = exc.message if isinstance(exc, VmsandboxError) else f"{type(exc).__name__}: {exc}"
        record.memory_note = f"its template's memory is copied: {said}"
        return None


def restore_shared(
    record: Record, hv: Hypervisor, shared: sharing.Shared | None, restored_xml: str, whole: Path
) -> None:
    """Restore `restored_xml` as the session's VM mapping `shared` (record.memory names it), or — without it, or
    when that restore fails (a holder that ended between our look and QEMU's) — from the save image `whole`,
    its memory then its own (record.memory_note says why)."""
    if shared is not None:
        try:
            with sharing.relayed(shared, _account(record, hv)) as path:
                restore_as(record, hv, shared.state, rambackend.with_memory(restored_xml, path), paused=True)
            _maps_the_held_file(record, shared)
            bounded(record)  # (before its guest runs a single instruction)
            hv.resume(record.domain)
        except PortTakenError:
            raise
        except VmsandboxError as exc:
            hv.destroy(record.domain)
            record.memory_note = f"mapping its memory failed ({exc.message}); it loaded a copy"
            ui.warn(f"session {record.name}: {record.memory_note}")
        else:
            record.memory, record.memory_note = str(shared.source), ""
            return
    restore_as(record, hv, whole, restored_xml)
    record.memory = None


def _account(record: Record, hv: Hypervisor) -> tuple[int, int]:
    """The account the session's QEMU runs as: its own, or libvirt's QEMU account."""
    if record.account is not None:
        return record.account, record.account
    return sharing.owner(hv, record.accel)


def _maps_the_held_file(record: Record, shared: sharing.Shared) -> None:
    """The restored QEMU (paused: its guest has not run) maps the very file root handed its relay — not what a
    process of its account may have put at the relay's pid and number meanwhile (the relay killed, its pid taken
    again): else the guest never runs on that memory (raises: the caller loads a copy)."""
    mapped = usage.shared_file(record.domain)
    if mapped is None or mapped.key != shared.key:
        raise VmsandboxError("the memory file its QEMU opened is not the one root handed it")


def restore_as(record: Record, hv: Hypervisor, memory: Path, restored_xml: str, *, paused: bool = False) -> None:
    """Restore another VM's save image (a template's, a checkpoint's) as this session's VM: under its own name and
    UUID (`restored_xml` has its paths), from a copy whose header says so, deleted once restored (`paused`: its
    guest runs once resumed)."""
    files = record.files
    xml = savefile.renamed(restored_xml, record.domain, str(uuid.uuid4()))
    filewrite.write_atomically(files.domain_xml, xml)
    clone = files.root / RESTORE_IMAGE
    savefile.clone(memory, clone, xml)
    filewrite.own_file(files.console_log)
    try:
        hv.restore(str(clone), xml, paused=paused)
    finally:
        clone.unlink(missing_ok=True)


def boot(
    record: Record,
    image: store.Image,
    hv: Hypervisor,
    *,
    cold_start: bool,
    boot_timeout: int,
    launched: Launched = nothing,
) -> None:
    """Start the session's VM: warm when a template serves, else (or when the warm start fails) cold."""
    shape = templates.shape_of(record)
    unbuilt = "the warm-start template could not be built"
    tmpl = template_for(
        record, lambda: template.ensure(image, shape, hv, boot_timeout), cold=cold_start, unbuilt=unbuilt
    )
    if tmpl is None:
        cold(record, image, hv, boot_timeout, launched)
        return
    t = tmpl

    def undo(exc: VmsandboxError) -> None:
        record.start_note = f"the warm start failed: {exc.message}"
        condemned = template.mark_failed(
            t, exc.message, record.name, project=record.project, own=isinstance(exc, savefile.SaveImageError)
        )
        kept = console.keep(record.files.console_log, record.name)
        ui.warn(
            f"{record.start_note}; booting cold"
            + (f" (its console is kept at {kept})" if kept else "")
            + ("; its template failed another session's warm start too: later sessions boot cold" if condemned else "")
        )
        control.stop(record.files)  # a daemon spawned for the restored VM: the cold one gets its own
        hv.destroy(record.domain)
        record.system_disk.unlink(missing_ok=True)
        record.template = None

    if warm_or_cold(record, lambda: warm(record, image, t, hv, boot_timeout, launched), undo):
        template.started(t)
    else:
        cold(record, image, hv, boot_timeout, launched)
