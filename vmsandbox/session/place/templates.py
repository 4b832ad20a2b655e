"""What a warm-start template is, wherever it is kept: the VM's shape, and the key of everything its saved memory
depends on (the image, the shape, the domain layout, the QEMU and libvirt versions that saved it). Each place
keeps its templates its own way (local.template: directories beside the image; remote.template: volumes in the
host's pool), under this one key."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from vmsandbox import paths, ui
from vmsandbox.errors import VmsandboxError
from vmsandbox.image.store import Image
from vmsandbox.session.record import Record
from vmsandbox.vm import accel
from vmsandbox.vm.domain import DomainSpec, build_xml
from vmsandbox.vm.virt import Hypervisor

T = TypeVar("T")
DOMAIN_PREFIX = "vmsandbox-template-"
READY = "vmsandbox-boot: template ready"  # printed by `identity warm` (images/base/rootfs/usr/local/lib/vmsandbox/)
SETTLE = 0.5  # after the marker: the guest's script is blocked on its port by then


@dataclass(frozen=True)
class Shape:
    accel: str
    cpus: int
    memory_mib: int
    disk_mib: int

    @property
    def slug(self) -> str:
        return f"{self.accel}-{self.cpus}c-{self.memory_mib}m-{self.disk_mib}d"


def shape_of(record: Record) -> Shape:
    return Shape(record.accel, record.cpus, record.memory_mib, record.disk_mib)


def spec(image: Image, shape: Shape, name: str, where: Path) -> DomainSpec:
    """A template's VM booting `image` in `shape`, its files in directory `where` (this machine's layout)."""
    return DomainSpec(
        name=name,
        session=name,
        session_dir=where,
        accel=accel.Accel(shape.accel),
        cpus=shape.cpus,
        memory_mib=shape.memory_mib,
        disk=where / paths.IMAGE_DISK,
        kernel=image.kernel,
        initrd=image.initrd,
        cmdline=image.kernel_cmdline,
        console_log=where / "console.log",
        forwards=(),
        fwcfg_files={"template": where / "fwcfg" / "template"},
        channel=where / "identity.sock",
        template=True,
    )


def key(image: Image, shape: Shape, hv: Hypervisor) -> dict[str, Any]:
    """Everything a template's saved memory depends on."""
    layout = build_xml(spec(image, shape, "layout", Path("/layout")))
    return {
        "image": image.version,
        "shape": asdict(shape),
        "cmdline": image.kernel_cmdline,
        "qemu": hv.qemu_version(),
        "libvirt": hv.version(),
        "domain": hashlib.sha256(layout.encode()).hexdigest()[:16],
    }


def digest(k: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(k, sort_keys=True).encode()).hexdigest()[:12]


def found_or_built(
    find: Callable[[], tuple[T | None, str]],
    lock: Callable[[], AbstractContextManager[Any]],
    failed: Callable[[], bool],
    build: Callable[[], T],
    where: str,
) -> T:
    """A place's template for an image and shape: the one `find()` finds, else built (`build()`) once, under the
    place's `lock()` (others wait for it, then find it) — unless the one with this key failed a warm start
    (`failed()`), which stays until gc removes it (sessions may rest on its disk)."""
    found, why = find()
    if found is not None:
        return found
    with lock():
        found, why = find()  # built by another process while we waited
        if found is not None:
            return found
        if failed():
            raise VmsandboxError(
                why, hint="`vmsandbox rm --stale` removes it when no session uses it; the next run builds anew"
            )
        ui.info(f"Building a warm-start template{where}: {why} (once per image version and VM shape)")
        return build()


def strike(session: str, why: str, project: str = "") -> str:
    """What a template keeps of a warm start that failed: which session (of which project), and why (bounded)."""
    return json.dumps({"session": session, "project": project, "why": why[:500]}) + "\n"


def condemns(previous: str | None, session: str, project: str = "") -> bool:
    """Whether a failed warm start of `session` (of `project`) condemns the template, given the strike it holds
    (`previous`, as `strike` wrote it, or None): only when another session of another project failed before it,
    with no success between (the sessions of one fan-out share their project's input). A strike that cannot be
    read counts as none."""
    if previous is None:
        return False
    try:
        said = json.loads(previous)
    except ValueError:
        return False
    if not isinstance(said, dict) or not isinstance(said.get("session"), str):
        return False
    return bool(said["session"] != session and said.get("project", "") != project)
