"""Warm-start templates: an image booted once to the point where it waits for a session's identity, its memory
saved. Kept beside the image (`<image>/templates/<shape>-<key>/`: disk.qcow2, memory.save, meta.json; and the
saved memory split for sessions that share it (local.sharing): memory.ram, the guest's RAM as a flat file, and
memory.state, the rest of the save image).

A template is tied to everything its saved memory depends on: the image version (its directory), the VM's
shape (accelerator, vCPUs, memory, disk size), the domain layout, and the QEMU and libvirt versions that saved
it. Any of those changes and the key changes, so a new template is built and the old one is never used
(sessions still running on an old one keep its disk; `gc` removes it when nobody does). A template directory
appears in one rename, complete, so a half-built template is never used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import secrets
import shutil
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmsandbox import failpoint, filewrite, paths, ui
from vmsandbox.confine import access, accounts
from vmsandbox.errors import VmsandboxError
from vmsandbox.image import layers, store
from vmsandbox.image.store import Image
from vmsandbox.session.place import templates
from vmsandbox.session.place.interface import Tidy
from vmsandbox.session.place.local import bootwait
from vmsandbox.session.place.templates import DOMAIN_PREFIX, READY, SETTLE, Shape, digest, key
from vmsandbox.vm import qemuimg
from vmsandbox.vm.domain import build_xml
from vmsandbox.vm.memory import split
from vmsandbox.vm.virt import Hypervisor

DIR = paths.IMAGE_TEMPLATES
MEMORY = "memory.save"
META = "meta.json"
RAM = "memory.ram"  # the saved RAM, flat (zero pages are holes): sealed in memory, mapped by every session
STATE = "memory.state"  # the save image without that RAM: what a session sharing it restores
UNSPLIT = "memory.unsplit"  # why its memory could not be split (its sessions restore memory.save whole)


@dataclass(frozen=True)
class Template:
    path: Path
    meta: dict[str, Any]

    @property
    def disk(self) -> Path:
        return self.path / paths.IMAGE_DISK

    @property
    def memory(self) -> Path:
        return self.path / MEMORY

    @property
    def ram(self) -> Path:
        return self.path / RAM

    @property
    def state(self) -> Path:
        return self.path / STATE


def root_of(image: Image) -> Path:
    return image.path / DIR


def _path_of(image: Image, shape: Shape, k: dict[str, Any]) -> Path:
    """Where the template of this image, shape and key lives."""
    return root_of(image) / f"{shape.slug}-{digest(k)}"


def find(image: Image, shape: Shape, hv: Hypervisor) -> tuple[Template | None, str]:
    """The usable template for this image and shape, or None and why there is none."""
    k = key(image, shape, hv)
    path = _path_of(image, shape, k)
    try:
        meta = json.loads((path / META).read_text())
    except (OSError, ValueError):
        return None, _why_missing(image, shape, k)
    if meta.get("key") != k or not (path / MEMORY).is_file():
        return None, f"the template at {path} does not match its key"
    with contextlib.suppress(OSError):
        failed = _failed_mark(path).read_text().strip()
        return None, f"its warm-start template failed a warm start ({failed}); `vmsandbox rm --stale` removes it"
    return Template(path, meta), ""


def _failed_mark(path: Path) -> Path:
    return path.with_name(path.name + ".failed")


def _strike_mark(path: Path) -> Path:
    return path.with_name(path.name + ".strike")


def mark_failed(tmpl: Template, why: str, session: str, *, project: str = "", own: bool = False) -> bool:
    """A warm start of `session` from this template failed. One session's failure may come from that session's
    own input (its name, its workspace, its identity), so it never condemns what every session shares: the
    template is condemned (later sessions boot cold and say why; `gc` removes it and the next session builds
    a new one) only when a warm start of another session failed before, with no success between, or when the
    failure is its own (`own`: its saved memory is not a save image). True if it was condemned now."""
    strike = _strike_mark(tmpl.path)
    if own or templates.condemns(_read_strike(strike), session, project):
        filewrite.write_atomically(_failed_mark(tmpl.path), why[:500] + "\n", mode=0o644)
        strike.unlink(missing_ok=True)
        return True
    filewrite.write_atomically(strike, templates.strike(session, why, project), mode=0o644)
    return False


def started(tmpl: Template) -> None:
    """A warm start from it worked: an earlier session's failure was that session's own."""
    _strike_mark(tmpl.path).unlink(missing_ok=True)


def _read_strike(strike: Path) -> str | None:
    try:
        return strike.read_text()
    except OSError:
        return None


def _why_missing(image: Image, shape: Shape, k: dict[str, Any]) -> str:
    for old in sorted(root_of(image).glob(f"{shape.slug}-*")):
        with contextlib.suppress(OSError, ValueError):
            was = json.loads((old / META).read_text()).get("key", {})
            changed = [
                f"{f} {was.get(f)} → {k[f]}" for f in ("qemu", "libvirt", "cmdline", "domain") if was.get(f) != k[f]
            ]
            if changed:
                return "the template was saved under another " + ", ".join(changed)
    return f"no warm-start template yet for {image.version} ({shape.slug})"


@contextlib.contextmanager
def _lock(image: Image) -> Iterator[None]:
    root = root_of(image)
    with contextlib.ExitStack() as stack:
        try:
            access.shared_dir(root)  # QEMU's user passes through to a template's disk; the libvirt group adds to it
            stack.enter_context(
                access.flocked(
                    root / ".lock", wait="Waiting for another vmsandbox that builds this warm-start template"
                )
            )
        except PermissionError as exc:
            raise access.not_writable(root) from exc
        yield


def ensure(image: Image, shape: Shape, hv: Hypervisor, boot_timeout: int) -> Template:
    """The template for this image and shape, built now if there is none (once; others wait for it)."""
    return templates.found_or_built(
        lambda: find(image, shape, hv),
        lambda: _lock(image),
        lambda: _path_of(image, shape, key(image, shape, hv)).exists(),  # there, yet not found: it failed
        lambda: _build(image, shape, hv, boot_timeout),
        "",
    )


def _build(image: Image, shape: Shape, hv: Hypervisor, boot_timeout: int) -> Template:
    k = key(image, shape, hv)
    final = _path_of(image, shape, k)
    tmp = root_of(image) / f".tmp-{secrets.token_hex(4)}"
    tmp.mkdir(mode=0o700)
    accounts.private_dir(tmp)
    spec = templates.spec(image, shape, DOMAIN_PREFIX + tmp.name[5:], tmp)
    started = time.monotonic()
    try:
        qemuimg.create_overlay(image.disk, spec.disk, shape.disk_mib * 1024 * 1024, depth=2)
        # the image's chain named, never labelled: libvirt would give the shared images to QEMU's account for good
        spec = dataclasses.replace(spec, chain=tuple((i.path, i.format, False) for i in qemuimg.chain(image.disk)))
        (tmp / "fwcfg").mkdir(mode=0o700)
        (tmp / "fwcfg" / "template").write_text("1\n")
        accounts.give_to_qemu(tmp / "fwcfg")
        filewrite.own_file(spec.console_log)
        hv.create(build_xml(spec))
        failpoint.hit("template.boot")
        title = f"Booting the template ({shape.accel.upper()}, {shape.cpus} vCPU, {shape.memory_mib} MiB)"
        booting = bootwait.Booting(spec.name, spec.console_log, f"template-{image.version}", shape.accel, title)
        bootwait.wait(
            booting,
            hv,
            boot_timeout,
            lambda alive: bootwait.marker(spec.console_log, READY, timeout=boot_timeout, alive=alive),
        )
        time.sleep(SETTLE)
        with ui.step("Saving the template's memory"):
            hv.save(spec.name, str(tmp / MEMORY))
        spec.disk.chmod(0o444)  # never written again: the backing file of every session restored from it
        # every account of the libvirt group restores it (it holds no identity: each session gets its own
        # after the restore, and fresh entropy)
        (tmp / MEMORY).chmod(0o444)
        with ui.step("Splitting the template's memory for sessions to share"):
            _split(tmp)
        meta: dict[str, Any] = {
            "key": k,
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "build_seconds": round(time.monotonic() - started, 1),
            "memory_bytes": (tmp / MEMORY).stat().st_size,
        }
        filewrite.write_atomically(tmp / META, json.dumps(meta, indent=2, sort_keys=True) + "\n", mode=0o644)
        for scratch in ("console.log", "identity.sock"):
            (tmp / scratch).unlink(missing_ok=True)
        shutil.rmtree(tmp / "fwcfg")
        access.drop_acl(tmp)  # its traverse-only ACL would deny the owning group (libvirt) everything
        access.shared_dir(tmp)  # QEMU passes through; any member of the group may remove it (gc)
        tmp.rename(final)
    except BaseException:
        hv.destroy(spec.name)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Template(final, meta)


def split_memory(tmpl: Template) -> None:
    """The template's memory split for sessions that share it (memory.ram, memory.state): made now, under the lock
    of its image's templates, if it was built before templates were split."""
    if tmpl.ram.is_file() and tmpl.state.is_file():
        return
    with access.flocked(tmpl.path.parent / ".lock", wait="Waiting for another vmsandbox that builds a template"):
        if tmpl.ram.is_file() and tmpl.state.is_file():
            return
        with contextlib.suppress(OSError):
            raise split.StreamError((tmpl.path / UNSPLIT).read_text().strip())
        try:
            with ui.step("Splitting the warm-start template's memory for sessions to share (once)"):
                _split(tmpl.path)
        except split.StreamError as exc:  # said once, kept: every later session restores it whole at once
            filewrite.write_atomically(tmpl.path / UNSPLIT, exc.message[:500] + "\n", mode=0o644)
            raise


