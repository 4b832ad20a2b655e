"""`propose_apply`: an agent's proposal put to the person (person.py lays out the form), and what they took
applied on exactly the frozen review the agent named. No `from __future__ import annotations`: the SDK reads the
tool's annotations, and its resolver's, when they are registered."""

from typing import Annotated, Any

import anyio.to_thread
import pydantic
from mcp.server.elicitation import AcceptedElicitation, ElicitationResult
from mcp.server.mcpserver import Context, Elicit, MCPServer, Resolve
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from vmsandbox.core.sandbox import model
from vmsandbox.mcp import calls, person, shown
from vmsandbox.mcp.kinds import WRITES_HOST, Session
from vmsandbox.mcp.page import Pages
from vmsandbox.mcp.tools import Tools

NO_FORM = "nothing was applied: this MCP client cannot show its person a form (it offers no elicitation)"


def register(server: MCPServer, t: Tools, pages: Pages) -> None:
    async def ask(
        session: str, review_id: str, items: list[dict[str, Any]], reason: str, ctx: Context
    ) -> Elicit[pydantic.BaseModel]:
        """The person's form, of exactly the items and hunks proposed, as the frozen review holds them."""
        review, laid, project = await anyio.to_thread.run_sync(lambda: _proposed(t, session, review_id, items))
        caps = ctx.client_capabilities
        if caps is None or caps.elicitation is None or (caps.elicitation.form is None and caps.elicitation.url):
            if await anyio.to_thread.run_sync(lambda: pages.show(session, review.id.value)):
                raise ToolError(f"{NO_FORM}: review {review.id.value} is open in the person's browser, where they "
                                "apply what they choose; get_review later shows what is left")  # fmt: skip
            raise ToolError(f"{NO_FORM}, and no browser opens here. The person reviews and applies the changes "
                            f"themselves: `vmsandbox pull {session}`")  # fmt: skip
        return Elicit(person.message(session, project, review, laid, reason), person.form(laid))

    @server.tool(annotations=WRITES_HOST)
    async def propose_apply(
        session: Session,
        review_id: Annotated[str, Field(description="as get_review returned it", pattern=r"^[A-Za-z0-9_-]{1,64}$")],
        items: Annotated[
            list[dict[str, Any]],
            Field(description='the items to apply: [{"item": "i0"}, or {"item": "i1", "hunks": ["h0"]}]'),
        ],
        answer: Annotated[ElicitationResult[pydantic.BaseModel], Resolve(ask)],
        reason: Annotated[str, Field(description="one line for the person: why these changes")] = "",
    ) -> dict[str, Any]:
        """Ask the person to apply changes of a review to the project on their machine. The person sees a form
        with each item, unticks what must not land, and confirms or declines; held items land only if they tick
        them. Returns what was applied; nothing is applied without the person."""
        if not isinstance(answer, AcceptedElicitation):
            return {"applied": [], "answer": answer.action, "note": "the person did not apply these changes"}
        review, laid, _ = await anyio.to_thread.run_sync(lambda: _proposed(t, session, review_id, items))
        choices, include = person.chosen(laid, answer.data)
        if not choices:
            return {"applied": [], "answer": "accept", "note": "the person took none of the items: nothing applied"}
        done = await anyio.to_thread.run_sync(lambda: calls.guarded(lambda: t.apply(session, review, choices, include)))
        return {
            "applied": [i.value for i in done.applied], "answer": "accept",
            "left_out": sorted({s.proposed.item.id.value for s in laid} - {c.item.value for c in choices}),
            "refused": [{"item": r.item.value, "reason": shown.line(r.reason, 500)} for r in done.refused],
            "pending": done.left,
        }  # fmt: skip


def _proposed(
    t: Tools, session: str, review_id: str, items: list[dict[str, Any]]
) -> tuple[model.Review, list[person.Shown], str | None]:
    """The frozen review an agent names (that one: never a new one), its proposal read against it and laid out as
    the person sees it, and the project it would land in."""
    review = calls.guarded(lambda: t.review(session, review_id))
    if review.id.value != review_id:
        raise ToolError(f"review {review_id!r} is not one of session {session}'s: nothing was applied")
    proposed = calls.guarded(lambda: person.proposal(review, items))
    laid = person.layout(proposed, review.steps)
    return review, laid, calls.guarded(lambda: t.backend.sandbox(review.session)).project
