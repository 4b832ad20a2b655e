"""The person's say on what an agent proposes to apply: MCP's way to the Person (core.person's rule — a front end
shows what it is handed and hands back a choice; what a person saw is what is applied).

An agent names items (and hunks) of a frozen review it read; the server asks the person with an MCP elicitation
form built here from that frozen review, never from the agent's words: one yes/no per proposed item, with its
path, what changed and its holds, and above the form each item's diff under a heading of ours (`layout`). An item
starts ticked only when nothing holds it and all of it was shown: a held one (a secret, a file that runs on the
host later, an ignored or binary file, a conflict, a mass change), and one whose diff did not fit or has no text to
show, start unticked and are taken only when the person ticks them. What the person ticked becomes the apply's
choices, with each item's digest as the review showed it (`chosen`): an item the guest changed since is refused
by the core, never applied as it is now.

Guest text (paths, lines, reasons of holds) and the agent's words are escaped, each name and reason on one line
(shown.line): none of it starts a line that could read as a heading, an instruction or another item."""

from __future__ import annotations

import shlex
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import pydantic

from vmsandbox.core.sandbox import model
from vmsandbox.core.sandbox.names import InvalidError, Token
from vmsandbox.core.views import madeby
from vmsandbox.core.views.madeby import OUTSIDE, Maker, Step
from vmsandbox.mcp import shown

MOST_PROPOSED = 50  # items in one proposal: a person reads each one
ITEM_LINES = 80  # diff lines of one item in a form's message
FORM_LINES = 400  # diff lines of a form's message, over all its items
PAGE = 100  # items of a review in one get_review result
SHOWN_WHOLE = ("deleted",)  # kinds whose every effect the heading says (no content lands)


@dataclass(frozen=True)
class Proposed:
    """An item of a review an agent proposes, with the hunks it proposes (None: the whole item)."""

    item: model.ReviewItem
    hunks: tuple[Token, ...] | None


@dataclass(frozen=True)
class Shown:
    """A proposed item as the person sees it: its lines in the message, and whether they show all it does."""

    proposed: Proposed
    lines: tuple[str, ...]
    whole: bool

    @property
    def ticked(self) -> bool:
        return self.whole and not self.proposed.item.holds


def proposal(review: model.Review, asked: Sequence[dict[str, Any]]) -> list[Proposed]:
    """The agent's proposal read against the frozen review: every item and hunk it names must be in it, once."""
    if not asked:
        raise InvalidError("no items proposed", hint="name items of the review by their ids (i0, i1 …)")
    if len(asked) > MOST_PROPOSED:
        raise InvalidError(f"{len(asked)} items proposed: at most {MOST_PROPOSED} at once",
                           hint="propose the rest in a second call")  # fmt: skip
    by_id = {i.id.value: i for i in review.items}
    found: list[Proposed] = []
    for entry in asked:
        item = by_id.get(str(entry.get("item", "")))
        if item is None:
            raise InvalidError(f"no item {str(entry.get('item'))[:40]!r} in review {review.id.value}",
                               hint="use the ids get_review gave, unchanged")  # fmt: skip
        if any(p.item.id == item.id for p in found):
            raise InvalidError(f"item {item.id.value} proposed twice", hint="name each item once")
        found.append(Proposed(item, _hunks(item, entry.get("hunks"))))
    return found


def _hunks(item: model.ReviewItem, asked: object) -> tuple[Token, ...] | None:
    if asked is None:
        return None
    have = {h.id.value for h in item.hunks}
    named = [str(h)[:20] for h in asked] if isinstance(asked, list) else []
    if not named or len(set(named)) != len(named) or not set(named) <= have:
        raise InvalidError(
            f"item {item.id.value}: hunks must be a list of its hunks' ids, each once ({sorted(have) or 'none'})",
            hint="name hunks get_review listed for it, or leave `hunks` out for the whole item",
        )
    return tuple(Token(h) for h in named)


