"""No local account slows or takes a front end (issue 57): another account holds a large socket table and floods
`vmsandbox serve` and `vmsandbox ui` with connections, round after round, while the person uses both. The
person's requests are answered (200, never a 503) and the page's one-time URL still opens it; how long they took
is printed (`-s`) for the record, never asserted. Boots no VM; needs root to make the two accounts."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import queue
import secrets
import signal
import statistics
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = [pytest.mark.no_vm, pytest.mark.root("it makes two accounts")]

HERE = Path(__file__).parent
PAIRS = 5000  # loopback pairs the other account holds: 10,000 rows of the socket table
CROWD = 3000  # connections per round to each front end (the count in issue 57)
ASKED = 8  # the person's requests to each front end under the flood
WAIT = 120.0  # the longest a process is waited for to say it is ready


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    home: Path

    def argv(self, *args: str) -> list[str]:
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(self.home), "LANG": "C.UTF-8"}
        if "VMSANDBOX_DATA_DIR" in os.environ:
            env["VMSANDBOX_DATA_DIR"] = os.environ["VMSANDBOX_DATA_DIR"]
        return ["runuser", "-u", self.name, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()), *args]


@contextlib.contextmanager
def account() -> Iterator[Account]:
    name = f"vmsbx{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", name], check=True)
    found = pwd.getpwnam(name)
    try:
        yield Account(name, found.pw_uid, Path(found.pw_dir))
    finally:  # (its processes are the test's, each ended by its id first)
        subprocess.run(["userdel", "--remove", name], check=False, capture_output=True)


class Started:
    """A process this test started (in a session of its own, ended by its id), its stdout read line by line."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        self.rest: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put("")  # (the end)

    def line_with(self, text: str) -> str:
        """The first line of stdout holding `text`, waited for up to WAIT seconds."""
        return self.lines_with(text)[text]

    def lines_with(self, *texts: str) -> dict[str, str]:
        """For each text, the first line of stdout holding it, each waited for up to WAIT seconds."""
        found: dict[str, str] = {}
        with contextlib.suppress(queue.Empty):
            while len(found) < len(texts) and (line := self.lines.get(timeout=WAIT)):
                found |= {t: line.strip() for t in texts if t in line and t not in found}
        if len(found) == len(texts):
            return found
        self.end()
        said = self.proc.stderr.read() if self.proc.stderr else ""
        raise AssertionError(f"no {texts!r} from {self.proc.args!r}: {said}")

    def finish(self) -> str:
        """Close its stdin (what tells the crowd to stop); what it printed after, once it ended."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(WAIT)
        out = []
        while line := self.lines.get(timeout=WAIT):
            out.append(line)
        return "".join(out)

    def end(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)


def _asked(person: Account, *args: str) -> list[tuple[int, float]]:
    done = subprocess.run(person.argv(sys.executable, str(HERE / "asker.py"), *args), capture_output=True, text=True,
                          timeout=1200, check=True)  # fmt: skip
    return [(int(s), float(t)) for s, t in json.loads(done.stdout)]


def _figures(label: str, found: list[tuple[int, float]]) -> str:
    times = [t for _, t in found]
    return f"{label}: {len(found)} answered, median {statistics.median(times):.3f} s, longest {max(times):.3f} s"


def test_another_accounts_crowd_takes_neither_the_api_nor_the_page() -> None:
    started: list[Started] = []
    with account() as person, account() as other:
        try:
            serve = Started(person.argv(sys.executable, "-m", "vmsandbox", "serve", "--port", "0"))
            started.append(serve)
            said = serve.lines_with("E2B_API_KEY=", "E2B_API_URL=")
            key, url = (said[f"{n}="].split(f"{n}=", 1)[1].strip("'\"") for n in ("E2B_API_KEY", "E2B_API_URL"))
            page = Started(person.argv(sys.executable, "-m", "vmsandbox", "ui", "--no-browser"))
            started.append(page)
            ticket_url = page.line_with("ticket=")
            quiet = _asked(person, "api", url, key, str(ASKED))

            table = Started(other.argv(sys.executable, str(HERE / "crowd.py"), "table", str(PAIRS)))
            started.append(table)
            table.line_with("ready")
            rows = sum(len(Path(t).read_text().splitlines()) - 1 for t in ("/proc/net/tcp", "/proc/net/tcp6")
                       if Path(t).exists())  # fmt: skip
            ports = [url.split("/")[2], ticket_url.split("/")[2]]  # (127.0.0.1:PORT, the page's 127.a.b.c:PORT)
            crowd = Started(other.argv(sys.executable, str(HERE / "crowd.py"), "flood", str(CROWD), *ports))
            started.append(crowd)
            crowd.line_with("ready")

            loaded = _asked(person, "api", url, key, str(ASKED))
            opened = _asked(person, "page", ticket_url, str(ASKED))
            seen = json.loads(crowd.finish().strip().splitlines()[-1])
        finally:
            for proc in reversed(started):
                proc.end()
    print(f"\nsocket table: {rows} rows; the other account's rounds: {len(seen['rounds'])} in {seen['seconds']:.1f} s, "
          f"first {seen['rounds'][0]}")  # fmt: skip
    print(_figures("API, no crowd", quiet))
    print(_figures("API under the crowd", loaded))
    print(_figures("page under the crowd", opened))
    assert [s for s, _ in quiet] == [200] * ASKED
    assert [s for s, _ in loaded] == [200] * ASKED  # answered, never a 503: the crowd held none of serve's slots
    assert opened[0][0] == 200  # the one-time URL opened the page: nothing of the crowd's spent its ticket
    assert [s for s, _ in opened[1:]] == [200] * ASKED  # and the cookie it gave is the page's
    assert rows >= 2 * PAIRS and all(r["made"] > 0 for r in seen["rounds"][0].values())