def _split(where: Path) -> None:
    """memory.save in directory `where` split into memory.ram and memory.state, each appearing whole (a rename)."""
    ram, state = where / f".{RAM}.tmp", where / f".{STATE}.tmp"
    for f in (ram, state):
        f.unlink(missing_ok=True)
    fd = os.open(ram, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        split.split(where / MEMORY, fd, state)
        os.fsync(fd)
        os.fchmod(fd, 0o444)  # never written again (like memory.save); QEMU maps a sealed copy, never these
        made = os.open(state, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)  # (through the descriptor: a link put
        try:  # there meanwhile by a member of the directory's group is refused, its target never chmodded)
            if not stat.S_ISREG(os.fstat(made).st_mode):
                raise VmsandboxError(f"{state} is not the file the split wrote", hint="run `vmsandbox rm --stale`")
            os.fchmod(made, 0o444)
        finally:
            os.close(made)
    except BaseException:
        ram.unlink(missing_ok=True)
        state.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)
    for f, final in ((ram, where / RAM), (state, where / STATE)):
        f.rename(final)


def collect(hv: Hypervisor, images: list[Image], in_use: set[Path], tidy: Tidy) -> Iterator[str]:
    """gc: template builds that died (their domain and directory), and templates no session uses that a newer
    one replaced. Skips everything while a build holds the lock."""
    for image in images:
        root = root_of(image)
        if not root.is_dir():
            continue
        with access.flocked(root / ".lock") as held:
            if not held:
                continue
            for tmp in root.glob(".tmp-*"):
                yield tidy("remove", f"an interrupted template build {tmp}", functools.partial(_drop_build, hv, tmp))
            yield from _superseded(hv, image, root, in_use, tidy)


