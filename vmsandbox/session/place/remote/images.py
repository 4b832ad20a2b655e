"""Images on another host: sent into its storage pool `vmsandbox` as volumes through libvirt streams — never
copied behind libvirt's back — once per image and host, checked by hash, never half-used.

A base image NAME (`base-…`) becomes the volumes `NAME.disk.qcow2`, `NAME.vmlinuz` and `NAME.initrd.img`; a
blueprint layer (`bp-…`) only `NAME.disk.qcow2`, sent after its base, with the backing file its header names
rewritten on the way to the base's volume beside it (a relative name, as `qemu-img rebase -u` would write
it; the layer here is not touched). Then `NAME.ready`: a small JSON record of what was sent (when the image
was built, each file's size and SHA-256), written last, after each volume was read back and its hash
matched. An image counts as there only with its `.ready`, matching this image, and every volume it names;
anything else of it (an upload cut off, an image rebuilt since) is deleted and sent again.
"""

from __future__ import annotations

import json
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmsandbox import paths, ui
from vmsandbox.confine import access
from vmsandbox.errors import VmsandboxError
from vmsandbox.image import store
from vmsandbox.image.store import Image
from vmsandbox.session.place.hostspec import HostSpec
from vmsandbox.vm.virt import Hypervisor

POOL = "vmsandbox"
FILES = (paths.IMAGE_DISK, paths.IMAGE_KERNEL, paths.IMAGE_INITRD)
READY = "ready"
READY_LIMIT = 64 * 1024


def volume(image: str, file: str) -> str:
    return f"{image}.{file}"


def base_of(image: Image) -> Image | None:
    """The base image a blueprint layer is built on (None: it is a base image)."""
    if image.path.name.startswith(store.PREFIX):
        return None
    return store.get_image(str(image.manifest["base_version"]))


def files_of(image: Image) -> tuple[str, ...]:
    """The files of an image that travel (a layer's kernel and initrd are its base's)."""
    return FILES if base_of(image) is None else (paths.IMAGE_DISK,)


QCOW2_MAGIC = b"QFI\xfb"


def backing_patch(disk: Path, backing: str) -> dict[int, bytes]:
    """The header bytes that make a qcow2 file name `backing` as its backing file (in the place of the name it
    has, which must be at least as long)."""
    with disk.open("rb") as f:
        head = f.read(4096)
    if len(head) < 20 or head[:4] != QCOW2_MAGIC:
        raise VmsandboxError(f"{disk} is not a qcow2 image", hint="rebuild it (`vmsandbox image build --force`)")
    offset, size = struct.unpack(">QI", head[8:20])
    new = backing.encode()
    if offset == 0 or len(new) > size or offset + size > len(head):
        raise VmsandboxError(f"{disk} names its backing file where it cannot be rewritten (offset {offset})")
    return {16: struct.pack(">I", len(new)), offset: new + bytes(size - len(new))}


@dataclass(frozen=True)
class Sent:
    """What one image's `.ready` says was sent: the image's build time, and each file's size and SHA-256."""

    built_at: str
    files: dict[str, tuple[int, str]]

    def as_json(self) -> str:
        return json.dumps({"built_at": self.built_at, "files": {f: list(v) for f, v in self.files.items()}})

    @classmethod
    def parse(cls, raw: bytes) -> Sent | None:
        try:
            data: dict[str, Any] = json.loads(raw.rstrip(b"\0"))
            files = {str(f): (int(v[0]), str(v[1])) for f, v in data["files"].items()}
            return cls(str(data["built_at"]), files)
        except (ValueError, KeyError, TypeError, AttributeError, IndexError):
            return None

    def matches(self, image: Image) -> bool:
        """Sent from this very image (the same build, the same sizes)."""
        if self.built_at != str(image.manifest.get("built_at")) or set(self.files) != set(files_of(image)):
            return False
        return all(self.files[f][0] == (image.path / f).stat().st_size for f in self.files)


def ready(hv: Hypervisor) -> list[str]:
    """The images a host's pool holds (a `.ready` and a disk; not checked against ours)."""
    vols = hv.volumes(POOL)
    names = [v.removesuffix(f".{READY}") for v in vols if v.endswith(f".{READY}")]
    return sorted(n for n in names if volume(n, paths.IMAGE_DISK) in vols)


