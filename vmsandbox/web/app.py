"""The web review's routes: the sessions, one session's review (and applying it), its logs live, its runtime
egress actions, and a fan-out side by side (compare.py). Every page is rendered by an autoescaping template."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from vmsandbox import ui
from vmsandbox.core.views import Decisions, Plan, RefView
from vmsandbox.errors import VmsandboxError
from vmsandbox.web import compare, logs, review, timeline
from vmsandbox.web.pageguard import Guard


def shown(value: Any) -> Any:
    """Every value a page prints: guest text as its characters are (ui.visible: nothing that hides, reorders or
    restyles what surrounds it), then escaped by the template. Markup is made here of text already shown so."""
    return value if isinstance(value, Markup) or not isinstance(value, str) else ui.visible(value)


TEMPLATES = Environment(
    loader=PackageLoader("vmsandbox.web"), autoescape=select_autoescape(default=True), finalize=shown
)
STATIC = Path(__file__).parent / "static"


def page(template: str, status: int = 200, **values: Any) -> HTMLResponse:
    return HTMLResponse(TEMPLATES.get_template(template).render(**values), status_code=status)


def failed(exc: VmsandboxError) -> HTMLResponse:
    return page("error.html", 409, message=exc.message, hint=exc.hint)


def sessions(request: Request) -> Response:
    from vmsandbox.core import sessions

    rows = sessions.listing()
    return page("sessions.html", rows=rows, groups=compare.groups(rows))


def number(text: str | None, *, most: int = 10**6) -> int | None:
    """A small decimal number a page sent (ASCII digits only: `isdigit()` takes superscripts `int()` refuses)."""
    return int(text) if text is not None and re.fullmatch(r"[0-9]{1,7}", text) and int(text) <= most else None


def show_review(request: Request) -> Response:
    """One session's review: made now (fetched from the guest, then frozen), or, with `review=`, a page of the
    frozen review the person is reading (nothing fetched)."""
    from vmsandbox.core import reviews

    name = request.path_params["name"]
    page_number = number(request.query_params.get("page")) or 0

    def shown(plan: Plan) -> tuple[Plan, list[review.FileView], list[RefView], str | None]:
        return (plan, review.files(plan, page_number), *review.commits(plan))

    review_id = request.query_params.get("review")
    handoff = request.app.state.handoff
    waiting = handoff.takes(name, review_id) if handoff is not None and review_id else None
    try:
        record = reviews.record(name)
        if waiting is not None:  # the run that waits for this page holds the session's lock: its review, as is
            plan, files, refs, refs_refused = shown(waiting)
        else:
            plan, files, refs, refs_refused = reviews.look(name, shown, review_id=review_id)
    except VmsandboxError as exc:
        return failed(exc)
    pages = max(1, -(-len(plan.todo) // review.PAGE_ITEMS))
    return page(
        "review.html", name=name, record=record, plan=plan, files=files, counts=review.counts(plan),
        page=page_number, pages=pages, refused=plan.refused, refs=refs, refs_refused=refs_refused,
        groups=review.shelves(plan, files), steps=timeline.steps(plan, review.named(files)),
        made_notes=timeline.notes(plan),
    )  # fmt: skip


async def apply_review(request: Request) -> Response:
    form = await request.form()
    fields: dict[str, list[str]] = {}
    for key, value in form.multi_items():
        fields.setdefault(key, []).append(value if isinstance(value, str) else "")
    response: Response = await _in_thread(_apply, request.app.state.handoff, request.path_params["name"], fields)
    return response


def _apply(handoff: Any, name: str, fields: dict[str, list[str]]) -> Response:
    """The person's choices on the frozen review the page showed (its id in the form): handed to the run that
    waits for them (`run --review web`), or carried out here; nothing is fetched again either way."""
    from vmsandbox.core import reviews

    review_id = fields.get("review", [""])[0]
    waiting = handoff.takes(name, review_id) if handoff is not None else None
    if waiting is not None:
        chosen = review.decisions(waiting, fields)
        outcome = handoff.hand_back(chosen.decisions)
        return page("outcome.html", name=name, outcome=outcome, refused=chosen.refused, removed=False)
    refused: list[str] = []

    def decide(plan: Plan) -> Decisions:
        chosen = review.decisions(plan, fields)
        refused.extend(chosen.refused)
        return chosen.decisions

    try:
        settled = reviews.apply(name, review_id, decide)
    except VmsandboxError as exc:
        return failed(exc)
    return page("outcome.html", name=name, outcome=settled.outcome, refused=refused, removed=settled.removed)


def log_lines(request: Request) -> Response:
    name, which = request.path_params["name"], request.path_params["which"]
    try:
        return JSONResponse(logs.tail(name, which))
    except VmsandboxError as exc:
        return JSONResponse({"error": exc.message}, status_code=409)


async def egress_action(request: Request) -> Response:
    form = await request.form()
    name, action = request.path_params["name"], request.path_params["action"]
    value = form.get("value")
    try:
        await _in_thread(logs.act, name, action, value if isinstance(value, str) else "")
    except VmsandboxError as exc:
        return failed(exc)
    return RedirectResponse(f"/s/{name}", status_code=303)


def show_compare(request: Request) -> Response:
    names = [n for n in request.query_params.getlist("s") if n]
    try:
        view = compare.view(names)
    except VmsandboxError as exc:
        return failed(exc)
    return page("compare.html", view=view, names=names, pick=compare.pick)


async def apply_compare(request: Request) -> Response:
    form = await request.form()
    fields = {k: str(v) for k, v in form.multi_items()}
    try:
        result = await _in_thread(compare.apply, fields)
    except VmsandboxError as exc:
        return failed(exc)
    return page("compared.html", result=result)


async def _in_thread(fn: Any, *args: Any) -> Any:
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(fn, *args)


def make(*, address: str, port: int, handoff: Any = None, on_exchange: Callable[[str], None] | None = None) -> Guard:
    """The application behind its guard (pageguard.py) at address:port; `handoff` takes the apply of the review a run
    waits for (person.Page), `on_exchange(ticket)` is called once a ticket is used."""
    app = Starlette(
        routes=[
            Route("/", sessions),
            Route("/s/{name}", show_review),
            Route("/s/{name}/apply", apply_review, methods=["POST"]),
            Route("/s/{name}/log/{which}", log_lines),
            Route("/s/{name}/egress/{action}", egress_action, methods=["POST"]),
            Route("/compare", show_compare),
            Route("/compare/apply", apply_compare, methods=["POST"]),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ]
    )
    app.state.handoff = handoff
    return Guard(app, address=address, port=port, on_exchange=on_exchange)