def layout(proposed: Sequence[Proposed], steps: Sequence[Step] = ()) -> list[Shown]:
    """Each proposed item's lines for the message, within ITEM_LINES each and FORM_LINES in all, its heading with
    a line of who made it (`steps`: the review's, in order)."""
    numbers = {s.id: n for n, s in enumerate(steps, 1)}
    budget = FORM_LINES
    found = []
    for p in proposed:
        body, whole = _body(p)
        room = min(ITEM_LINES, max(budget, 0))
        cut = len(body) > room
        body = body[:room] + ([f"  [… {len(body) - room} more lines: not shown here]"] if cut else [])
        budget -= room
        made = made_line(p, numbers)
        heading = (_heading(p, whole and not cut), *([made] if made else []))
        found.append(Shown(p, (*heading, *body), whole and not cut))
    return found


MADE_LINE = 240  # characters of an item's one line of who made it, in the form


def made_line(p: Proposed, numbers: dict[str, int]) -> str | None:
    """One line saying who made the proposed part of an item (its hunks' writers, or the item's), escaped and
    bounded; None when the review does not say. The guest's word: it only informs the person."""
    named = None if p.hunks is None else {h.value for h in p.hunks}
    hunks = [h for h in p.item.hunks if named is None or h.id.value in named]
    makers = list(dict.fromkeys(m for h in hunks for m in h.made_by)) or list(p.item.made_by)
    if not makers:
        return None
    said = "; ".join(_maker_words(m, numbers) for m in makers[:4])
    said += f"; {len(makers) - 4} more" if len(makers) > 4 else ""
    return "  made by (the guest's word): " + shown.line(said, MADE_LINE)


def _maker_words(m: Maker, numbers: dict[str, int]) -> str:
    n = numbers.get(m.step)
    where = "outside any step" if m.step == OUTSIDE or n is None else f"step {n} ({shown.line(m.command[:200], 60)})"
    badges = "".join(f" [{b}]" for b in m.badges)
    return f"{where}: {shown.line(argv(m), 80)}{badges}"


def argv(m: Maker) -> str:
    """A writer's argv as a shell would read it (each word quoted), its pieces bounded before anything is escaped
    (the guest's: any size); the caller escapes it."""
    words = " ".join(shlex.quote(a[: madeby.ARGV_WORD]) for a in m.argv[: madeby.ARGV_WORDS])
    more = len(m.argv) - madeby.ARGV_WORDS
    return (words + (f" … {more} more" if more > 0 else "")) or m.exe[: madeby.ARGV_WORD] or "an unnamed process"


MAKERS = 8  # makers of one hunk in a get_review result; the rest counted


def makers_data(found: Sequence[Maker], numbers: dict[str, int]) -> dict[str, Any]:
    """Who made a hunk or an item, as an agent reads it: the step (its place and command), the writer's argv and
    executable escaped and cut short, its badges; at most MAKERS of them."""
    made = [{"step": numbers.get(m.step), "outside_any_step": m.step == OUTSIDE or m.step not in numbers,
             "command": shown.line(m.command[:1000], 200), "argv": shown.line(argv(m), 300),
             "exe": shown.line(m.exe[:1000], 300), "badges": list(m.badges)} for m in found[:MAKERS]]  # fmt: skip
    return {"made_by": made, **({"made_by_more": len(found) - MAKERS} if len(found) > MAKERS else {})}


def steps_data(review: model.Review, named: Collection[str] = ()) -> list[dict[str, Any]]:
    """The review's steps in order, as an agent reads them: the newest madeby.MOST_STEPS and every one `named`
    (those of the makers a result shows), each with its place among all of them, the host's command, times and
    exit code, and the egress requests logged while each ran (escaped, at most 50 lines each)."""
    most = madeby.EGRESS_LINES
    return [{"step": n, "command": shown.line(s.command[:2000], 500), "how": s.how, "started": s.started,
             "ended": s.ended, "exit_code": s.exit, "egress": [shown.line(e[:1000], 300) for e in s.egress[:most]],
             **({"egress_more": len(s.egress) - most} if len(s.egress) > most else {})}
            for n, s in madeby.listed(review.steps, named)]  # fmt: skip


