"""A child's output is capped, and its lines reach `on_line` as they come (a build's progress)."""

from __future__ import annotations

import io

from vmsandbox import proc


def test_lines_arrive_whole_across_chunks_and_the_kept_output_is_capped() -> None:
    seen: list[str] = []
    sink = proc._Sink(10, seen.append)
    stream = io.BufferedReader(io.BytesIO(b"I: Retrieving libc6\r\nI: Validating\nI: par"))
    sink.drain(stream)
    assert seen == ["I: Retrieving libc6", "I: Validating"]
    assert sink.value() == b"I: Retriev" + proc.TRUNCATED.encode()
    quiet = proc._Sink(100, None)
    quiet.drain(io.BufferedReader(io.BytesIO(b"a\nb\n")))
    assert quiet.value() == b"a\nb\n"


def test_a_failed_commands_error_shows_the_end_of_its_stderr_bounded() -> None:
    said = "x" * 500_000 + "\nthe last line\n"  # one line of 500 kB (a guest's, a registry's), then the error
    error = proc.CommandError(proc.Result(("curl", "-fsS", "u"), 18, "", said))
    assert error.message.endswith("the last line") and len(error.message) < proc.TAIL_CHARS + 200
