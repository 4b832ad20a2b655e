"""One answer for a session's logs: the page's live view (web/logs.py) reads the console and the egress log as the
terminal's `logs` and `policy log` do (core.listing): the rotated part of a log first, a line still being written
not yet."""

from __future__ import annotations

import json

from tests.unit.conftest import saved_record
from vmsandbox import ui
from vmsandbox.core import listing
from vmsandbox.egress import proxylog
from vmsandbox.web import logs


def _line(ts: int, decision: str, host: str) -> str:
    return json.dumps({"ts": ts, "decision": decision, "method": "CONNECT", "host": host, "port": 443}) + "\n"


def test_the_page_reads_a_sessions_logs_as_the_terminal_does() -> None:
    record = saved_record("s1")
    record.files.proxy_log.write_text(_line(2, "deny", "b.example") + '{"ts": 3, "decis')  # (half written)
    proxylog.rotated(record.files.proxy_log).write_text(_line(1, "allow", "a.example"))
    record.files.console_log.write_text("Booting\r\n\x1b[1mlogin:\x1b[0m\r\nhalf a li")

    events = logs.tail("s1", "proxy")["events"]
    assert [e["target"] for e in events] == ["a.example:443", "b.example:443"]  # rotated part first, no half line
    terminal = [event for _, event in listing.proxy("s1", follow=False, tail=logs.TAIL, since=None)]
    assert events == [logs._fields(e) for e in terminal]

    lines = logs.tail("s1", "console")["lines"]
    assert lines == [ui.visible(x.rstrip("\r")) for x in listing.console("s1", follow=False, tail=logs.TAIL)]
    assert lines == ["Booting", "\\x1b[1mlogin:\\x1b[0m"]  # the guest's bytes escaped; the line being written waits


def test_the_page_reads_a_bounded_end_of_what_the_guest_wrote() -> None:
    """A guest may write a console line of megabytes, or millions of short ones: each poll of the page reads no more
    than the end of each log (a line cut by that window is not shown), while the terminal's tail reads them whole."""
    record = saved_record("s2")
    huge = b"x" * (4 << 20)
    record.files.console_log.write_bytes(b"first\n" + huge + b"\n" + b"after\n" * 10)
    lines = logs.tail("s2", "console")["lines"]
    assert lines == ["after"] * 10  # the 4 MiB line began before the window: not shown
    assert sum(len(x) for x in lines) < logs.CONSOLE_BYTES
    assert "x" * 100 in list(listing.console("s2", follow=False, tail=logs.TAIL))[1]  # the terminal's: whole
    record.files.console_log.write_bytes(b"short\n" * (1 << 20))  # 6 MiB of lines
    assert logs.tail("s2", "console")["lines"] == ["short"] * logs.TAIL

    events = "".join(_line(n, "allow", f"h{n}.example") for n in range(20_000))
    record.files.proxy_log.write_text(events)
    proxylog.rotated(record.files.proxy_log).write_text(_line(0, "deny", "old.example") * 50_000)
    shown = logs.tail("s2", "proxy")["events"]
    assert [e["target"] for e in shown] == [f"h{n}.example:443" for n in range(19_800, 20_000)]