def _which(p: Proposed) -> str:
    if p.hunks is None:
        return "all of it"
    return f"hunks {', '.join(h.value for h in p.hunks)} of {len(p.item.hunks)}"


def _heading(p: Proposed, whole: bool) -> str:
    holds = "; ".join(f"HELD {h.badge.value}: {shown.line(h.reason, 200)}" for h in p.item.holds)
    return (f"[{p.item.id.value}] {shown.line(p.item.path, 300)} — {p.item.kind}, {_which(p)}"
            f"{'' if whole else ' — NOT ALL SHOWN'}{f' — {holds}' if holds else ''}")  # fmt: skip


def _body(p: Proposed) -> tuple[list[str], bool]:
    """The item's proposed hunks as diff lines (each `  @@`, `  -` or `  +`: no guest line starts otherwise), and
    whether they show all it does; what lands beside its content (a type, a mode, a link's target) said too."""
    item = p.item
    named = None if p.hunks is None else {h.value for h in p.hunks}
    body: list[str] = []
    for h in item.hunks:
        if named is None or h.id.value in named:
            body.append(f"  @@ -{h.old_start},{len(h.old_lines)} +{h.new_start},{len(h.new_lines)} @@ ({h.id.value})")
            body += [f"  -{shown.line(x.rstrip(chr(10)), 1000)}" for x in h.old_lines]
            body += [f"  +{shown.line(x.rstrip(chr(10)), 1000)}" for x in h.new_lines]
    lands = []
    if item.entry_type is not None and item.entry_type != "file":
        lands.append(f"a {item.entry_type}")
    if item.target is not None:
        lands.append(f"pointing at {shown.line(item.target, 500)}")
    if item.mode is not None:
        lands.append(f"mode {item.mode:o}")
    if lands:
        body.append(f"  lands as {', '.join(lands)}")
    whole = bool(item.hunks) or item.kind in SHOWN_WHOLE or (item.entry_type in ("symlink", "dir") and bool(lands))
    return body, whole


def form(laid: Sequence[Shown]) -> type[pydantic.BaseModel]:
    """The elicitation form: one yes/no per proposed item, ticked only where nothing holds it and all was shown."""
    fields: dict[str, Any] = {
        _field(s.proposed): (bool, pydantic.Field(default=s.ticked, title=_title(s), description=_described(s)))
        for s in laid
    }
    made: type[pydantic.BaseModel] = pydantic.create_model("Apply", **fields)
    return made


def _field(p: Proposed) -> str:
    return f"take_{p.item.id.value}"


def _title(s: Shown) -> str:
    p = s.proposed
    held = ", ".join(h.badge.value for h in p.item.holds)
    return f"[{p.item.id.value}] {'HELD ' + held + ': ' if held else ''}{shown.line(p.item.path, 200)} ({_which(p)})"


def _described(s: Shown) -> str:
    if s.proposed.item.holds:
        return "Held by the review (see above): left out unless you tick it."
    if not s.whole:
        return "Not all of it is shown above (`vmsandbox diff` shows it): left out unless you tick it."
    return "Apply this change to the project on your machine."


def message(session: str, project: str | None, review: model.Review, laid: Sequence[Shown], why: str) -> str:
    """What the person reads above the form: where it lands, each item's diff under a heading of ours, and last
    the agent's reason, on one line, marked as its words."""
    where = f"to {shown.line(project, 500)}" if project else "(a session on no project of yours)"
    said = [
        f"An agent asks to apply {len(laid)} change(s) of vmsandbox session {session} {where} "
        f"(review {review.id.value}). Untick what must not land; held items and items not all shown here stay out "
        "unless you tick them. Decline: nothing is applied.",
    ]
    if review.traced and review.incomplete:
        said.append(f"Who made each change is incomplete: {shown.line(review.incomplete[:1000], 300)}")
    for s in laid:
        said += ["", *s.lines]
    if why.strip():
        said += ["", f"The agent's reason (its words, not vmsandbox's): {shown.line(why, 500)}"]
    return "\n".join(said)


