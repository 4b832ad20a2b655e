"""The identity a warm-started guest receives over its identity port (a virtio-serial channel whose host end
is a unix socket in the session directory): the session's fw_cfg files, the host's clock and fresh random
bytes, as one tar. The guest's side is `identity warm` (images/base/rootfs/usr/local/lib/vmsandbox/identity).

On another host the port is reached through libvirt (`send_through`, given Hypervisor.exchange): its socket
is that host's.

The guest answers with one line. That line is guest bytes reaching the host: it is read bounded, compared
with "ok", and otherwise only ever shown escaped.
"""

from __future__ import annotations

import io
import secrets
import socket
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

from vmsandbox import ui
from vmsandbox.errors import VmsandboxError

HEADER = "vmsandbox-identity"
REPLY_LIMIT = 512
SEED_BYTES = 64
SKIP = frozenset({"template"})  # the template marker is the domain's, not the identity's


def bundle(fwcfg_dir: Path, *, now: float | None = None, seed: bytes | None = None) -> bytes:
    """The tar the guest unpacks: every identity file, `clock` (seconds since the epoch) and `seed`."""
    members = {f.name: f.read_bytes() for f in sorted(fwcfg_dir.iterdir()) if f.is_file() and f.name not in SKIP}
    members["clock"] = f"{time.time() if now is None else now:.6f}\n".encode()
    members["seed"] = secrets.token_bytes(SEED_BYTES) if seed is None else seed
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o600, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def send(sock: Path, fwcfg_dir: Path, *, timeout: float) -> float:
    """Send the identity and wait for the guest's answer; the seconds it took. Raises with the guest's
    (escaped) answer when it is not "ok"."""
    started = time.monotonic()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            s.connect(str(sock))
            s.sendall(message(fwcfg_dir))
            reply = read_line(s)
        except TimeoutError:
            raise VmsandboxError(f"the guest did not take its identity within {timeout:.0f} s") from None
        except OSError as exc:
            raise VmsandboxError(f"the identity port failed: {exc.strerror or exc}") from exc
    _check(reply)
    return time.monotonic() - started


def send_through(exchange: Callable[[bytes], bytes], fwcfg_dir: Path, *, timeout: float) -> float:
    """`send`, through `exchange` (it sends the message and returns the guest's answer, at most REPLY_LIMIT bytes
    up to a newline, or raises TimeoutError)."""
    started = time.monotonic()
    try:
        reply = exchange(message(fwcfg_dir))
    except TimeoutError:
        raise VmsandboxError(f"the guest did not take its identity within {timeout:.0f} s") from None
    _check(reply.split(b"\n", 1)[0][:REPLY_LIMIT].strip())
    return time.monotonic() - started


def message(fwcfg_dir: Path) -> bytes:
    """What goes to the guest: a header line with the length, then the bundle (the clock read as late as can be)."""
    data = bundle(fwcfg_dir)
    return f"{HEADER} {len(data)}\n".encode() + data


def _check(reply: bytes) -> None:
    if reply != b"ok":
        shown = ui.printable(reply.decode(errors="replace"), markup=False)
        raise VmsandboxError(f"the guest did not take its identity: {shown or '(no answer)'}")


def read_line(s: socket.socket) -> bytes:
    """One line from the guest, at most REPLY_LIMIT bytes (a longer one is cut there)."""
    got = b""
    while b"\n" not in got and len(got) < REPLY_LIMIT:
        chunk = s.recv(REPLY_LIMIT - len(got))
        if not chunk:
            break
        got += chunk
    return got.split(b"\n", 1)[0][:REPLY_LIMIT].strip()