def is_current(path: Path, hv: Hypervisor) -> bool:
    """Whether the template at `path` is the one a new session of its image and shape starts from."""
    shape = _shape_of(path)
    if shape is None or _failed_mark(path).exists():
        return False
    where = path.parent.parent  # <image>/templates/<template>
    prefix = layers.PREFIX if where.name.startswith(layers.PREFIX) else store.PREFIX
    try:
        image = store.get_image_at(where, prefix=prefix)
    except (OSError, ValueError):
        return False
    current = find(image, shape, hv)[0]
    return current is not None and current.path == path


def _drop_build(hv: Hypervisor, tmp: Path) -> None:
    hv.destroy(DOMAIN_PREFIX + tmp.name[5:])
    shutil.rmtree(tmp, ignore_errors=True)


def _superseded(hv: Hypervisor, image: Image, root: Path, in_use: set[Path], tidy: Tidy) -> Iterator[str]:
    for path in sorted(root.iterdir()):
        if path.name.startswith(".") or path.suffix in (".failed", ".strike") or path in in_use:
            continue
        if _failed_mark(path).exists():
            why = "a warm-start template that failed a warm start"
        else:
            shape = _shape_of(path)
            current = find(image, shape, hv)[0] if shape is not None else None
            if current is not None and current.path == path:
                continue
            why = "a superseded warm-start template"
        yield f"would remove {why} {path}" if tidy.dry else _remove(path, why)


def _remove(path: Path, what: str) -> str:
    shutil.rmtree(path, ignore_errors=True)
    if path.exists():
        return f"could not remove {what} {path} (another account made it): `sudo vmsandbox rm --stale` removes it"
    _failed_mark(path).unlink(missing_ok=True)
    _strike_mark(path).unlink(missing_ok=True)
    return f"removed {what} {path}"


def _shape_of(path: Path) -> Shape | None:
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return Shape(**json.loads((path / META).read_text())["key"]["shape"])
    return None
