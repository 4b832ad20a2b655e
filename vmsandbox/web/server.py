"""The page served: on an address of 127.0.0.0/8 of its own (pageguard.py says why), its URL handed to a person
once (a ticket), and a browser opened where there is a desktop, on a file only this account reads (never a
ticket on a browser's command line). Served until Ctrl-C (`vmsandbox ui`), or in a thread while a run waits for
its review (person.py). Behind the core's gate, as the API is (core/door): the person's account only, a whole
request head within its timeout, LIMIT_CONNECTIONS at once."""

from __future__ import annotations

import html
import os
import queue
import socket
import sys
import tempfile
import threading
import webbrowser
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from uvicorn.protocols.http.h11_impl import H11Protocol

from vmsandbox import ui
from vmsandbox.core import sessions
from vmsandbox.core.door import gate
from vmsandbox.errors import VmsandboxError
from vmsandbox.sudo import invoker as sudo_invoker
from vmsandbox.web import app
from vmsandbox.web.pageguard import loopback_address

if TYPE_CHECKING:
    import uvicorn

LIMIT_CONNECTIONS = 64  # connections the page holds at once (a browser opens six or so): more are answered 503


def people() -> frozenset[int]:
    """The accounts whose browser the page serves: this one, and under sudo the person who ran it (a browser
    opened from a root process may run as either)."""
    who = sudo_invoker()
    return frozenset({os.geteuid(), *([who.pw_uid] if who is not None else [])})


PEOPLE = people()


class PageGate(gate.Gate):
    """uvicorn's HTTP/1.1 protocol behind the core's gate: the person's connections only."""

    inner = H11Protocol

    def owners(self) -> frozenset[int]:
        return PEOPLE

    def refusal(self, uid: int | None) -> bytes:
        who = "an account that could not be found" if uid is None else f"uid {uid}"
        body = f"refused: a connection from {who}; this page serves only the account that opened it\n".encode()
        head = "HTTP/1.1 403 Forbidden\r\ncontent-type: text/plain; charset=utf-8\r\n"
        return f"{head}content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode() + body


OPENING = 5.0  # seconds a browser command has to fail before the page counts as opened


def path_of(name: str | None, review: str | None = None) -> str:
    """The page of a session (or the session list), at a frozen review of it when one is named."""
    where = f"/s/{quote(name, safe='')}" if name else "/"
    return f"{where}?review={review}" if review else where


def has_browser() -> bool:
    """A browser that opens where the user is: a desktop session (or $BROWSER), not an ssh login, where a
    console browser would take over the terminal."""
    if not any(os.environ.get(v) for v in ("DISPLAY", "WAYLAND_DISPLAY", "BROWSER")) and sys.platform != "darwin":
        return False
    try:
        webbrowser.get()
    except webbrowser.Error:
        return False
    return True


def launcher_file(url: str) -> Path:
    """A page that sends the browser to `url`, readable by this account only: the browser is opened on it, so
    the ticket is never on a command line (which every local account reads in /proc)."""
    where = sessions.private_dir("ui")
    fd, name = tempfile.mkstemp(prefix="open-", suffix=".html", dir=where)
    with os.fdopen(fd, "w") as f:  # mkstemp: 0600, made by this account only
        f.write(f'<!doctype html><meta http-equiv="refresh" content="0;url={html.escape(url)}">\n')
    return Path(name)


