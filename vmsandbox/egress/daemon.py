"""The proxy daemon of one session: `python -m vmsandbox.egress.daemon NAME` (started by control.py).

It holds an SSH connection to the guest (as root, pinned host key) with a remote forward of the guest's
127.0.0.1:3128. Each connection the guest makes there arrives as an SSH channel, served by the asyncio proxy
through a socket pair (doorway.py): the proxy listens on no host socket, so every request it sees comes from
this session's guest. It also serves the session's published ports (published.py) over the same connection.

At each connection it steps the guest's clock to the host's. It restores the forward when the connection
drops, and exits when the session is removed, its VM is gone, or on SIGTERM. Its state never says "up" while
the door is not served: a failure of the forwarder is recorded as down with its reason (the forward is made
again, or the daemon exits and the next `exec`/`shell` restarts it); a link whose guest stopped reading it is
closed and made again. If it dies, the guest's door closes with its SSH connection (fails closed).

Run by root, it is not root by the time the guest can send it anything: it opens its files (egress.held) and
reads the session's keys and CA, takes its session's secrets from its stdin, then becomes a uid of its own
(egress.account) within its limits (egress.rules.limits). Its log escapes what the guest says in it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
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

from vmsandbox import paths, ui
from vmsandbox.egress import account, control, policy, proxylog
from vmsandbox.egress.control import Door, Spec
from vmsandbox.egress.door.doorway import Doorway
from vmsandbox.egress.door.published import Published
from vmsandbox.egress.door.pump import Pump
from vmsandbox.egress.held import Held
from vmsandbox.egress.policy import ProxyConfig
from vmsandbox.egress.relay.certs import Issuer
from vmsandbox.egress.relay.proxy import Proxy
from vmsandbox.egress.relay.upstream import Resolver, resolve_checked, verified_tls
from vmsandbox.egress.rules import limits
from vmsandbox.egress.rules.limits import Limits
from vmsandbox.egress.rules.netpolicy import GUEST_PROXY_PORT
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest import channel, ssh
from vmsandbox.guest.ssh import Endpoint
from vmsandbox.vm.node import gone

log = logging.getLogger("vmsandbox.egress.daemon")
WATCH_INTERVAL = 2.0
ACCEPT_WAIT = 1.0  # the forwarder's longest wait for the guest's next connection (a stop ends it at once)
MAX_BACKOFF = 10.0
BOOT_WAIT = 600.0  # the longest a daemon waits for its guest's first banner
CLOCK_TIMEOUT = 10.0  # stepping the guest's clock at each connect
LOG_FORMAT = "%(asctime)s egressd[%(process)d] %(levelname)s %(message)s"


class Daemon:
    def __init__(
        self,
        name: str,
        *,
        resolver: Resolver = resolve_checked,
        upstream_tls: Callable[[], ssl.SSLContext] = verified_tls,
        limits: Limits = Limits(),  # noqa: B008 - frozen
    ) -> None:
        self.files = paths.session_paths(name)
        # everything it reads or writes later is opened now, while it may still be root (account.py)
        self.spec_file = Held.open(self.files.egress_daemon)
        self.spec = Spec.parse(self.spec_file.text())
        self.config_file = Held.open(self.files.egress_config) if self.files.egress_config.exists() else None
        self.state_file = Held.open(self.files.egress_state, writable=True)
        self.endpoint = Endpoint(name, self.spec.ssh_port, "root", self.files)
        self.keys = channel.load_keys(self.endpoint)
        self.limits = limits
        self.secrets: dict[str, str] = {}  # its session's, handed over on stdin (main)
        self.dropped = False  # it became an account of its own: libvirt is not its to ask
        self.stop = threading.Event()
        self.failure: str | None = None  # why it stopped, when it stopped of a fault
        self.loop = asyncio.new_event_loop()
        self._config: tuple[tuple[int, int], ProxyConfig] | None = None
        self._issuer = Issuer(self.files.ca_cert, self.files.ca_key) if self.files.ca_key.exists() else None
        self.proxy = Proxy(
            self._load_config,
            proxylog.Writer(self.files.proxy_log),
            self.secrets.get,
            lambda: self._issuer,
            resolver=resolver,
            upstream_tls=upstream_tls,
            limits=limits,
        )
        self.link: channel.Link | None = None
        self.beat = time.monotonic()  # the forwarder's last round
        self.hung: str | None = None  # why the watch closed the link (its writes hung)
        self.clock_right = self.spec.fresh  # the guest's clock needs no step at the next link
        self.doorway = Doorway(self.proxy, self.loop, limits)
        self.published = Published(lambda: self.link, self.stop)
        self.door = Door.DOWN
        self.published.open(self.spec.publish, start=False)

    def _load_config(self) -> ProxyConfig:
        """Re-read per connection when the file changed (`allow`, `deny`, `clean` rewrite it in place)."""
        if self.config_file is None:
            raise VmsandboxError(f"session {self.spec.session} has no egress policy")
        version = self.config_file.version()
        if self._config is None or self._config[0] != version:
            self._config = (version, policy.proxy_config(json.loads(self.config_file.text())))
        return self._config[1]

    def _state(self, door: Door, error: str | None = None) -> None:
        self.door = door
        with contextlib.suppress(OSError):  # the session directory may be gone already: the daemon ends
            control.write_state(self.files, door, error, ports=self.published.places(), into=self.state_file)

    def _vm_running(self) -> bool:
        if self.dropped:
            return True  # not its to ask: it ends when its session goes or when it is stopped
        from vmsandbox.vm.virt import Hypervisor  # here: a daemon that dropped root never loads libvirt's module

        try:
            with Hypervisor(self.spec.libvirt_uri) as hv:
                return not gone(hv.info(self.spec.domain))
        except VmsandboxError:
            return True  # libvirt down is not the VM gone: keep trying

    # ------------------------------------------------------------ forwarder thread

    def _await_sshd(self) -> socket.socket | None:
        """Spawned while its guest boots: wait for sshd's banner before the first connect (not in backoff), on a
        connection the first link then uses (every connection costs the guest a login's start-up)."""
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
            return ssh.banner_socket(self.spec.ssh_port, timeout=BOOT_WAIT, alive=alive)
        except VmsandboxError as exc:
            log.info("sshd did not answer: %s", exc.message)  # the forward loop says what follows
            return None

    def forward(self) -> None:
        """The forwarder thread. Whatever ends it is recorded (down, with the reason) and ends the daemon."""
        try:
            self._forward()
        except BaseException as exc:
            self.failure = f"the forwarder failed: {type(exc).__name__}: {exc}"
            log.exception("the forwarder failed; the daemon stops (the next exec or shell restarts it)")
            self._state(Door.DOWN, self.failure)
            self.stop.set()
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)

    def _forward(self) -> None:
        self._state(Door.DOWN, "waiting for the guest's sshd")
        sock = self._await_sshd()
        backoff = 0.5
        while not self.stop.is_set():
            error, sock = self._hold_forward(sock), None
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

    def _hold_forward(self, sock: socket.socket | None = None) -> str:
        """One SSH link (on `sock` if given), held until it ends: why it ended (the state says so before the link
        goes)."""
        try:
            link = channel.connect(self.endpoint, user="root", keys=self.keys, sock=sock)
        except VmsandboxError as exc:
            return exc.message
        except Exception as exc:  # noqa: BLE001 - its files went away under it (removed), or anything else
            return f"cannot connect: {type(exc).__name__}: {exc}"
        error = "the SSH connection to the guest ended"
        try:
            link.keepalive(15)
            link.limit_window(self.limits.window)
            # the guest's clock is behind after a restore (a checkpoint, `start`, a suspended host): step it to
            # ours before the door opens, so that whoever waits for the door gets a guest with the right time
            # (not at the first link with a guest that starts now: its clock came from the host at its start)
            if not self.clock_right and (
                link.run_unread(f"date -s @{time.time():.3f} >/dev/null 2>&1", timeout=CLOCK_TIMEOUT) != 0
            ):
                log.warning("could not step the guest's clock")
            self.clock_right = False
            if self.spec.door:
                link.forward_remote(GUEST_PROXY_PORT)
                log.info("guest 127.0.0.1:%d is open", GUEST_PROXY_PORT)
            self.beat = time.monotonic()
            self.link = link
            self._state(Door.UP)
            while link.active and not self.stop.is_set():
                self.beat = time.monotonic()
                ch = link.accept(timeout=ACCEPT_WAIT)
                if ch is not None:
                    self.doorway.serve(ch)
        except channel.LinkError as exc:
            error = str(exc)
        except Exception as exc:  # any failure ends this link (said in the state); another is made
            log.exception("the forward failed")
            error = f"the forward failed: {type(exc).__name__}: {exc}"
        finally:
            error, self.hung = self.hung or error, None
            self._state(Door.DOWN, error)  # before the link goes: never "up" without one
            self.link = None
            link.close()
        return error

    # ------------------------------------------------------------ main

    def reload_ports(self) -> None:
        """SIGUSR1: the session's published ports changed (`vmsandbox port publish|rm`)."""
        try:
            self.spec = Spec.parse(self.spec_file.text())
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("cannot reload the published ports: %s", exc)
            return
        self.published.open(self.spec.publish)
        self._state(self.door)

    async def _watch(self) -> None:
        """The session removed, or a stop asked for: end the loop (even if the forwarder thread died). A link
        whose writes hang (its guest stopped reading it) is closed, so that the forwarder makes another."""
        while not self.stop.is_set():
            if self.spec_file.removed:
                self.stop.set()
                break
            self._check_stalls()
            await asyncio.sleep(WATCH_INTERVAL)
        await asyncio.sleep(WATCH_INTERVAL)  # the forwarder's own way out first, if it is alive
        self.loop.stop()

    def _check_stalls(self) -> None:
        now, link, lim = time.monotonic(), self.link, self.limits.stall
        pumps = [p for p in (self.doorway.pump, self.published.pump) if p is not None]
        late = [f"the {p.name} pump" for p in pumps if p.stalled(now) > lim]
        late += ["the forwarder"] if now - self.beat > lim else []
        if late and link is not None:
            self.hung = f"{late[0]} waited on the SSH link for {lim:.0f} s (the guest reads nothing)"
            self._state(Door.DOWN, self.hung)  # before the link goes: never "up" without one
            link.close()
        dead = [p.name for p in pumps if not p.alive]
        if dead:
            self.failure = f"the {dead[0]} pump stopped"
            self.stop.set()

    def _stopping(self) -> None:
        """SIGTERM, SIGINT, SIGHUP: stop now. The forwarder, waiting for the guest's next connection, is woken
        (a stop waits for the daemon to end: a checkpoint, a fork, `stop`), and ends its link as at any end."""
        self.stop.set()
        link = self.link
        if link is not None:
            link.interrupt()

    def run(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            self.loop.add_signal_handler(sig, self._stopping)
        self.loop.add_signal_handler(signal.SIGUSR1, self.reload_ports)
        lim = self.limits
        self.loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(lim.resolver_threads, "resolver"))
        pumps = [self.doorway.open()]
        self.published.pump = Pump("ports", lim.published, send_timeout=lim.send_timeout, idle_timeout=lim.idle_timeout)
        pumps.append(self.published.pump)
        forwarder = threading.Thread(target=self.forward, name="forwarder", daemon=True)
        forwarder.start()
        self.published.start()
        self.loop.create_task(self._watch())
        self.loop.run_forever()
        tasks = asyncio.all_tasks(self.loop)  # the watcher, and connections still open: each ends as any does
        for task in tasks:  # (its log line, then its close)
            task.cancel()
        if tasks:
            self.loop.run_until_complete(asyncio.wait(tasks, timeout=lim.send_timeout))
        self._state(Door.DOWN, self.failure or "stopped")
        for pump in pumps:
            pump.close()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):  # here, in the main thread:
            self.loop.remove_signal_handler(sig)  # a loop collected in another thread could not (a ValueError)


def main(argv: list[str], daemon: Callable[[str], Daemon] = Daemon) -> int:
    """Run the daemon of session argv[0] (`daemon` builds it: tests give their own resolver through it)."""
    sys.stderr = ui.log_escaped(sys.stderr, LOG_FORMAT)  # its log escapes what the guest says in it
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
        limits.apply(served.limits, own_uid=uid is not None)
    except (OSError, ValueError, KeyError, VmsandboxError) as exc:
        log.error("cannot start: %s", exc)  # noqa: TRY400 - the message is the whole story
        return 1
    start = time.monotonic()
    served.run()
    log.info("stopped after %.0f s", time.monotonic() - start)
    return 0 if served.failure is None else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
