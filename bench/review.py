"""Review benchmark: a session whose guest changed 1,000 text files (a line each, plus one added file per
directory), timed from the end of the guest's command to a rendered review — at the terminal (`pull --dry-run`:
fetch, compare, scan, print the summary) and in the browser's first page (`vmsandbox ui`, GET of the session's
review: fetch, compare, scan, highlight in the jail, render 100 files) — with the page's weight (HTML, CSS, JS).

Rounds are interleaved and medians compared (these machines are noisy: read the ratio, not the seconds). Each
round changes the files again, so every review fetches a fresh change.

    sudo .venv/bin/python bench/review.py [--files 1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from vmsandbox.session.end import lifecycle
from vmsandbox.session.options import Options
from vmsandbox.session.record import Record
from vmsandbox.session.settings import Settings
from vmsandbox.session.start import create

CODE = "".join(f"def f{i}(x):\n    return x + {i}\n\n\n" for i in range(40))


def make_tree(project: Path, files: int) -> None:
    for i in range(files):
        d = project / f"pkg{i // 100:02d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"mod{i:04d}.py").write_text(CODE)


def guest(record: Record, script: str) -> None:
    argv = record.endpoint().ssh_argv("-T")
    subprocess.run([*argv, "--", script], check=True, capture_output=True, timeout=600)


def change(record: Record, project: Path, round_: int) -> None:
    guest(record, f"cd {project} && sed -i 's/return x + 7$/return x + {round_}7/' pkg*/mod*.py")


def vmsandbox(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "vmsandbox", *args], capture_output=True, check=False, timeout=900)


def exchange(url: str) -> str:
    """The page's cookie (`name=value`) for the ticket of the URL `vmsandbox ui` printed, as a browser opening it
    gets it (the URL works once)."""
    with urllib.request.urlopen(url, timeout=60) as answer:  # noqa: S310 - its own address on 127.0.0.0/8
        for header in answer.headers.get_all("Set-Cookie") or []:
            pair = header.split(";", 1)[0].strip()
            if pair.startswith("vmsandbox_ui"):  # (its name may carry the port)
                return str(pair)
    raise SystemExit(f"vmsandbox ui handed out no cookie for {url}")


def fetch(url: str, cookie: str) -> bytes:
    request = urllib.request.Request(url, headers={"Cookie": cookie})  # noqa: S310 - 127.0.0.1
    with urllib.request.urlopen(request, timeout=900) as answer:  # noqa: S310
        return bytes(answer.read())


@dataclass(frozen=True)
class Reviewed:
    """The seconds of each round's review of a change of `files` files, at the terminal and in the browser, and
    the weight of the browser's first page (bytes)."""

    files: int
    terminal: list[float]
    web: list[float]
    page: int
    css: int
    js: int


def measure(files: int, rounds: int) -> Reviewed:
    """A session on a project of `files` files, each round changing every one of them in the guest and timing its
    review at the terminal (`pull --dry-run`) and in the browser's first page; the session goes at the end."""
    work = Path(tempfile.mkdtemp(prefix="vmsandbox-bench-review-", dir="/var/tmp"))
    project = work / "project"
    make_tree(project, files)
    record = create.create(Options(project=project, name=f"bench-review-{os.getpid()}", settings=Settings(), keep=True))
    server = subprocess.Popen([sys.executable, "-m", "vmsandbox", "ui", "--no-browser"], stdout=subprocess.PIPE)
    try:
        assert server.stdout is not None
        url = server.stdout.readline().decode().strip()
        base = url.partition("/?")[0]
        cookie = exchange(url)
        terminal: list[float] = []
        web: list[float] = []
        page = b""
        for n in range(rounds):
            change(record, project, 2 * n)
            started = time.monotonic()
            shown = vmsandbox("pull", record.name, "--dry-run")
            terminal.append(time.monotonic() - started)
            assert shown.returncode == 0, shown.stderr.decode()
            change(record, project, 2 * n + 1)
            started = time.monotonic()
            page = fetch(f"{base}/s/{record.name}", cookie)
            web.append(time.monotonic() - started)
        css = fetch(f"{base}/static/ui.css", cookie)
        js = fetch(f"{base}/static/ui.js", cookie)
        return Reviewed(files, terminal, web, len(page), len(css), len(js))
    finally:
        server.terminate()
        server.wait(timeout=30)
        lifecycle.remove(Record.load(record.name))
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    r = measure(args.files, args.rounds)
    t, w = statistics.median(r.terminal), statistics.median(r.web)
    print(f"change: {args.files} files, one line each; {args.rounds} rounds, interleaved")
    print(f"terminal review (pull --dry-run): median {t:.1f} s  {[round(x, 1) for x in r.terminal]}")
    print(f"web review, first page rendered:  median {w:.1f} s  {[round(x, 1) for x in r.web]}")
    print(f"web / terminal: {w / t:.2f}x")
    print(
        f"page weight: HTML {r.page / 1024:.0f} KiB (100 files with their hunks) "
        f"+ CSS {r.css / 1024:.1f} KiB "
        f"+ JS {r.js / 1024:.1f} KiB; nothing loaded from elsewhere"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