class Server:
    """The page, bound (the socket listens before any URL is given out) but not yet served. `handoff` takes the
    apply of the review a run waits for (person.Page)."""

    def __init__(self, *, port: int = 0, handoff: Any = None) -> None:
        address = loopback_address()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((address, port))
        except OSError as exc:
            self._sock.close()
            raise VmsandboxError(
                f"cannot listen on {address}:{port}: {exc.strerror}",
                hint="choose another port with --port, or leave it out for a free one",
            ) from None
        self._sock.listen(128)  # before a URL is printed: a browser that is quick must queue, not be refused
        self._launchers: dict[str, Path] = {}
        self.guard = app.make(
            address=address, port=self._sock.getsockname()[1], handoff=handoff, on_exchange=self._used
        )
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def opened(self, path: str) -> bool:
        """A browser opened on `path`, and nothing printed (`vmsandbox mcp`'s: its agent must never see the link):
        whether the browser took it (where it did not, its launcher is gone)."""
        if not has_browser():
            return False
        url = self.guard.url(path)
        launcher = launcher_file(url)
        self._launchers[url.rpartition("ticket=")[2]] = launcher
        answer: queue.Queue[bool] = queue.Queue(maxsize=1)

        def open_it() -> None:
            try:
                answer.put(webbrowser.open(launcher.as_uri()))
            except webbrowser.Error:
                answer.put(False)

        # (a browser command may wait until the browser is closed: one still running after OPENING took the page)
        threading.Thread(target=open_it, daemon=True).start()
        try:
            taken = answer.get(timeout=OPENING)
        except queue.Empty:
            taken = True
        if not taken:
            self._launchers.pop(url.rpartition("ticket=")[2], None)
            launcher.unlink(missing_ok=True)
        return taken

    def give(self, path: str, *, browser: bool) -> None:
        """The URL of `path` to the person (stdout: the command's data; it works once), and a browser opened on it
        where there is one."""
        print(self.guard.url(path), flush=True)
        if browser and has_browser():
            url = self.guard.url(path)
            launcher = launcher_file(url)
            self._launchers[url.rpartition("ticket=")[2]] = launcher
            # in a thread of its own: a browser command may wait until the browser is closed (a console browser,
            # $BROWSER=firefox started fresh), and the page must be served meanwhile
            threading.Thread(target=webbrowser.open, args=(launcher.as_uri(),), daemon=True).start()

    def _used(self, ticket: str) -> None:
        gone = self._launchers.pop(ticket, None)
        if gone is not None:
            gone.unlink(missing_ok=True)

    def _made(self) -> uvicorn.Server:
        import uvicorn

        config = uvicorn.Config(
            self.guard,
            http=PageGate,
            log_level="warning",
            access_log=False,
            log_config=None,
            limit_concurrency=LIMIT_CONNECTIONS,
            backlog=gate.room(LIMIT_CONNECTIONS),
        )
        # (log_config=None: its errors go to our log (stderr, -v), not to a configuration of its own)
        self._server = uvicorn.Server(config)
        return self._server

    def run(self) -> None:
        """Serve until Ctrl-C (or stop())."""
        try:
            self._made().run(sockets=[self._sock])
        finally:
            self._tidy()

    def start(self) -> None:
        """Serve in a thread of its own."""
        server = self._made()
        self._thread = threading.Thread(target=server.run, kwargs={"sockets": [self._sock]}, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop serving (the answer in flight is finished first)."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._tidy()

    def _tidy(self) -> None:
        for launcher in self._launchers.values():
            launcher.unlink(missing_ok=True)
        self._launchers.clear()
        self._sock.close()


def serve(
    name: str | None, *, port: int = 0, browser: bool = True, review: str | None = None, browser_only: bool = False
) -> None:
    """`vmsandbox ui`: the page until Ctrl-C (or SIGTERM), at a frozen `review` of session `name` when one is named.
    `browser_only` (`vmsandbox mcp`'s, whose agent must never see the link): refused where no browser opens, and
    the link goes to the browser only."""
    if name is not None:
        from vmsandbox.core import reviews

        reviews.exists(name)  # a session that does not exist is said now, with its hint, not on the page
        if review is not None:
            reviews.reviewed(name, review)  # (one that is not, or was spent, too)
    server = Server(port=port)
    if browser_only:
        if not server.opened(path_of(name, review)):
            raise VmsandboxError("no browser opens on this machine (no desktop session, or $BROWSER failed)",
                                 hint=f"review at the terminal: `vmsandbox pull {name or 'NAME'}`")  # fmt: skip
        print("served", flush=True)  # (the link went to the browser only)
    else:
        server.give(path_of(name, review), browser=browser)
    ui.info("The review is served at the URL above (only on this machine; the link works once); Ctrl-C stops it.")
    server.run()
