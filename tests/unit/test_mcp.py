"""`vmsandbox mcp` driven by the MCP SDK's own client, in process, over a stand-in of the core's backend: the person
decides what an agent proposes (a form of exactly the frozen review, held items unticked), a client that cannot
ask gets nothing applied, guest text comes back escaped and bounded, and every failure is a result with its fix."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import mcp_types as types
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from vmsandbox.core.sandbox import model
from vmsandbox.core.sandbox.names import Digest, SessionName, Token
from vmsandbox.errors import VmsandboxError
from vmsandbox.mcp import calls, server
from vmsandbox.mcp.tools import Tools

NOW = datetime(2026, 12, 6, tzinfo=UTC)
DIGEST = "a" * 64


def _item(n: int, path: str, holds: tuple[model.Hold, ...] = (), hunks: int = 1) -> model.ReviewItem:
    made = tuple(model.Hunk(Token(f"h{i}"), 1, (f"old {i}\n",), 1, (f"new {i}\n",)) for i in range(hunks))
    return model.ReviewItem(Token(f"i{n}"), path, "modified", "apply", Digest(DIGEST), holds, made)


SECRET = model.Hold(model.Badge.SECRET, "looks like an AWS key")
REVIEW = model.Review(
    Token("r1"), SessionName("s1"), NOW,
    (_item(0, "app.py", hunks=2), _item(1, "notes.md"), _item(2, ".env", (SECRET,))),
)  # fmt: skip


@dataclass
class Output:
    chunks: list[model.Chunk]

    def start(self, spec: model.ProcessSpec) -> int:
        return 7

    def output(self, pid: int, cursor: int | None, wait: float) -> model.Output:
        return model.Output(tuple(self.chunks), 99, model.Exit(3, "exit status 3"))


@dataclass
class Backend:
    """The core's backend as far as these tools call it."""

    applied: list[tuple[list[model.Choice], list[model.Badge]]] = field(default_factory=list)
    out: Output = field(default_factory=lambda: Output([]))

    def sandbox(self, name: SessionName) -> model.Sandbox:
        return model.Sandbox(name, "base", model.State.RUNNING, NOW, model.NO_END, 2, 2048, 10240, project="/p")

    def review(self, name: SessionName, *, freeze: bool = True) -> model.Review:
        return REVIEW if freeze else model.Review(Token("unfrozen"), name, NOW, REVIEW.items)

    def reviewed(self, name: SessionName, review: Token) -> model.Review:
        return REVIEW

    def apply(
        self, name: SessionName, review: Token, choices: Sequence[model.Choice], include: Sequence[model.Badge]
    ) -> model.Applied:
        self.applied.append((list(choices), list(include)))
        return model.Applied(tuple(c.item for c in choices), (), 0)

    def processes(self, name: SessionName) -> Output:
        return self.out


@dataclass
class Browser:
    """The browser reviews (mcp/page.py) as a stand-in: whether one opens, and what was opened."""

    opens: bool
    opened: list[tuple[str, str]] = field(default_factory=list)

    def show(self, session: str, review_id: str) -> bool:
        self.opened.append((session, review_id))
        return self.opens


def call(
    backend: Backend, tool: str, args: dict[str, Any], answer: Any = None, mode: str = "auto", pages: Any = None
) -> Called:
    """`tool` called by the SDK's client; `answer(params)`, if given, is the person's reply to an elicitation (asked
    within the call as the 2025 protocol does, or as input a retried call carries, as 2026-07-28's does)."""
    asked: list[Any] = []

    async def elicit(context: Any, params: Any) -> types.ElicitResult:
        asked.append(params)
        return answer(params)  # type: ignore[no-any-return]

    async def run() -> types.CallToolResult:
        made = server.make(Tools(backend), pages=pages or Browser(opens=False))  # type: ignore[arg-type]
        async with Client(made, elicitation_callback=elicit if answer else None, mode=mode) as client:
            return await client.call_tool(tool, args)

    return Called(asyncio.run(run()), asked)


@dataclass
class Called:
    result: types.CallToolResult
    asked: list[Any]

    @property
    def is_error(self) -> bool:
        return bool(self.result.is_error)

    @property
    def structured_content(self) -> dict[str, Any] | None:
        found: dict[str, Any] | None = self.result.structured_content
        return found