def _recorded(hv: Hypervisor, name: str) -> Sent | None:
    vols = hv.volumes(POOL)
    if volume(name, READY) not in vols:
        return None
    found = Sent.parse(bytes(hv.download(POOL, volume(name, READY), keep=READY_LIMIT, length=READY_LIMIT).kept))
    return found if found is not None and all(volume(name, f) in vols for f in found.files) else None


def ensure(hv: Hypervisor, spec: HostSpec, image: Image) -> bool:
    """Make `image` (and a layer's base first) whole in the host's pool; True if anything had to be sent. One
    sender per host at a time (a lock in the shared image store): two sessions placed at once send it once."""
    wait = f"another image is being sent to host {spec.name}; waiting for it…"
    with access.flocked(paths.images_dir() / f".send-{spec.name}.lock", wait=wait):
        return _ensure(hv, spec, image)


def _ensure(hv: Hypervisor, spec: HostSpec, image: Image) -> bool:
    base = base_of(image)
    sent_base = base is not None and _ensure(hv, spec, base)
    name = image.path.name
    at = hv.pool(POOL, spec.pool_path)
    if at.rstrip("/") != spec.pool_path:
        raise VmsandboxError(
            f"host {spec.name} has its storage pool {POOL} at {at}, not at {spec.pool_path} as your config says",
            hint=f"set `pool_path: {at}` for host {spec.name} in ~/.config/vmsandbox/config.yaml, or remove that "
            f"pool there (`virsh -c URI pool-destroy {POOL}; virsh -c URI pool-undefine {POOL}`)",
        )
    found = _recorded(hv, name)
    if found is not None and found.matches(image):
        return sent_base
    hv.delete_volume(POOL, volume(name, READY))  # from here on, the image is not there
    files: dict[str, tuple[int, str]] = {}
    total = sum((image.path / f).stat().st_size for f in files_of(image))
    with ui.step(f"Sending image {name} to host {spec.name} ({total / 1024**2:.0f} MiB, holes skipped)") as detail:
        done = 0
        for f in files_of(image):
            source = image.path / f
            size = source.stat().st_size
            shown = _shown(detail, f"sending {f}", done, total)
            patches = None if base is None else backing_patch(source, volume(base.path.name, paths.IMAGE_DISK))
            try:
                sent = hv.upload(POOL, volume(name, f), source, shown, patches)
            except VmsandboxError as exc:
                raise VmsandboxError(f"host {spec.name}: {exc.message}", hint=exc.hint) from exc
            detail(f"checking {f}")
            back = hv.download(POOL, volume(name, f))
            if back.sha.hexdigest() != sent:
                hv.delete_volume(POOL, volume(name, f))
                raise VmsandboxError(
                    f"{f} of image {name} arrived at host {spec.name} changed (SHA-256 {back.sha.hexdigest()[:12]}…, "
                    f"sent {sent[:12]}…)",
                    hint="check that host's disk, then try again: the volume was deleted",
                )
            files[f] = (size, sent)
            done += size
        record = Sent(str(image.manifest.get("built_at")), files)
        put_text(hv, volume(name, READY), record.as_json())
    return True


def put_text(hv: Hypervisor, name: str, text: str, *, mode: str = "0644") -> None:
    """Volume NAME in the pool made to hold `text` (a small record or marker)."""
    with tempfile.TemporaryDirectory(prefix="vmsandbox-put-") as tmp:
        note = Path(tmp) / "note"
        note.write_text(text)
        hv.upload(POOL, name, note, mode=mode, hashed=False)  # nothing checks it against a hash


def _shown(detail: Callable[[str], None], what: str, before: int, total: int) -> Callable[[int], None]:
    step = max(total // 200, 1)
    last = [-step]

    def progress(done: int) -> None:
        if done - last[0] >= step:
            last[0] = done
            detail(f"{what}: {(before + done) / 1024**2:.0f}/{total / 1024**2:.0f} MiB")

    return progress
