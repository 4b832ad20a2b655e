"""The proxy daemon of one session: `python -m vmsandbox.egress.daemon NAME` (started by vmsandbox.egress.policy).

It holds an SSH connection to the guest (as root, pinned host key) with a remote forward of the guest's
127.0.0.1:3128. Each connection the guest makes there arrives as an SSH channel and is served by the
asyncio proxy through a socket pair: the proxy never listens on any host socket, so nothing else on the
host can use it, and every request it sees comes from this session's guest.

It also serves the session's published ports (`--publish`): it listens on the host's loopback addresses
(or the one `--publish-address` names) and carries each connection to the guest's 127.0.0.1:PORT over the
same SSH connection, so a dev server that binds only localhost in the guest is reachable too.

It restores the forward when the connection drops, and exits when the session is removed, its VM is gone,
or on SIGTERM. If it dies, the SSH connection dies with it and the guest's door closes (fails closed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
import threading
import time

import paramiko

from vmsandbox.egress import policy as egress
from vmsandbox.egress import secrets as secretstore
from vmsandbox.egress.certs import Issuer
from vmsandbox.egress.netpolicy import GUEST_PROXY_PORT
from vmsandbox.egress.proxy import Proxy, ProxyConfig
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest import ssh
from vmsandbox.session import core as session

log = logging.getLogger("vmsandbox.egress.daemon")
WATCH_INTERVAL = 2.0
MAX_BACKOFF = 10.0


class Daemon:
    def __init__(self, record: session.Record) -> None:
        self.record = record
        self.files = record.files
        self.stop = threading.Event()
        self.loop = asyncio.new_event_loop()
        self._config: tuple[float, ProxyConfig] | None = None
        self._issuer: Issuer | None = None
        self.proxy = Proxy(self._load_config, self.files.proxy_log, secretstore.get, self._get_issuer)
        self.egress = record.network != "none"
        self.transport: paramiko.Transport | None = None
        self.listeners = [
            (session.listener(address, p["host"]), int(p["guest"]))
            for p in record.publish
            for address in p["addresses"]
        ]

    def _load_config(self) -> ProxyConfig:
        """Re-read per connection when the file changed (`clean` revokes placeholders this way)."""
        mtime = self.files.egress_config.stat().st_mtime
        if self._config is None or self._config[0] != mtime:
            self._config = (mtime, egress.proxy_config(egress.read_config(self.files)))
        return self._config[1]

    def _get_issuer(self) -> Issuer | None:
        if self._issuer is None and self.files.ca_key.exists():
            self._issuer = Issuer(self.files.ca_cert, self.files.ca_key)
        return self._issuer

    # ------------------------------------------------------------ forwarder thread

    def forward(self) -> None:
        backoff = 0.5
        while not self.stop.is_set():
            error = self._hold_forward()
            egress.write_state(self.files, "down", error)
            if self.stop.is_set():
                break
            if not self.files.record.exists() or not session.is_running(self.record):
                log.info("the session or its VM is gone; exiting")
                self.stop.set()
                break
            log.warning("forward down (%s); retrying in %.1f s", error, backoff)
            self.stop.wait(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)
        self.loop.call_soon_threadsafe(self.loop.stop)

    def _hold_forward(self) -> str | None:
        try:
            client = ssh.connect(self.record.endpoint(), user="root")
        except VmsandboxError as exc:
            return exc.message
        try:
            transport = client.get_transport()
            if transport is None:
                return "no SSH transport"
            transport.set_keepalive(15)
            if self.egress:
                transport.request_port_forward(ssh.LOOPBACK, GUEST_PROXY_PORT)
                log.info("guest 127.0.0.1:%d is open", GUEST_PROXY_PORT)
            self.transport = transport
            egress.write_state(self.files, "up")
            while transport.is_active() and not self.stop.is_set():
                channel = transport.accept(timeout=1)
                if channel is not None:
                    self._serve(channel)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            return f"{type(exc).__name__}: {exc}"
        finally:
            self.transport = None
            client.close()
        return "the SSH connection to the guest ended"

    def _serve(self, channel: paramiko.Channel) -> None:
        ours, theirs = socket.socketpair()
        asyncio.run_coroutine_threadsafe(self._handle(ours), self.loop)
        threading.Thread(target=_bridge, args=(channel, theirs), daemon=True).start()

    async def _handle(self, sock: socket.socket) -> None:
        reader, writer = await asyncio.open_connection(sock=sock)
        await self.proxy.handle(reader, writer)

    # ------------------------------------------------------------ published ports

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
            transport = self.transport
            if transport is None:
                log.info("published port %d: no connection to the guest yet", guest_port)
                conn.close()
                continue
            try:
                channel = transport.open_channel(
                    "direct-tcpip", (ssh.LOOPBACK, guest_port), (str(peer[0]), int(peer[1])), timeout=10
                )
            except (paramiko.SSHException, OSError, EOFError) as exc:
                log.info("published port %d: %s", guest_port, exc)
                conn.close()
                continue
            conn.settimeout(None)
            threading.Thread(target=_bridge, args=(channel, conn), daemon=True).start()

    # ------------------------------------------------------------ main

    async def _watch(self) -> None:
        while not self.stop.is_set():
            if not self.files.record.exists():
                self.stop.set()
            await asyncio.sleep(WATCH_INTERVAL)

    def run(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            self.loop.add_signal_handler(sig, self.stop.set)
        forwarder = threading.Thread(target=self.forward, name="forwarder", daemon=True)
        forwarder.start()
        for listener, guest_port in self.listeners:
            threading.Thread(target=self.publish, args=(listener, guest_port), daemon=True).start()
        watcher = self.loop.create_task(self._watch())
        self.loop.run_forever()
        watcher.cancel()
        egress.write_state(self.files, "down", "stopped")


def _bridge(channel: paramiko.Channel, sock: socket.socket) -> None:
    """Copy bytes between an SSH channel and the proxy's end of a socket pair, both ways, until both end."""

    def pump_in() -> None:
        with contextlib.suppress(OSError, EOFError):
            while data := channel.recv(65536):
                sock.sendall(data)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)

    t = threading.Thread(target=pump_in, daemon=True)
    t.start()
    with contextlib.suppress(OSError, EOFError):
        while data := sock.recv(65536):
            channel.sendall(data)
    with contextlib.suppress(OSError, EOFError):
        channel.shutdown_write()
    t.join(timeout=5)
    channel.close()
    sock.close()


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s egressd[%(process)d] %(levelname)s %(message)s")
    if len(argv) != 1:
        print("usage: python -m vmsandbox.egress.daemon SESSION", file=sys.stderr)
        return 2
    try:
        record = session.Record.load(argv[0])
    except VmsandboxError as exc:
        log.error("%s", exc.message)  # noqa: TRY400 - the message is the whole story
        return 1
    start = time.monotonic()
    Daemon(record).run()
    log.info("stopped after %.0f s", time.monotonic() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