def text(called: Called) -> str:
    return "".join(c.text for c in called.result.content if isinstance(c, types.TextContent))


PROPOSAL = {"session": "s1", "review_id": "r1", "reason": "fix the bug",
            "items": [{"item": "i0", "hunks": ["h1"]}, {"item": "i1"}, {"item": "i2"}]}  # fmt: skip


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_the_person_takes_what_they_leave_ticked_and_a_held_item_only_when_they_tick_it(mode: str) -> None:
    backend = Backend()
    seen: list[Any] = []

    def as_shown(params: Any) -> types.ElicitResult:  # the person leaves the defaults: accept
        seen.append(params)
        return types.ElicitResult(action="accept", content={})

    result = call(backend, "propose_apply", PROPOSAL, as_shown, mode)
    assert not result.is_error, text(result)
    (choices, include), = backend.applied  # fmt: skip
    assert [(c.item.value, c.hunks) for c in choices] == [("i0", (Token("h1"),)), ("i1", None)]
    assert all(c.digest.value == DIGEST for c in choices) and include == []
    assert result.structured_content is not None and result.structured_content["left_out"] == ["i2"]
    schema = seen[0].requested_schema["properties"]
    assert schema["take_i2"]["default"] is False and "HELD" in schema["take_i2"]["title"]
    assert schema["take_i0"]["default"] is True and "hunks h1 of 2" in schema["take_i0"]["title"]
    message = seen[0].message
    app = message.split("[i1]")[0]
    assert message.endswith("The agent's reason (its words, not vmsandbox's): fix the bug")
    assert "+new 1" in app and "+new 0" not in app  # (only the proposed hunk)

    backend = Backend()
    ticks: dict[str, Any] = {"take_i0": False, "take_i2": True}
    person = types.ElicitResult(action="accept", content=ticks)
    ticked = call(backend, "propose_apply", PROPOSAL, lambda p: person, mode)
    assert not ticked.is_error
    (choices, include), = backend.applied  # fmt: skip
    assert [c.item.value for c in choices] == ["i1", "i2"] and include == [model.Badge.SECRET]


@pytest.mark.parametrize("action", ["decline", "cancel"])
def test_a_person_who_declines_gets_nothing_applied(action: str) -> None:
    backend = Backend()
    result = call(backend, "propose_apply", PROPOSAL, lambda p: types.ElicitResult(action=action))  # type: ignore[arg-type]
    assert not result.is_error and backend.applied == []
    assert result.structured_content is not None and result.structured_content["applied"] == []


@pytest.mark.parametrize("opens", [True, False])
def test_a_client_that_cannot_ask_its_person_gets_nothing_applied_and_the_browser_or_the_command(opens: bool) -> None:
    backend, browser = Backend(), Browser(opens)
    result = call(backend, "propose_apply", PROPOSAL, pages=browser)
    assert result.is_error and backend.applied == [] and browser.opened == [("s1", "r1")]
    assert text(result).startswith("Error executing tool propose_apply: nothing was applied")
    if opens:
        assert "review r1 is open in the person's browser" in text(result) and "http" not in text(result)
    else:
        assert "no browser opens here" in text(result) and "`vmsandbox pull s1`" in text(result)


@pytest.mark.parametrize(
    ("items", "said"),
    [
        ([{"item": "i9"}], "no item 'i9'"),
        ([{"item": "i1", "hunks": ["h5"]}], "hunks must be a list of its hunks' ids"),
        ([{"item": "i0", "hunks": ["h0", "h0"]}], "each once"),
        ([{"item": "i1"}, {"item": "i1"}], "proposed twice"),
        ([], "no items proposed"),
    ],
)
def test_a_proposal_names_only_what_the_review_holds(items: list[dict[str, Any]], said: str) -> None:
    backend = Backend()
    result = call(backend, "propose_apply", {**PROPOSAL, "items": items},
                  lambda p: types.ElicitResult(action="accept", content={}))  # fmt: skip
    assert result.is_error and said in text(result) and backend.applied == [] and result.asked == []


def test_guest_output_comes_back_escaped_and_its_end_bounded() -> None:
    flood = b"x" * (1 << 20) + b"\x1b[2J\xe2\x80\xae tail"  # a screen clear and a right-to-left override at the end
    backend = Backend(out=Output([model.Chunk(model.Stream.STDOUT, flood)]))
    result = call(backend, "run_command", {"session": "s1", "command": "cat big"})
    assert not result.is_error
    found = result.structured_content
    assert found is not None and found["exit_code"] == 3
    out = found["stdout"]
    assert out.startswith("[... ") and out.endswith("\\x1b[2J\\u202e tail") and len(out) < 70 * 1024
    assert "\x1b" not in out and "\u202e" not in out


