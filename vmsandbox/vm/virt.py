"""The only module that imports libvirt: connection, domains, and error mapping."""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import libvirt

from vmsandbox import filewrite
from vmsandbox.errors import VmsandboxError
from vmsandbox.vm import livesave, node, storage, timedsave
from vmsandbox.vm.memory import usage

log = logging.getLogger(__name__)
DEFAULT_URI = "qemu:///system"

# libvirt prints every error to stderr by default; we report them ourselves.
libvirt.registerErrorHandler(lambda _ctx, _err: None, None)


def _message(exc: libvirt.libvirtError) -> str:
    return str(exc.get_error_message() or exc)


def _not_started(exc: libvirt.libvirtError, what: str, hint: str | None = None) -> VmsandboxError:
    return node.not_started(_message(exc), what, hint)


@contextlib.contextmanager
def _said(what: str, hint: str | None = None) -> Iterator[None]:
    """libvirt's refusal of what runs within, raised as "WHAT: libvirt's message" (with `hint`)."""
    try:
        yield
    except libvirt.libvirtError as exc:
        raise VmsandboxError(f"{what}: {_message(exc)}", hint=hint) from exc


def _running(dom: Any) -> bool | None:
    """Whether the domain's guest runs (None: libvirt did not say)."""
    try:
        return bool(dom.state()[0] == libvirt.VIR_DOMAIN_RUNNING)
    except libvirt.libvirtError:
        return None


def _refresh(pool: Any) -> None:
    """The pool's volumes as its directory holds them, unless one is being sent or read ("asynchronous jobs")."""
    try:
        pool.refresh(0)
    except libvirt.libvirtError as exc:
        if "asynchronous jobs" not in _message(exc):
            raise


