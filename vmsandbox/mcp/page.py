"""The browser review, for a client that cannot ask its person: an agent's proposal opens the person's browser on
exactly the frozen review it names, served by a `vmsandbox ui` of its own (one per session at a time, ended with
this server). Its one-time link goes to the browser only: the agent never sees it, so the page's apply is the
person's. Where no browser opens (no desktop session, no $BROWSER), nothing is opened."""

from __future__ import annotations

import contextlib
import threading
import time

from vmsandbox import pids, proc

READY = 30.0  # seconds a page's server has to say it serves


class Pages:
    def __init__(self) -> None:
        self.open: dict[str, proc.Child] = {}
        self._lock = threading.Lock()

    def show(self, session: str, review_id: str) -> bool:
        """The person's browser opened on review `review_id` of `session` (whatever page this server opened for the
        session before, ended); False where none could be opened."""
        with self._lock:
            self._end(self.open.pop(session, None))
            argv = proc.own_module("vmsandbox", "ui", session, "--review", review_id, "--browser-only")
            child = proc.start(argv, stdout=proc.PIPE, stderr=proc.DEVNULL)
            if _served(child):
                self.open[session] = child
                return True
            self._end(child)
            return False

    def close(self) -> None:
        with self._lock:
            for child in self.open.values():
                self._end(child)
            self.open.clear()

    @staticmethod
    def _end(child: proc.Child | None) -> None:
        if child is None:
            return
        with contextlib.suppress(OSError):
            child.terminate()
        proc.reap(child, 10)


def _served(child: proc.Child) -> bool:
    """Whether the page's server said it serves (its first line) before it ended or READY passed."""
    if child.stdout is None:
        return False
    deadline = time.monotonic() + READY
    said = b""
    while b"\n" not in said and pids.readable(child.stdout, max(deadline - time.monotonic(), 0.0)):
        chunk = child.stdout.read1(64)  # type: ignore[attr-defined]
        if not chunk:
            break
        said += chunk
    return said.startswith(b"served\n")