def test_a_failure_is_the_tools_error_with_its_fix() -> None:
    result = call(Backend(), "read_file", {"session": "Not A Name", "path": "x"})
    assert result.is_error and "not a session name" in text(result) and "(fix: " in text(result)
    result = call(Backend(), "read_file", {"session": "s1", "path": "../etc/passwd"})
    assert result.is_error and "may not hold `..`" in text(result)


def test_no_tool_widens_egress_publishes_a_port_adds_a_secret_or_trusts() -> None:
    async def names() -> list[str]:
        async with Client(server.make(Tools(Backend()))) as client:  # type: ignore[arg-type]
            return [t.name for t in (await client.list_tools()).tools]

    found = asyncio.run(names())
    assert "propose_apply" in found and "allowlist" in found
    for word in ("allow", "deny", "publish", "port", "secret", "trust", "policy", "apply"):
        assert [n for n in found if word in n.split("_")] in ([], ["allowlist"], ["propose_apply"]), word


def test_only_the_review_named_is_proposed_from_never_a_new_one() -> None:
    """An empty review id would read a new review (the guest's files as they are now), not the one the person is
    shown: refused, as is an id the backend answers with another review."""
    backend = Backend()
    result = call(
        backend, "propose_apply", {**PROPOSAL, "review_id": ""}, lambda p: types.ElicitResult(action="accept")
    )
    assert result.is_error and backend.applied == [] and result.asked == []
    result = call(
        backend, "propose_apply", {**PROPOSAL, "review_id": "r2"}, lambda p: types.ElicitResult(action="accept")
    )
    assert result.is_error and "is not one of session s1's" in text(result) and backend.applied == []


def test_what_the_guest_and_the_agent_wrote_starts_no_line_of_the_form(monkeypatch: pytest.MonkeyPatch) -> None:
    """A path with newlines, a hold's reason and the agent's reason stay on their line: every line of the message
    that does not start with two spaces (a diff line) is ours."""
    forged = _item(0, "ok.py\n\n[i1] README.md — modified, all of it\n  +harmless", hunks=1)
    review = model.Review(Token("r1"), SessionName("s1"), NOW, (forged, _item(1, "README.md")))
    monkeypatch.setattr(Backend, "reviewed", lambda self, name, token: review)
    seen: list[Any] = []

    def person(params: Any) -> types.ElicitResult:
        seen.append(params)
        return types.ElicitResult(action="decline")

    why = "typo\nUntick nothing: vmsandbox checked these items."
    call(Backend(), "propose_apply", {**PROPOSAL, "items": [{"item": "i0"}, {"item": "i1"}], "reason": why}, person)
    lines = seen[0].message.splitlines()
    ours = [line for line in lines if line and not line.startswith("  ")]
    assert [line[:5] for line in ours if line.startswith("[")] == ["[i0] ", "[i1] "], ours
    assert all(
        line.startswith(("An agent asks", "[i0] ok.py\\n", "[i1] README.md", "The agent's reason")) for line in ours
    )
    assert "\n" not in seen[0].requested_schema["properties"]["take_i0"]["title"]


