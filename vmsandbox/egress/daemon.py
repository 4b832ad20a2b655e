"""The proxy daemon of one session: `python -m vmsandbox.egress.daemon NAME` (started by control.py).

It holds an SSH connection to the guest (as root, pinned host key) with a remote forward of the guest's
127.0.0.1:3128. Each connection the guest makes there arrives as an SSH channel and is served by the
asyncio proxy through a socket pair: the proxy never listens on any host socket, so nothing else on the
host can use it, and every request it sees comes from this session's guest.

It also serves the session's published ports: it listens on the host's loopback addresses (or the one
`--publish-address` names) and carries each connection to the guest's 127.0.0.1:PORT over the same SSH
connection, so a dev server that binds only localhost in the guest is reachable too.

At each connection it steps the guest's clock to the host's. It restores the forward when the connection
drops, and exits when the session is removed, its VM is gone, or on SIGTERM. If it dies, the SSH connection
dies with it and the guest's door closes (fails closed). Everything it serves comes from the session's spec
file (control.Spec).

Run by root, it is not root by the time the guest can send it anything: it opens its files (egress.held) and
reads the session's keys and CA, takes its session's secrets from its stdin, then becomes a uid of its own
(egress.account).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from vmsandbox import paths
from vmsandbox.egress import account, control, policy, ports
from vmsandbox.egress import log as proxylog
from vmsandbox.egress.certs import Issuer
from vmsandbox.egress.control import Door, Spec
from vmsandbox.egress.held import Held
from vmsandbox.egress.netpolicy import GUEST_PROXY_PORT
from vmsandbox.egress.policy import ProxyConfig
from vmsandbox.egress.proxy import Proxy
from vmsandbox.egress.upstream import Resolver, resolve_checked, verified_tls
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest import channel, ssh
from vmsandbox.guest.ssh import Endpoint
from vmsandbox.vm.node import gone
from vmsandbox.vm.virt import Hypervisor

log = logging.getLogger("vmsandbox.egress.daemon")
WATCH_INTERVAL = 2.0
MAX_BACKOFF = 10.0
BOOT_WAIT = 600.0  # the longest a daemon waits for its guest's first banner
CLOCK_TIMEOUT = 10.0  # stepping the guest's clock at each connect


class Daemon:
    def __init__(
        self,
        name: str,
        *,
        resolver: Resolver = resolve_checked,
        upstream_tls: Callable[[], ssl.SSLContext] = verified_tls,
    ) -> None:
        self.files = paths.session_paths(name)
        # everything it reads or writes later is opened now, while it may still be root (account.py)
        self.spec_file = Held.open(self.files.egress_daemon)
        self.spec = Spec.parse(self.spec_file.text())
        self.config_file = Held.open(self.files.egress_config) if self.files.egress_config.exists() else None
        self.state_file = Held.open(self.files.egress_state, writable=True)
        self.endpoint = Endpoint(name, self.spec.ssh_port, "root", self.files)
        self.keys = channel.load_keys(self.endpoint)
        self.secrets: dict[str, str] = {}  # its session's, handed over on stdin (main)
        self.dropped = False  # it became an account of its own: libvirt is not its to ask
        self.stop = threading.Event()
        self.loop = asyncio.new_event_loop()
        self._config: tuple[tuple[int, int], ProxyConfig] | None = None
        self._issuer = Issuer(self.files.ca_cert, self.files.ca_key) if self.files.ca_key.exists() else None
        self.proxy = Proxy(
            self._load_config,
            proxylog.Writer(self.files.proxy_log),
            self.secrets.get,
            self._get_issuer,
            resolver=resolver,
            upstream_tls=upstream_tls,
        )
        self.link: channel.Link | None = None
        self.listeners: dict[tuple[str, int, int], socket.socket] = {}  # (address, host port, guest port)
        self.ports_lock = threading.Lock()  # the listeners change in the loop's thread, are reported in others
        self.door = Door.DOWN
        self._open_ports(start=False)

    def _load_config(self) -> ProxyConfig:
        """Re-read per connection when the file changed (`allow`, `deny`, `clean` rewrite it in place)."""
        if self.config_file is None:
            raise VmsandboxError(f"session {self.spec.session} has no egress policy")
        version = self.config_file.version()
        if self._config is None or self._config[0] != version:
            self._config = (version, policy.proxy_config(json.loads(self.config_file.text())))
        return self._config[1]

    def _get_issuer(self) -> Issuer | None:
        return self._issuer

    def _state(self, door: Door, error: str | None = None) -> None:
        self.door = door
        with self.ports_lock:
            served = tuple(ports.place(address, host) for address, host, _ in self.listeners)
        with contextlib.suppress(OSError):  # the session directory may be gone already: the daemon ends
            control.write_state(self.files, door, error, ports=served, into=self.state_file)

    def _vm_running(self) -> bool:
        if self.dropped:
            return True  # not its to ask: it ends when its session goes or when it is stopped
        try:
            with Hypervisor(self.spec.libvirt_uri) as hv:
                return not gone(hv.info(self.spec.domain))
        except VmsandboxError:
            return True  # libvirt down is not the VM gone: keep trying

    # ------------------------------------------------------------ forwarder thread

    def _await_sshd(self) -> None:
        """Spawned while its guest boots: wait for sshd's banner before the first connect (not in backoff)."""
        checked = time.monotonic()

        def alive() -> str | None:
            nonlocal checked
            if self.stop.is_set():
                return "stopping"
            if time.monotonic() - checked > 1:
                checked = time.monotonic()
                if not self._vm_running():
                    return "the VM is gone"
            return None

        try:
            ssh.wait_for_banner(self.spec.ssh_port, timeout=BOOT_WAIT, alive=alive)
        except VmsandboxError as exc:
            log.info("sshd did not answer: %s", exc.message)  # the forward loop says what follows

    def forward(self) -> None:
        self._state(Door.DOWN, "waiting for the guest's sshd")
        self._await_sshd()
        backoff = 0.5
        while not self.stop.is_set():
            error = self._hold_forward()
            self._state(Door.DOWN, error)
            if self.stop.is_set():
                break
            if self.spec_file.removed or not self._vm_running():
                log.info("the session or its VM is gone; exiting")
                self.stop.set()
                break
            log.warning("forward down (%s); retrying in %.1f s", error, backoff)
            self.stop.wait(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)
        self.loop.call_soon_threadsafe(self.loop.stop)

    def _hold_forward(self) -> str | None:
        try:
            link = channel.connect(self.endpoint, user="root", keys=self.keys)
        except VmsandboxError as exc:
            return exc.message
        except OSError as exc:  # its session's files went away under it (removed): the loop exits next
            return f"cannot connect: {exc}"
        try:
            link.keepalive(15)
            # the guest's clock is behind after a restore (a checkpoint, `start`, a suspended host): step it to
            # ours before the door opens, so that whoever waits for the door gets a guest with the right time
            if link.run_unread(f"date -s @{time.time():.3f} >/dev/null 2>&1", timeout=CLOCK_TIMEOUT) != 0:
                log.warning("could not step the guest's clock")
            if self.spec.door:
                link.forward_remote(GUEST_PROXY_PORT)
                log.info("guest 127.0.0.1:%d is open", GUEST_PROXY_PORT)
            self.link = link
            self._state(Door.UP)
            while link.active and not self.stop.is_set():
                ch = link.accept(timeout=1)
                if ch is not None:
                    self._serve(ch)
        except channel.LinkError as exc:
            return str(exc)
        finally:
            self.link = None
            link.close()
        return "the SSH connection to the guest ended"

    def _serve(self, ch: Any) -> None:
        ours, theirs = socket.socketpair()
        asyncio.run_coroutine_threadsafe(self._handle(ours), self.loop)
        threading.Thread(target=channel.bridge, args=(ch, theirs), daemon=True).start()

    async def _handle(self, sock: socket.socket) -> None:
        reader, writer = await asyncio.open_connection(sock=sock)
        await self.proxy.handle(reader, writer)

    # ------------------------------------------------------------ published ports

    def _open_ports(self, *, start: bool = True) -> None:
        """Listen where the spec publishes and nowhere else (listeners no longer in it are closed)."""
        with self.ports_lock:
            self._listen({(a, p.host or 0, p.guest) for p in self.spec.publish for a in p.addresses}, start=start)

    def _listen(self, wanted: set[tuple[str, int, int]], *, start: bool) -> None:
        for key in [k for k in self.listeners if k not in wanted]:
            self.listeners.pop(key).close()  # its accept loop ends; connections it carries go on
        for key in sorted(wanted - self.listeners.keys()):
            try:
                self.listeners[key] = ports.listener(key[0], key[1])
            except OSError as exc:
                if not start:
                    raise
                log.warning("cannot publish guest port %d on %s:%d: %s", key[2], key[0], key[1], exc)
                continue
            if start:
                threading.Thread(target=self.publish, args=(self.listeners[key], key[2]), daemon=True).start()

    def reload_ports(self) -> None:
        """SIGUSR1: the session's published ports changed (`vmsandbox port NAME publish|unpublish`)."""
        try:
            self.spec = Spec.parse(self.spec_file.text())
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("cannot reload the published ports: %s", exc)
            return
        self._open_ports()
        self._state(self.door)

    def publish(self, listener: socket.socket, guest_port: int) -> None:
        """Accept on a host address and carry each connection to the guest's 127.0.0.1:guest_port."""
        listener.settimeout(1)
        while not self.stop.is_set():
            try:
                conn, peer = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            link = self.link
            if link is None:
                log.info("published port %d: no connection to the guest yet", guest_port)
                conn.close()
                continue
            try:
                ch = link.open_direct(guest_port, (str(peer[0]), int(peer[1])))
            except channel.LinkError as exc:
                log.info("published port %d: %s", guest_port, exc)
                conn.close()
                continue
            conn.settimeout(None)
            threading.Thread(target=channel.bridge, args=(ch, conn), daemon=True).start()

    # ------------------------------------------------------------ main

    async def _watch(self) -> None:
        """The session removed, or a stop asked for: end the loop (even if the forwarder thread died)."""
        while not self.stop.is_set():
            if self.spec_file.removed:
                self.stop.set()
                break
            await asyncio.sleep(WATCH_INTERVAL)
        await asyncio.sleep(WATCH_INTERVAL)  # the forwarder's own way out first, if it is alive
        self.loop.stop()

    def run(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            self.loop.add_signal_handler(sig, self.stop.set)
        self.loop.add_signal_handler(signal.SIGUSR1, self.reload_ports)
        forwarder = threading.Thread(target=self.forward, name="forwarder", daemon=True)
        forwarder.start()
        for (_, _, guest_port), listener in self.listeners.items():
            threading.Thread(target=self.publish, args=(listener, guest_port), daemon=True).start()
        watcher = self.loop.create_task(self._watch())
        self.loop.run_forever()
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            self.loop.run_until_complete(watcher)
        self._state(Door.DOWN, "stopped")
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):  # here, in the main thread:
            self.loop.remove_signal_handler(sig)  # a loop collected in another thread could not (a ValueError)


def main(argv: list[str], daemon: Callable[[str], Daemon] = Daemon) -> int:
    """Run the daemon of session argv[0] (`daemon` builds it: tests give their own resolver through it)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s egressd[%(process)d] %(levelname)s %(message)s")
    if len(argv) != 1:
        print("usage: python -m vmsandbox.egress.daemon SESSION", file=sys.stderr)
        return 2
    try:
        uid, given = account.handed(sys.stdin.buffer if sys.stdin is not None else None)
        served = daemon(argv[0])
        served.secrets.update(given)
        if uid is not None:
            account.become(uid)
            served.dropped = True
            log.info("running as uid %d", uid)
    except (OSError, ValueError, KeyError, VmsandboxError) as exc:
        log.error("cannot start: %s", exc)  # noqa: TRY400 - the message is the whole story
        return 1
    start = time.monotonic()
    served.run()
    log.info("stopped after %.0f s", time.monotonic() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