class Hypervisor:
    """A libvirt connection. Use as a context manager, or call close()."""

    def __init__(self, uri: str = DEFAULT_URI) -> None:
        self.uri = uri
        try:
            self._conn = node.opened(uri, lambda: libvirt.open(uri))
        except TimeoutError:
            why = f"cannot connect to libvirt at {uri}: no answer in {node.OPEN_TIMEOUT:.0f} s"
            raise node.UnreachableError(why, hint=node.unreachable_hint("", uri, DEFAULT_URI)) from None
        except libvirt.libvirtError as exc:
            hint = node.unreachable_hint(_message(exc), uri, DEFAULT_URI)
            raise node.UnreachableError(f"cannot connect to libvirt at {uri}: {_message(exc)}", hint=hint) from exc

    def __enter__(self) -> Hypervisor:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(libvirt.libvirtError):
            self._conn.close()

    def version(self) -> str:
        return node.dotted(self._conn.getLibVersion())

    def qemu_version(self) -> str:
        """The version of the QEMU binary libvirt runs (a save image restores only into a QEMU that can read it)."""
        return node.dotted(self._conn.getVersion())

    def save(self, name: str, path: str, *, here: bool = True, deadline: float | None = None) -> None:
        """Save the domain's memory and device state to `path` and stop it (its disks stay). A file `here` is made
        first, ours to read (libvirtd writes into it, not into a 0600 root file); another host's is libvirt's.
        `deadline`: seconds after which a save that has not ended is aborted (timedsave.bounded)."""
        self._must(name)  # a domain that is gone is said before a file is made for it
        if here:
            filewrite.own_file(Path(path), truncate=True)
        saving = (
            (lambda dom: dom.save(path))
            if deadline is None
            else (lambda dom: timedsave.bounded(lambda: dom.save(path), lambda: _abort_job(dom), dom.name(), deadline))
        )
        self._on(name, "save", saving, hint="check free space under it")

    def save_live(self, name: str, snapshot_xml: str, *, live: bool, converge: float = livesave.CONVERGE) -> float:
        """Save the running domain's memory and switch its disks as `snapshot_xml` (livesave.snapshot_xml) says,
        while its guest runs (`live`; else paused for the save: livesave.passes_are_sound); it runs on after, in
        the same QEMU. The seconds its guest was paused (sampled every 10 ms: the last pass, the rest of a save
        that did not converge, or the whole save)."""
        dom = self._must(name)
        flags = (
            (libvirt.VIR_DOMAIN_SNAPSHOT_CREATE_LIVE if live else 0)
            | libvirt.VIR_DOMAIN_SNAPSHOT_CREATE_NO_METADATA
            | libvirt.VIR_DOMAIN_SNAPSHOT_CREATE_ATOMIC
            | libvirt.VIR_DOMAIN_SNAPSHOT_CREATE_REUSE_EXT
        )
        watch = livesave.PauseWatch(lambda: _running(dom))
        try:
            with _said(f"cannot save {name} live"):
                saving = functools.partial(dom.snapshotCreateXML, snapshot_xml, flags)
                livesave.bounded(saving, dom.suspend, lambda: _abort_job(dom), name, converge)
        finally:
            watch.stop()
            # paused by the bound (after libvirt's own resume), or left paused by a failure: it runs on
            with contextlib.suppress(libvirt.libvirtError):
                if dom.state()[0] == libvirt.VIR_DOMAIN_PAUSED:
                    dom.resume()
        return watch.seconds

    def pull(self, name: str, dev: str, base: str, *, within: float) -> None:
        """Copy into disk `dev`'s top image what the images between it and `base` hold, while the guest runs
        (QEMU's block stream); its top then reads `base` directly. Aborted if it has not ended within `within` s."""
        dom = self._must(name)
        with _said(f"cannot fold {name}'s overlays while it runs"):
            try:
                dom.blockRebase(dev, base, 0, 0)
                livesave.awaited(lambda: dom.blockJobInfo(dev, 0), f"folding {name}'s overlays", within)
            except BaseException:
                with contextlib.suppress(libvirt.libvirtError):  # (refused: it has ended meanwhile)
                    dom.blockJobAbort(dev, libvirt.VIR_DOMAIN_BLOCK_JOB_ABORT_ASYNC)
                    livesave.awaited(lambda: dom.blockJobInfo(dev, 0), f"aborting {name}'s fold", livesave.ABORT)
                raise

    def restore(self, path: str, xml: str, *, paused: bool = False) -> None:
        """Start a transient domain from a save image, with `xml` (same guest ABI, other host-side paths); `paused`:
        its guest runs only once `resume`d."""
        flags = libvirt.VIR_DOMAIN_SAVE_PAUSED if paused else libvirt.VIR_DOMAIN_SAVE_RUNNING
        try:
            self._conn.restoreFlags(path, xml, flags)
        except libvirt.libvirtError as exc:
            raise _not_started(exc, "libvirt could not restore the VM") from exc

    def attach(self, name: str, device_xml: str) -> None:
        """Hot-plug a device into the running domain."""
        live = libvirt.VIR_DOMAIN_AFFECT_LIVE
        self._on(name, "attach a device to", lambda dom: dom.attachDeviceFlags(device_xml, live))

    def exchange(self, name: str, port: str, data: bytes, *, limit: int, timeout: float) -> bytes:
        """`data` to the domain's virtio port PORT through libvirt (there too); its answer (storage.exchange)."""
        stream = self._conn.newStream(libvirt.VIR_STREAM_NONBLOCK)
        try:
            with _said(f"the port {port} of {name} failed"):
                self._must(name).openChannel(port, stream, 0)
                return storage.exchange(stream, data, limit, time.monotonic() + timeout, self._conn.getLibVersion)
        finally:
            with contextlib.suppress(libvirt.libvirtError):
                stream.abort()

    def _on(self, name: str, what: str, call: Callable[[Any], object], hint: str | None = None) -> None:
        """`call` on the domain NAME; libvirt's refusal said as "cannot WHAT NAME"."""
        dom = self._must(name)
        with _said(f"cannot {what} {name}", hint):
            call(dom)

    def create(self, xml: str) -> None:
        """Start a transient domain from XML."""
        try:
            self._conn.createXML(xml, 0)
        except libvirt.libvirtError as exc:
            raise _not_started(exc, "libvirt could not start the VM", "`vmsandbox doctor` checks the host") from exc

    def _must(self, name: str) -> Any:
        if (dom := self._lookup(name)) is None:
            raise VmsandboxError(f"domain {name} is gone")
        return dom

    def _lookup(self, name: str) -> Any:
        try:
            return self._conn.lookupByName(name)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                return None
            raise VmsandboxError(f"libvirt lookup of {name} failed: {_message(exc)}") from exc

    def info(self, name: str) -> node.DomainInfo | None:
        return None if (dom := self._lookup(name)) is None else self._info(dom)

    def _info(self, dom: Any) -> node.DomainInfo:
        with contextlib.suppress(libvirt.libvirtError):
            return node.DomainInfo(dom.name(), node.state_name(dom.state()[0]), None)
        return node.DomainInfo(dom.name(), "gone", None)

    def cpu_seconds(self, name: str) -> float | None:
        """CPU time the domain's QEMU has used (all its threads), or None when it is not running."""
        with contextlib.suppress(libvirt.libvirtError):
            return None if (dom := self._lookup(name)) is None else float(dom.info()[4]) / 1e9
        return None

    def domains(self, prefix: str) -> Iterator[node.DomainInfo]:
        yield from (self._info(dom) for dom in self._conn.listAllDomains(0) if dom.name().startswith(prefix))

    def xml(self, name: str) -> str | None:
        return None if (dom := self._lookup(name)) is None else str(dom.XMLDesc(0))

    def reset(self, name: str) -> None:
        """Reset the domain as the reset button would: the guest starts over, in the same QEMU process."""
        self._on(name, "reset", lambda dom: dom.reset(0))

    def resume(self, name: str) -> None:
        self._on(name, "resume", lambda dom: dom.resume())

    def destroy(self, name: str) -> bool:
        """Power the domain off at once (and undefine it if persistent). False if it did not exist."""
        if (dom := self._lookup(name)) is None:
            return False
        for step in (dom.destroy, dom.undefine):
            with contextlib.suppress(libvirt.libvirtError):
                step()
        return True

    def confinement(self) -> node.Confinement:
        """How libvirt confines the QEMU processes it starts (its security models, the account they run as)."""
        with _said(f"libvirt at {self.uri} did not describe its host"):
            return node.Confinement.of(self._conn.getCapabilities())

    def node(self) -> node.Node:
        c = self._conn
        with _said(f"libvirt at {self.uri} did not describe its host"):
            kvm_error = None
            try:
                c.getDomainCapabilities(None, "x86_64", None, "kvm", 0)
            except libvirt.libvirtError as exc:
                kvm_error = _message(exc)
            stats = c.getMemoryStats(libvirt.VIR_NODE_MEMORY_STATS_ALL_CELLS)
            versions = (c.getHostname(), self.version(), self.qemu_version(), int(c.getInfo()[2]))
            here = node.here(self.uri)
            meminfo = usage.PROC.joinpath("meminfo").read_text() if here else None  # the kernel's own figure, here
            held = usage.reserved_mib() if here else 0
            return node.Node.of(*versions, stats, c.getCapabilities(), kvm_error, meminfo=meminfo, reserved_mib=held)

    def pool(self, name: str, path: str) -> str:
        """The directory of dir pool NAME, made at PATH if there is none, running and started with libvirtd."""
        hint = "set `pool_path` of that host in ~/.config/vmsandbox/config.yaml to a directory libvirtd may use"
        with _said(f"libvirt at {self.uri} could not make its storage pool {name} at {path}", hint):
            try:
                pool = self._conn.storagePoolLookupByName(name)
            except libvirt.libvirtError:
                pool = self._conn.storagePoolDefineXML(storage.pool_xml(name, path), 0)
                pool.build(0)
                pool.setAutostart(1)
            if not pool.isActive():
                pool.create(0)
            _refresh(pool)
            return str(ET.fromstring(pool.XMLDesc(0)).findtext("target/path", ""))  # noqa: S314 - as node()

    def volumes(self, pool: str) -> dict[str, str]:
        """The volumes of a pool as its host sees them now: name -> path there ({} if there is no such pool)."""
        listed: dict[str, str] = {}
        try:
            found = self._conn.storagePoolLookupByName(pool)
            active = found.isActive()
            if active:
                _refresh(found)
            for v in found.listAllVolumes(0) if active else ():
                with contextlib.suppress(libvirt.libvirtError):  # deleted since (another session's teardown)
                    listed[v.name()] = v.path()
        except libvirt.libvirtError as exc:
            if exc.get_error_code() != libvirt.VIR_ERR_NO_STORAGE_POOL:
                raise VmsandboxError(f"cannot list the volumes of pool {pool} at {self.uri}: {_message(exc)}") from exc
        return listed

    def allocations(self, pool: str) -> dict[str, int]:
        """The bytes each volume of a pool takes on its host's disk ({} if the pool does not answer)."""
        got: dict[str, int] = {}
        with contextlib.suppress(libvirt.libvirtError):
            for v in self._conn.storagePoolLookupByName(pool).listAllVolumes(0):
                with contextlib.suppress(libvirt.libvirtError):  # deleted since
                    got[v.name()] = int(v.info()[2])
        return got

    def clone_volume(self, pool: str, source: str, name: str, head: bytes = b"", fmt: str | None = None) -> str:
        """A copy of volume SOURCE as NAME (0600, in format `fmt` or the source's), made by the pool's host (holes
        kept; a qcow2 one flattened), with `head` written over its first bytes; its path there."""
        hint = "check free space in the pool's directory on that host"
        with _said(f"cannot copy volume {source} at {self.uri}", hint):
            found = self._conn.storagePoolLookupByName(pool)
            src = found.storageVolLookupByName(source)
            vol = found.createXMLFrom(storage.copy_xml(name, src.XMLDesc(0), fmt), src, 0)
            if head:  # written in place: the rest of the volume is kept
                stream = self._conn.newStream(0)
                vol.upload(stream, 0, len(head), 0)
                stream.sendAll(lambda _s, n, buf: buf.read(n), io.BytesIO(head))
                stream.finish()
            return str(vol.path())

    def delete_volume(self, pool: str, name: str) -> None:
        with contextlib.suppress(libvirt.libvirtError):
            self._conn.storagePoolLookupByName(pool).storageVolLookupByName(name).delete(0)

    def create_volume(self, pool: str, xml: str) -> str:
        """Make a volume in a pool from its XML; its path on the pool's host."""
        with _said(f"cannot make a volume in pool {pool} at {self.uri}"):
            return str(self._conn.storagePoolLookupByName(pool).createXML(xml, 0).path())

    def upload(
        self,
        pool: str,
        name: str,
        source: Path,
        progress: storage.Progress | None = None,
        patches: dict[int, bytes] | None = None,
        mode: str = "0644",
        hashed: bool = True,
    ) -> str:
        """Make volume NAME (replacing one of that name) holding SOURCE's bytes (with `patches` laid over them),
        holes kept as holes; return the SHA-256 of what was sent (if `hashed`)."""
        self.delete_volume(pool, name)
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW)
        stream = self._conn.newStream(0)
        try:
            size = os.fstat(fd).st_size
            vol = self._conn.storagePoolLookupByName(pool).createXML(storage.volume_xml(name, size, mode=mode), 0)
            sending = storage.Outgoing(fd, progress, patches, hashed=hashed)
            vol.upload(stream, 0, size, libvirt.VIR_STORAGE_VOL_UPLOAD_SPARSE_STREAM)
            stream.sparseSendAll(sending.read, sending.section, sending.skip, None)
            stream.finish()
            return sending.sha.hexdigest()
        except libvirt.libvirtError as exc:
            with contextlib.suppress(libvirt.libvirtError):
                stream.abort()
            self.delete_volume(pool, name)
            raise VmsandboxError(
                f"uploading {source.name} to pool {pool} at {self.uri} failed: {_message(exc)}",
                hint="check free space in the pool's directory on that host (`pool_path`), then try again",
            ) from exc
        finally:
            os.close(fd)

    def download(
        self, pool: str, name: str, *, keep: int = 0, into: int | None = None, length: int = 0
    ) -> storage.Incoming:
        """Read volume NAME back (its first `length` bytes; 0: all): its SHA-256 (holes as zeros), its first `keep`
        bytes, and with `into` (an open file) a sparse copy of it there."""
        stream = self._conn.newStream(0)
        try:
            vol = self._conn.storagePoolLookupByName(pool).storageVolLookupByName(name)
            got = storage.Incoming(keep, into)
            vol.download(stream, 0, length, libvirt.VIR_STORAGE_VOL_DOWNLOAD_SPARSE_STREAM)
            stream.sparseRecvAll(got.data, got.hole, None)
            stream.finish()
        except libvirt.libvirtError as exc:
            with contextlib.suppress(libvirt.libvirtError):
                stream.abort()
            raise VmsandboxError(f"reading volume {name} of pool {pool} at {self.uri} failed: {_message(exc)}") from exc
        return got


def _abort_job(dom: Any) -> None:
    with contextlib.suppress(libvirt.libvirtError):  # (refused: the job has ended, or the domain is gone)
        dom.abortJob()
