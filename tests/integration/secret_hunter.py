"""Another local account looking for the review page's secret (test_web.py runs it as `nobody`): every word that
could be a secret in every process's command line and environment it can read, and in every file it can read
under the directories given, tried as a ticket and as the cookie against the page. Prints how many words it
found and the list of those that worked.

Usage: python3 secret_hunter.py BASE_URL DIR...
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import sys
import urllib.error
import urllib.request
from pathlib import Path

WORD = re.compile(rb"[A-Za-z0-9_-]{16,}")
MAX_DEPTH = 40


def words(data: bytes) -> set[str]:
    return {m.decode() for m in WORD.findall(data)}


def head_of(path: Path) -> bytes:
    """The first MiB of a regular file (b"" for anything else: a FIFO someone left would block a plain open)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        return os.read(fd, 1 << 20) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    finally:
        os.close(fd)


def gather(roots: list[str]) -> set[str]:
    found: set[str] = set()
    for pid in Path("/proc").iterdir():
        if pid.name.isdigit():
            for what in ("cmdline", "environ"):
                with contextlib.suppress(OSError):
                    found |= words((pid / what).read_bytes())
    for root in roots:
        for dirpath, dirs, files in os.walk(root):
            if dirpath.count("/") - root.count("/") >= MAX_DEPTH:
                dirs[:] = []  # (no secret is kept that deep; os.walk would recurse past its limit)
            for name in files:
                found |= words(name.encode())
                with contextlib.suppress(OSError):
                    found |= words(head_of(Path(dirpath, name)))
    return found


def works(base: str, token: str) -> bool:
    port = base.rsplit(":", 1)[1]
    cookie = {"Cookie": f"vmsandbox_ui_{port}={token}"}
    tries: tuple[tuple[str, dict[str, str]], ...] = ((f"{base}/?ticket={token}", {}), (f"{base}/", cookie))
    for url, headers in tries:
        try:
            urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10)  # noqa: S310
        except urllib.error.HTTPError:
            continue
        return True
    return False


def main() -> None:
    base, roots = sys.argv[1], sys.argv[2:]
    found = gather(roots)
    print(len(found), [t for t in sorted(found)[:5000] if works(base, t)])


if __name__ == "__main__":
    main()
