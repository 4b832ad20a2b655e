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
