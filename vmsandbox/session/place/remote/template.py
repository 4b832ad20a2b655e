"""Warm-start templates on another host: built there, by that host's libvirt, once per image version, VM shape
and that host's QEMU and libvirt versions (the key of templates.py, with the host's versions in it), and kept
in its pool as volumes named after the key's digest, `vmsandbox-template-DIGEST.`:

- `disk.qcow2`: the template's system disk (backed by the image's volume), the backing volume of every session
  restored from it; never written after the build;
- `save`: its memory, saved by libvirt there (nothing travels: a session's restore clones it there);
- `fw.template`: the fw_cfg file the saved domain reads (it tells the guest to wait for its identity);
- `ready`: written last, the key and the image's name there as JSON. A template counts only with its `ready`,
  matching, and the rest; `failed` (a warm start from it failed in the guest) makes later sessions boot cold,
  and say why.

A template is built the first time a session of that image and shape is placed on that host; its build domain
carries this machine's client id, so that gc here can tell an interrupted build of its own (template lock free,
domain or volumes left) and remove it.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmsandbox import paths, ui
from vmsandbox.confine import access
from vmsandbox.errors import VmsandboxError
from vmsandbox.image.store import Image
from vmsandbox.session.place import console, templates
from vmsandbox.session.place.hostspec import HostSpec
from vmsandbox.session.place.remote import images, log, vm
from vmsandbox.session.place.remote.images import POOL, volume
from vmsandbox.vm import accel, domain, node, storage
from vmsandbox.vm.domain import DomainSpec
from vmsandbox.vm.virt import Hypervisor

READY_LIMIT = 64 * 1024
POLL_SECONDS = 1.0


@dataclass(frozen=True)
class RemoteTemplate:
    name: str  # its build domain's name and its volumes' prefix

    def vol(self, what: str) -> str:
        return f"{self.name}.{what}"


def of(image: Image, shape: templates.Shape, hv: Hypervisor) -> tuple[RemoteTemplate, dict[str, Any]]:
    """The template this image and shape have on the host `hv` is connected to, and its key."""
    k = templates.key(image, shape, hv)
    return RemoteTemplate(templates.DOMAIN_PREFIX + templates.digest(k)), k


def find(image: Image, shape: templates.Shape, hv: Hypervisor) -> tuple[RemoteTemplate | None, str]:
    """The usable template there, or None and why there is none."""
    tmpl, k = of(image, shape, hv)
    vols = hv.volumes(POOL)
    if tmpl.vol("failed") in vols:
        failed = f"its warm-start template there failed a warm start; `vmsandbox rm --stale` removes it ({tmpl.name})"
        return None, failed
    if tmpl.vol("ready") not in vols:
        return None, f"no warm-start template there yet for {image.version} ({shape.slug})"
    record = record_of(hv, tmpl) or {}
    if record.get("key") != k or any(tmpl.vol(v) not in vols for v in ("disk.qcow2", "save", "fw.template")):
        return None, f"the template {tmpl.name} there does not match its key"
    return tmpl, ""


def record_of(hv: Hypervisor, tmpl: RemoteTemplate) -> dict[str, Any] | None:
    """What its `ready` volume says (None: it cannot be read as a JSON object)."""
    raw = bytes(hv.download(POOL, tmpl.vol("ready"), keep=READY_LIMIT, length=READY_LIMIT).kept)
    try:
        record = json.loads(raw.rstrip(b"\0"))
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def ensure(image: Image, shape: templates.Shape, hv: Hypervisor, host: HostSpec, boot_timeout: int) -> RemoteTemplate:
    """The template there, built now if there is none (once: this machine's other sessions wait for it)."""
    wait = f"another vmsandbox builds a warm-start template on host {host.name}; waiting for it…"

    def build() -> RemoteTemplate:
        tmpl, k = of(image, shape, hv)
        _build(image, shape, hv, tmpl, k, boot_timeout)
        return tmpl

    return templates.found_or_built(
        lambda: find(image, shape, hv),
        lambda: access.flocked(lock_path(host), wait=wait),
        lambda: of(image, shape, hv)[0].vol("failed") in hv.volumes(POOL),
        build,
        f" on host {host.name}",
    )


def lock_path(host: HostSpec) -> Path:
    return paths.images_dir() / f".template-{host.name}.lock"


def mark_failed(
    hv: Hypervisor, tmpl: RemoteTemplate, why: str, session: str, *, project: str = "", own: bool = False
) -> bool:
    """A warm start of `session` from it failed: condemned (later sessions boot cold and say why; gc removes
    it) only when another session's warm start failed before, with no success between (templates.condemns:
    one session's own input never condemns what all share), or at once when the failure is its own (`own`).
    True if it was condemned now."""
    vols = hv.volumes(POOL)
    strike = tmpl.vol("strike")
    previous = None
    if strike in vols:
        previous = bytes(hv.download(POOL, strike, keep=READY_LIMIT, length=READY_LIMIT).kept).decode(errors="replace")
    if own or templates.condemns(previous, session, project):
        images.put_text(hv, tmpl.vol("failed"), why[:500] + "\n", mode="0600")
        hv.delete_volume(POOL, strike)
        return True
    if strike in vols:
        hv.delete_volume(POOL, strike)
    images.put_text(hv, strike, templates.strike(session, why, project), mode="0600")
    return False


def started(hv: Hypervisor, tmpl: RemoteTemplate) -> None:
    """A warm start from it worked: an earlier session's failure was that session's own."""
    if tmpl.vol("strike") in hv.volumes(POOL):
        hv.delete_volume(POOL, tmpl.vol("strike"))


def delete(hv: Hypervisor, tmpl: RemoteTemplate) -> None:
    """Its domain (a build's) and every volume of it, `ready` first: from then on it is not there."""
    hv.destroy(tmpl.name)
    names = sorted(v for v in hv.volumes(POOL) if v.startswith(f"{tmpl.name}."))
    for name in sorted(names, key=lambda v: not v.endswith(".ready")):
        hv.delete_volume(POOL, name)


def _build(
    image: Image, shape: templates.Shape, hv: Hypervisor, tmpl: RemoteTemplate, k: dict[str, Any], boot_timeout: int
) -> None:
    delete(hv, tmpl)  # what an interrupted build of it left
    started = time.monotonic()
    try:
        spec = _spec(image, shape, hv, tmpl)
        hv.create(domain.build_xml(spec))
        with ui.step(f"Booting the template there ({shape.accel.upper()}, {shape.cpus} vCPU)") as detail:
            _wait_ready(hv, tmpl, boot_timeout)
            time.sleep(templates.SETTLE)
            detail("saving its memory")
            saved = hv.create_volume(POOL, storage.volume_xml(tmpl.vol("save"), 0, mode="0600"))
            hv.save(tmpl.name, saved, here=False)
        hv.delete_volume(POOL, tmpl.vol("console.log"))
        meta = {
            "key": k,
            "image": image.path.name,
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "build_seconds": round(time.monotonic() - started, 1),
        }
        images.put_text(hv, tmpl.vol("ready"), json.dumps(meta), mode="0600")
    except BaseException:
        delete(hv, tmpl)
        raise


def _spec(image: Image, shape: templates.Shape, hv: Hypervisor, tmpl: RemoteTemplate) -> DomainSpec:
    """The build domain: its disk an overlay of the image's volume, its console and fw_cfg file volumes."""
    vols = hv.volumes(POOL)
    backing = vols[volume(image.path.name, paths.IMAGE_DISK)]
    size = shape.disk_mib * 1024 * 1024
    disk = hv.create_volume(POOL, storage.volume_xml(tmpl.vol("disk.qcow2"), size, mode="0600", backing=backing))
    images.put_text(hv, tmpl.vol("fw.template"), "1\n", mode="0600")
    console_log = hv.create_volume(POOL, storage.volume_xml(tmpl.vol("console.log"), 0, mode="0600"))
    vols, kernel = hv.volumes(POOL), vm.kernel_of(image)
    return DomainSpec(
        name=tmpl.name,
        session=tmpl.name,
        session_dir=Path(disk).parent,
        accel=accel.Accel(shape.accel),
        cpus=shape.cpus,
        memory_mib=shape.memory_mib,
        disk=Path(disk),
        kernel=Path(vols[volume(kernel, paths.IMAGE_KERNEL)]),
        initrd=Path(vols[volume(kernel, paths.IMAGE_INITRD)]),
        cmdline=image.kernel_cmdline,
        console_log=Path(console_log),
        forwards=(),
        fwcfg_files={"template": Path(vols[tmpl.vol("fw.template")])},
        channel=domain.LIBVIRTS_SOCKET,
        template=True,
        client=vm.client_id(),
    )


def _wait_ready(hv: Hypervisor, tmpl: RemoteTemplate, boot_timeout: int) -> None:
    """Until the template's console (a volume there) shows that its guest waits for an identity."""
    deadline = time.monotonic() + boot_timeout
    while True:
        stopped = node.gone(hv.info(tmpl.name))
        shown = log.console_of(hv, tmpl.vol("console.log")) or b""
        if templates.READY.encode() in shown:
            return
        if stopped or time.monotonic() > deadline:
            why = "stopped while booting" if stopped else f"did not reach {templates.READY!r} within {boot_timeout} s"
            raise VmsandboxError(f"the template's VM {why}", hint=_kept(shown, tmpl))
        time.sleep(POLL_SECONDS)


def _kept(shown: bytes, tmpl: RemoteTemplate) -> str:
    """Where the failed build's console is kept here (its volume there goes with the build)."""
    with tempfile.TemporaryDirectory(prefix="vmsandbox-tmpl-") as tmp:
        copy = Path(tmp) / "console.log"
        copy.write_bytes(shown)
        kept = console.keep(copy, tmpl.name)
    return (f"its console is kept at {kept}; " if kept else "") + "`--cold` boots without a template"
