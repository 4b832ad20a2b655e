"""The guest's connections to its door (its 127.0.0.1:3128; an SSH channel each, here): each carried to the proxy
through a socket pair and the door pump, or refused at once, never waiting on the guest: a 503 in what the
channel's window takes, the channel closed, and a line in the proxy log (the door full, or no descriptor left
for one more)."""

from __future__ import annotations

import asyncio
import socket

from vmsandbox.egress.door.pump import Pump
from vmsandbox.egress.relay.proxy import Proxy
from vmsandbox.egress.rules import httphead
from vmsandbox.egress.rules.limits import Limits
from vmsandbox.guest import channel


class Doorway:
    def __init__(self, proxy: Proxy, loop: asyncio.AbstractEventLoop, limits: Limits) -> None:
        self.proxy, self.loop, self.limits = proxy, loop, limits
        self.pump: Pump | None = None  # made when the daemon runs (its thread after the handover, not before)

    def open(self) -> Pump:
        lim = self.limits
        self.pump = Pump("door", lim.connections, send_timeout=lim.send_timeout, idle_timeout=lim.idle_timeout)
        return self.pump

    def serve(self, ch: channel.Channel) -> None:
        """A guest connection: carried to the proxy, or refused at once."""
        pump = self.pump
        full = f"too many connections (limit {self.limits.connections})"
        if pump is None or pump.count >= pump.capacity:
            self._refuse(ch, full)
            return
        try:
            ours, theirs = socket.socketpair()
        except OSError as exc:  # out of descriptors (limits.py's ceiling): this one is refused, the door stays
            self._refuse(ch, f"cannot take the connection: {exc.strerror or exc}")
            return
        if not pump.add(ch, theirs):
            ours.close()
            theirs.close()
            self._refuse(ch, full)
            return
        asyncio.run_coroutine_threadsafe(self._handle(ours), self.loop)

    def _refuse(self, ch: channel.Channel, reason: str) -> None:
        ch.refuse(httphead.render_response(503, "Service Unavailable", f"vmsandbox egress proxy: {reason}\n"))
        self.proxy.refused(reason)

    async def _handle(self, sock: socket.socket) -> None:
        try:
            reader, writer = await asyncio.open_connection(sock=sock)
        except OSError:
            sock.close()  # its pair ends with it: the guest sees its connection closed
            return
        await self.proxy.handle(reader, writer)
