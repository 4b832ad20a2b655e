"""gc on another host: what this machine left there — the domains and volumes of its sessions whose directory is
gone here, and warm-start templates (template.py) that an interrupted build left, that failed a warm
start, or that this host's QEMU or libvirt (or a gone image) made stale, once no session's disk rests on them.
"""

from __future__ import annotations

import functools
import json
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

from vmsandbox.confine import access
from vmsandbox.errors import VmsandboxError
from vmsandbox.session.place import templates
from vmsandbox.session.place.hostspec import HostSpec
from vmsandbox.session.place.interface import Tidy
from vmsandbox.session.place.remote import images, template, vm
from vmsandbox.session.place.remote.images import POOL
from vmsandbox.session.place.remote.template import RemoteTemplate
from vmsandbox.session.record import DOMAIN_PREFIX, orphaned
from vmsandbox.vm import domain
from vmsandbox.vm.virt import Hypervisor

QCOW2_HEAD = 4096


def sweep(libvirt: Callable[[], Hypervisor], host: HostSpec, mine: Path, tidy: Tidy) -> Iterator[str]:
    """gc on another host (`libvirt()`: its connection): this machine's domains there whose session directory is
    gone here, destroyed, with their volumes; and the volumes of such a session that has no domain there (stopped,
    or a run killed before its VM started). A host that does not answer is said, not an error."""
    try:
        hv = libvirt()
        present = set()
        for info in list(hv.domains(DOMAIN_PREFIX)):
            present.add(info.name)
            xml = hv.xml(info.name)
            owner = domain.session_of(xml) if xml else None
            if owner is None or xml is None or domain.client_of(xml) != vm.client_id():
                continue  # not a session, or another machine's
            if orphaned(owner[1], mine):
                what = f"domain {info.name} on host {host.name} (its session directory is gone)"
                yield tidy("destroy", what, functools.partial(drop, hv, info.name, owner[1]))
        for name in list(hv.volumes(POOL)):
            dom = name.removesuffix(f".{vm.OWNER}")
            if not name.startswith(DOMAIN_PREFIX) or dom == name or dom in present:
                continue
            owner_dir = _owner_dir(hv, name)
            if owner_dir is not None and orphaned(owner_dir, mine):
                what = f"the volumes of {dom} on host {host.name} (its session directory is gone)"
                yield tidy("delete", what, functools.partial(vm.forget, hv, owner_dir, dom))
        yield from _templates(hv, host, tidy)
    except VmsandboxError as exc:
        yield f"host {host.name} did not answer, nothing there was cleaned up: {exc.message}"


def drop(hv: Hypervisor, dom: str, root: Path) -> None:
    """A session's domain there destroyed, its tunnel closed and its volumes deleted."""
    hv.destroy(dom)
    vm.forget(hv, root, dom)


def _owner_dir(hv: Hypervisor, name: str) -> Path | None:
    """The session directory an owner volume names, if this machine wrote it (None: another's, or gone since)."""
    try:
        got = hv.download(POOL, name, keep=vm.OWNER_LIMIT, length=vm.OWNER_LIMIT)
    except VmsandboxError:  # deleted since it was listed (its session's own teardown)
        return None
    try:
        owner = json.loads(bytes(got.kept).rstrip(b"\0"))
        if not isinstance(owner, dict) or owner.get("client") != vm.client_id():
            return None
        return Path(str(owner["session"]))
    except (ValueError, KeyError):
        return None


def _templates(hv: Hypervisor, host: HostSpec, tidy: Tidy) -> Iterator[str]:
    """The templates there that are not (or no longer) usable and that no session's disk rests on, removed.
    Nothing while this machine builds one there (its lock is held)."""
    with access.flocked(template.lock_path(host)) as held:
        if not held:
            return
        vols = hv.volumes(POOL)
        names = {v.split(".", 1)[0] for v in vols if v.startswith(templates.DOMAIN_PREFIX)}
        used = _backings(hv, vols)
        for name in sorted(names):
            tmpl = RemoteTemplate(name)
            why = _unusable(hv, tmpl, vols)
            if why and vols.get(tmpl.vol("disk.qcow2")) not in used:
                what = f"{why} on host {host.name} ({name})"
                yield tidy("remove", what, functools.partial(template.delete, hv, tmpl))


def _unusable(hv: Hypervisor, tmpl: RemoteTemplate, vols: dict[str, str]) -> str:
    """Why a template there is to go ("" if it serves, or another machine is building it)."""
    xml = hv.xml(tmpl.name)
    if xml is not None:  # a build: an interrupted one of ours (the lock is free), or another machine's
        return "an interrupted template build" if domain.client_of(xml) == vm.client_id() else ""
    if tmpl.vol("failed") in vols:
        return "a warm-start template that failed a warm start"
    if tmpl.vol("ready") not in vols:
        return "an interrupted template build"
    try:
        meta = template.record_of(hv, tmpl) or {}
        stale = (meta["key"]["qemu"], meta["key"]["libvirt"]) != (hv.qemu_version(), hv.version())
        image_gone = meta["image"] not in images.ready(hv)
    except (KeyError, TypeError):
        return "a warm-start template whose record cannot be read"
    if stale or image_gone:
        return "a superseded warm-start template"
    return ""


def _backings(hv: Hypervisor, vols: dict[str, str]) -> set[str]:
    """The backing files that the sessions' qcow2 volumes there name (read from their headers)."""
    used: set[str] = set()
    for name, path in vols.items():
        if name.endswith(".qcow2") and not name.startswith(templates.DOMAIN_PREFIX):
            try:
                head = bytes(hv.download(POOL, name, keep=QCOW2_HEAD, length=QCOW2_HEAD).kept)
            except VmsandboxError:  # deleted since it was listed
                continue
            if (backing := backing_of(head)) is not None:
                used.add(backing if backing.startswith("/") else str(Path(path).parent / backing))
    return used


def backing_of(head: bytes) -> str | None:
    """The backing file a qcow2 header names (None: none, or not a qcow2 header)."""
    if len(head) < 20 or head[:4] != images.QCOW2_MAGIC:
        return None
    offset, size = struct.unpack(">QI", head[8:20])
    if offset == 0 or offset + size > len(head):
        return None
    return head[offset : offset + size].decode(errors="replace")
