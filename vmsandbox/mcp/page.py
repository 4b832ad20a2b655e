"""The browser review, for a client that cannot ask its person: an agent's proposal opens the person's browser on
exactly the frozen review it names, served by a `vmsandbox ui` of its own (one per session at a time, ended with
this server). Its one-time link goes to the browser only: the agent never sees it, so the page's apply is the
person's. Where no browser opens (no desktop session, no $BROWSER), nothing is opened."""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from vmsandbox import pids, proc

READY = 30.0  # seconds a page's server has to say it serves


class Pages:
    """The pages open, by session, all started by one thread that lives as long as they do: a child of ours ends
    when the thread that started it ends (proc.start asks the kernel so, and the kernel counts threads), and a
    server's worker threads come and go."""

    def __init__(self) -> None:
        self.open: dict[str, tuple[str, proc.Child]] = {}
        self._lock = threading.Lock()
        self._starter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pages")

    def show(self, session: str, review_id: str) -> bool:
        """The person's browser opened on review `review_id` of `session` (a page this server opened for the session
        before ended, unless it is on that very review and still served: the person may be choosing there); False
        where none could be opened."""
        with self._lock:
            shown = self.open.get(session)
            if shown is not None and shown[0] == review_id and shown[1].poll() is None:
                return True
            self._end(self.open.pop(session, (None, None))[1])
            child = self._starter.submit(_start, session, review_id).result()
            if _served(child):
                self.open[session] = (review_id, child)
                return True
            self._end(child)
            return False

    def close(self) -> None:
        with self._lock:
            for _, child in self.open.values():
                self._end(child)
            self.open.clear()
        self._starter.shutdown(wait=False)

    @staticmethod
    def _end(child: proc.Child | None) -> None:
        if child is None:
            return
        with contextlib.suppress(OSError):
            child.terminate()
        proc.reap(child, 10)


def _start(session: str, review_id: str) -> proc.Child:
    argv = proc.own_module("vmsandbox", "ui", session, "--review", review_id, "--browser-only")
    return proc.start(argv, stdout=proc.PIPE, stderr=proc.DEVNULL)


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