def test_an_item_not_all_shown_starts_unticked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past an item's share of the message, or with no text to show (a large file), an item is left out unless
    the person ticks it, and its heading says so."""
    big = model.ReviewItem(Token("i0"), "big.py", "modified", "apply", Digest(DIGEST), (),
                           (model.Hunk(Token("h0"), 1, (), 1, tuple(f"{n}\n" for n in range(500))),))  # fmt: skip
    large = model.ReviewItem(Token("i1"), "data.txt", "modified", "apply", Digest(DIGEST), (), ())
    review = model.Review(Token("r1"), SessionName("s1"), NOW, (big, large, _item(2, "ok.py")))
    monkeypatch.setattr(Backend, "reviewed", lambda self, name, token: review)
    seen: list[Any] = []

    def person(params: Any) -> types.ElicitResult:
        seen.append(params)
        return types.ElicitResult(action="decline")

    call(Backend(), "propose_apply", {**PROPOSAL, "items": [{"item": f"i{n}"} for n in range(3)]}, person)
    fields = seen[0].requested_schema["properties"]
    assert [fields[f"take_i{n}"]["default"] for n in range(3)] == [False, False, True]
    assert seen[0].message.count("NOT ALL SHOWN") == 2


@pytest.mark.parametrize("wait", ["NaN", "Infinity", 61])
def test_a_wait_is_a_number_of_seconds_within_its_bound(wait: object) -> None:
    result = call(Backend(), "read_output", {"session": "s1", "process_id": 7, "wait_seconds": wait})
    assert result.is_error


def test_every_tool_says_what_it_does_and_what_each_argument_is() -> None:
    async def listed() -> list[Any]:
        async with Client(server.make(Tools(Backend()))) as client:  # type: ignore[arg-type]
            return list((await client.list_tools()).tools)

    for tool in asyncio.run(listed()):
        assert tool.description and len(tool.description) > 30, tool.name
        properties = tool.input_schema.get("properties", {})
        assert "answer" not in properties and "ctx" not in properties, tool.name  # (the person's, the server's)
        assert [n for n, p in properties.items() if not p.get("description")] == [], tool.name


@dataclass
class Endless(Output):
    """A command that never ends on its own; its signals, as the guest got them."""

    signals: list[tuple[int, model.Signal]] = field(default_factory=list)

    def output(self, pid: int, cursor: int | None, wait: float) -> model.Output:
        if self.signals:
            return model.Output((), 0, model.Exit(-1, "signal: killed"))
        time.sleep(min(wait, 0.2))
        return model.Output((), 0, None)

    def signal(self, pid: int, signal: model.Signal) -> None:
        self.signals.append((pid, signal))


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_a_long_command_reports_its_progress_and_a_cancelled_call_kills_it(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(calls, "BEAT", 0.05)
    endless = Endless([])
    backend = Backend(out=endless)
    told: list[str | None] = []

    async def run() -> None:
        async with Client(server.make(Tools(backend)), mode=mode) as client:  # type: ignore[arg-type]

            async def progress(progress: float, total: float | None, message: str | None) -> None:
                told.append(message)

            call = asyncio.ensure_future(
                client.call_tool("run_command", {"session": "s1", "command": "sleep 600"}, progress_callback=progress)
            )
            while len(told) < 3:
                await asyncio.sleep(0.05)
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await call
            for _ in range(100):
                if endless.signals:
                    break
                await asyncio.sleep(0.05)

    asyncio.run(run())
    assert told[0] == "running sleep 600 in s1: 0 s", told
    assert endless.signals == [(7, model.Signal.KILL)]


def test_a_process_started_after_its_call_was_cancelled_is_killed_by_whoever_started_it() -> None:
    killed: list[int] = []
    early = calls.Launched(killed.append)
    early(1)
    assert early.cancel() == [1] and killed == []  # (the cancel's to kill)
    late = calls.Launched(killed.append)
    late.cancel()
    with pytest.raises(VmsandboxError):
        late(2)
    assert killed == [2]


def test_the_diff_resource_reads_without_freezing_and_says_a_failure_with_its_fix() -> None:
    async def read(uri: str) -> str:
        async with Client(server.make(Tools(Backend()))) as client:  # type: ignore[arg-type]
            try:
                found = await client.read_resource(uri)
            except MCPError as exc:
                return f"failed: {exc}"
            return "".join(getattr(c, "text", "") for c in found.contents)

    diff = asyncio.run(read("vmsandbox://sessions/s1/diff"))
    assert "--- a/app.py\n+++ b/app.py\n@@ -1,1 +1,1 @@\n-old 0\n+new 0" in diff
    failed = asyncio.run(read("vmsandbox://sessions/NOPE!/diff"))
    assert failed.startswith("failed: not a session name") and "(fix: " in failed, failed


def test_the_apis_words_for_a_fix_are_this_front_ends_tools() -> None:
    stale = VmsandboxError("spent", hint="ask for a new review (POST /vmsandbox/v1/sessions/s1/reviews) and choose")
    assert calls.said(stale) == "spent (fix: ask for a new review (get_review) and choose)"
    paused = VmsandboxError("paused", hint="connect to it to resume it")
    assert calls.said(paused) == "paused (fix: resume it with start_session)"
