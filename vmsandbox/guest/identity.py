"""The identity a warm-started guest receives over its identity port (a virtio-serial channel whose host end
is a unix socket in the session directory): the session's fw_cfg files, the host's clock and fresh random
bytes, as one tar. The guest's side is `identity warm` (images/base/rootfs/usr/local/lib/vmsandbox/identity).

On another host the port is reached through libvirt (`send_through`, given Hypervisor.exchange): its socket
is that host's.

The guest answers with one line: "ok forks" from a guest whose `identity` stays on the port, where a fork of its
memory gets its own identity the same way (`hand_over`: "taking" at once, then that line), "ok" from an older
one. Those lines are guest bytes reaching the host: each is read bounded, compared with what is expected, and
otherwise only ever shown escaped.
"""

from __future__ import annotations

import io
import secrets
import socket
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vmsandbox import ui
from vmsandbox.errors import VmsandboxError

HEADER = "vmsandbox-identity"
OK, SERVING, TAKING = b"ok", b"ok forks", b"taking"  # the guest's answers (`identity warm`, `serve`)
REPLY_LIMIT = 512
LOOK = 1.0  # seconds between two looks at whether a guest that has not answered yet still can
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


class NotListeningError(VmsandboxError):
    """Nothing on the guest's end of the port took a fork's identity (`hand_over`)."""


def send(sock: Path, fwcfg_dir: Path, *, timeout: float) -> bool:
    """Send the identity and wait for the guest's answer: whether its forks can get theirs on their port too
    (record.identity_port). Raises with the guest's (escaped) answer when it is not "ok"."""
    with _connect(sock, timeout) as s:
        try:
            s.sendall(message(fwcfg_dir))
            reply = Lines(s).next(within=timeout)
        except TimeoutError:
            raise VmsandboxError(f"the guest did not take its identity within {timeout:.0f} s") from None
        except OSError as exc:
            raise VmsandboxError(f"the identity port failed: {exc.strerror or exc}") from exc
    return _check(reply)


@dataclass(frozen=True)
class Handed:
    """A fork's identity taken on its port (`hand_over`); `serving`: the fork's forks can get theirs so too."""

    serving: bool


def hand_over(
    sock: Path, fwcfg_dir: Path, *, ack: float, timeout: float, alive: Callable[[], str | None] | None = None
) -> Handed:
    """A fork's identity on the fork's port, where its source's `identity`, restored with the source's memory,
    still listens: it says "taking" within `ack` seconds (else NotListeningError: the host hands it over another
    way), then answers as at a warm start within `timeout` (each a deadline for the whole line, however the
    guest doles out its bytes), unless `alive` (asked every LOOK seconds meanwhile) says why it never will."""
    try:
        s = _connect(sock, ack)
    except VmsandboxError as exc:  # no port to connect to: the host hands it over another way
        raise NotListeningError(f"the fork's port did not take its identity: {exc.message}") from None
    with s:
        lines = Lines(s)
        try:
            s.sendall(message(fwcfg_dir))
            first = lines.next(within=ack)
        except (TimeoutError, OSError) as exc:
            reason = f"no answer within {ack:.0f} s" if isinstance(exc, TimeoutError) else str(exc.strerror or exc)
            raise NotListeningError(f"the fork's port did not take its identity: {reason}") from None
        if first != TAKING:
            raise NotListeningError(f"the fork's port did not take its identity: {_shown(first)}")
        try:
            reply = lines.next(within=timeout, alive=alive)
        except TimeoutError:
            raise VmsandboxError(f"the fork did not take its identity within {timeout:.0f} s") from None
        except OSError as exc:
            raise VmsandboxError(f"the identity port failed: {exc.strerror or exc}") from exc
    return Handed(_check(reply))


def _connect(sock: Path, timeout: float) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(str(sock))
    except OSError as exc:
        s.close()
        if isinstance(exc, TimeoutError):
            raise VmsandboxError(f"the identity port did not answer within {timeout:.0f} s") from None
        raise VmsandboxError(f"the identity port failed: {exc.strerror or exc}") from exc
    return s


def send_through(exchange: Callable[[bytes], bytes], fwcfg_dir: Path, *, timeout: float) -> bool:
    """`send`, through `exchange` (it sends the message and returns the guest's answer, at most REPLY_LIMIT bytes
    up to a newline, or raises TimeoutError)."""
    try:
        reply = exchange(message(fwcfg_dir))
    except TimeoutError:
        raise VmsandboxError(f"the guest did not take its identity within {timeout:.0f} s") from None
    return _check(reply.split(b"\n", 1)[0][:REPLY_LIMIT])


def message(fwcfg_dir: Path) -> bytes:
    """What goes to the guest: a header line with the length, then the bundle (the clock read as late as can be)."""
    data = bundle(fwcfg_dir)
    return f"{HEADER} {len(data)}\n".encode() + data


def _check(reply: bytes) -> bool:
    """Whether the guest serves its forks' identities (the reply "ok forks"; "ok": it took its own only); the
    reply is compared as it came, byte for byte."""
    if reply in (OK, SERVING):
        return reply == SERVING
    raise VmsandboxError(f"the guest did not take its identity: {_shown(reply)}")


def _shown(reply: bytes) -> str:
    return ui.printable(reply.decode(errors="replace").strip(), markup=False) or "(no answer)"


class Lines:
    """The guest's lines on a socket, each at most REPLY_LIMIT bytes (a longer one is cut there)."""

    def __init__(self, s: socket.socket) -> None:
        self.s, self.buf = s, b""

    def next(self, *, within: float, alive: Callable[[], str | None] | None = None) -> bytes:
        """The next line, whole within `within` seconds (else TimeoutError), without its newline; raises with
        what `alive` says (asked every LOOK seconds while nothing comes) once it says the guest will not answer."""
        deadline = time.monotonic() + within
        while b"\n" not in self.buf and len(self.buf) < REPLY_LIMIT:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            self.s.settimeout(left if alive is None else min(left, LOOK))
            try:
                chunk = self.s.recv(REPLY_LIMIT - len(self.buf))
            except TimeoutError:
                if alive is not None and (why := alive()) is not None:
                    raise VmsandboxError(f"the guest will not answer: {why}") from None
                continue
            if not chunk:
                break
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line[:REPLY_LIMIT]