def chosen(laid: Sequence[Shown], answer: pydantic.BaseModel) -> tuple[list[model.Choice], list[model.Badge]]:
    """The person's ticks as the apply's choices (each with the digest the review showed) and the holds they took
    (those of the held items they ticked: their tick is the explicit take)."""
    picked = [s.proposed for s in laid if getattr(answer, _field(s.proposed)) is True]
    choices = [model.Choice(p.item.id, p.item.digest, p.hunks) for p in picked]
    include = sorted({h.badge for p in picked for h in p.item.holds}, key=lambda b: b.value)
    return choices, include


def diff_of(item: model.ReviewItem) -> list[str]:
    """An item of a review as unified diff lines, escaped, each line bounded (the `diff` resource)."""
    path = shown.line(item.path, 1000)
    body = [f"--- a/{path}", f"+++ b/{path}"]
    for h in item.hunks:
        body.append(f"@@ -{h.old_start},{len(h.old_lines)} +{h.new_start},{len(h.new_lines)} @@")
        body += [f"-{shown.line(x.rstrip(chr(10)), 1000)}" for x in h.old_lines]
        body += [f"+{shown.line(x.rstrip(chr(10)), 1000)}" for x in h.new_lines]
    if not item.hunks:
        body.append(f"# {item.kind}: no text hunks (taken or left whole)")
    return body


def review_data(review: model.Review, offset: int = 0, most_lines: int = shown.MOST_LINES) -> dict[str, Any]:
    """A page of a frozen review as an agent reads it: PAGE items from `offset`, with ids, status, holds and
    hunks (at most `most_lines` lines of them in all)."""
    budget = most_lines
    items = []
    numbers = {s.id: n for n, s in enumerate(review.steps, 1)}
    page = review.items[offset : offset + PAGE]
    for item in page:
        hunks = []
        for h in item.hunks:
            old = [shown.text(x, 1000, keep="start") for x in h.old_lines[: max(budget, 0)]]
            budget -= len(old)
            new = [shown.text(x, 1000, keep="start") for x in h.new_lines[: max(budget, 0)]]
            budget -= len(new)
            cut = len(old) < len(h.old_lines) or len(new) < len(h.new_lines)
            hunks.append({"id": h.id.value, "old_start": h.old_start, "old_lines": old, "new_start": h.new_start,
                          "new_lines": new, **({"cut": True} if cut else {}),
                          **(makers_data(h.made_by, numbers) if review.traced else {})})  # fmt: skip
        items.append({
            "id": item.id.value, "path": shown.line(item.path, 1000), "kind": item.kind, "status": item.status,
            "holds": [{"hold": h.badge.value, "reason": shown.line(h.reason, 500)} for h in item.holds],
            "hunks": hunks, **(makers_data(item.made_by, numbers) if review.traced else {}),
        })  # fmt: skip
    after = offset + len(page)
    named = {m.step for item in page for h in item.hunks for m in h.made_by[:MAKERS]}
    named |= {m.step for item in page for m in item.made_by[:MAKERS]}
    steps = steps_data(review, named)
    return {
        "review_id": review.id.value, "session": review.session.value, "items": items, "total_items": len(review.items),
        **({"next_offset": after} if after < len(review.items) else {}),
        "refused": [shown.line(r, 500) for r in review.refused[:50]],
        "steps": steps,
        **({"steps_not_listed": len(review.steps) - len(steps)} if len(steps) < len(review.steps) else {}),
        **({"provenance": {"guest_word": True, "incomplete": _incomplete(review),
                           "note": "made_by is what the guest's journal said: a hint, never a reason to apply"}}
           if review.traced else {}),
        "note": "propose what should land with propose_apply(review_id, items); the person decides",
        **shown.untrusted("items", "refused", "steps", "provenance"),
    }  # fmt: skip


def _incomplete(review: model.Review) -> str | None:
    return None if review.incomplete is None else shown.line(review.incomplete[:1000], 300)
