"""A frozen review as every front end shows it, and a person's choices on it as Decisions: the hash of all a
front end shows of an item (what a choice must name back), the two texts of a change as the review saw them,
its hunks, its holds with their reasons, and choices — items, hunks, an edited merge — turned into what the
core applies. The page (web/review.py) renders these; the API (core/sandbox/backend.py) serialises them. Who made
each change (its provenance) is here as data (made_by, steps) and in madeby.py as every front end words it."""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import os
import stat
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import vmsandbox.sync.review.outline
from vmsandbox.egress import proxylog
from vmsandbox.session.moments import fanout
from vmsandbox.sync.git import fetch, refs
from vmsandbox.sync.land import write
from vmsandbox.sync.provenance import attribute, blame
from vmsandbox.sync.provenance.model import Maker, Provenance, Step
from vmsandbox.sync.review import diff, hunks, mass, merge
from vmsandbox.sync.review.diff import DIFF_LIMIT, diff_text, is_text, merge_text
from vmsandbox.sync.review.hunks import Hunk
from vmsandbox.sync.review.outline import Group, Outline, keys
from vmsandbox.sync.review.plan import Decisions, Item, Outcome, Plan, grouped
from vmsandbox.sync.review.take import Take
from vmsandbox.sync.review.threeway import Change, Status
from vmsandbox.sync.scan import highlight
from vmsandbox.sync.scan.credentials import Finding
from vmsandbox.sync.tree import manifest
from vmsandbox.sync.tree.manifest import CARRIED, FILE

# what a front end reads of a review: its types, as the core hands them out
# (the plan and its parts, its outline, a change described and as a diff, a mass change by directory, a fan-out's
# outcome, and what a person's choices make; keys: the held group of each of some items, None for a source change;
# who made a change: its makers, and the session's steps, in its provenance)
__all__ = ["FILE", "Change", "ChangedError", "Decisions", "FanOutcome", "Finding", "Group", "Hunk", "Item", "Maker",
           "Outcome", "Outline", "Plan", "Provenance", "RefView", "Status", "Step", "Take", "Tokens", "diff_text",
           "grouped", "keys", "mass", "merge_text"]  # fmt: skip
ChangedError = write.ChangedError
FanOutcome = fanout.Outcome
RefView = fetch.RefView
Tokens = highlight.Tokens
lines = hunks.lines  # a text's lines, as hunks count them
hunks_of = hunks.hunks  # the hunks between two texts, numbered as a choice names them
describe = diff.describe  # what a change that is not shown as text is, in words
tokens = highlight.tokens  # texts as the jailed lexer's tokens, None where it did not answer truly
landed_mode = manifest.landed_mode  # the mode a file of the guest lands with on the host


def outline(plan: Plan) -> Outline:
    """The review as a person reads it: source changes first, then the held groups (sync/review/outline.py)."""
    return vmsandbox.sync.review.outline.outline(plan.todo, plan.mass is not None)


def groups(plan: Plan) -> list[str | None]:
    """Each item's held group (None: a source change), in the review's order."""
    return keys(plan.todo, plan.mass is not None)


def safe(item: Item) -> bool:
    """Whether an item is applied unless a person says otherwise: a change that applies or merges cleanly and is
    held for nothing."""
    c = item.first
    return c.status in (Status.APPLY, Status.MERGED) and not (item.risky or item.ignored or item.binary or item.secret)


def commits(plan: Plan) -> tuple[list[RefView], str | None]:
    """The guest's branches and tags with their commits and the files they touch, and why they are refused (if
    they are)."""
    try:
        return fetch.preview(plan.gathered)
    except refs.Refused as exc:
        return [], exc.message


def fingerprint(item: Item) -> str:
    """Everything a front end shows of an item, as one short hash: each change's path, status, kind, carried
    mode, content hash and link target on the guest's side, and every hold and badge. A choice names it beside
    the item, so a choice is only ever taken for exactly what was shown."""
    shown = [
        [c.path, c.status.value, c.kind, c.risky, c.ignored, c.binary, c.secret, c.notes,
         None if c.guest is None else [c.guest.kind, c.guest.mode & CARRIED, c.guest.digest, c.guest.target],
         None if c.merge is None else hashlib.sha256(c.merge.text).hexdigest()]
        for c in item.changes
    ]  # fmt: skip
    return hashlib.sha256(json.dumps([item.label, item.repository, shown]).encode()).hexdigest()[:32]


def texts(plan: Plan, c: Change) -> tuple[bytes, bytes] | None:
    """The two texts a change's hunks are made of (before, after), as the review saw them, or None where it is
    not text. ChangedError when one of them is no longer what the review saw."""
    g = plan.gathered
    old: bytes | None
    new: bytes | None
    if c.merge is not None and c.merge.clean:
        old, new = write.read_as_reviewed(g.project, c.path, c.host, limit=DIFF_LIMIT), c.merge.text
    elif any(e is not None and e.kind != FILE for e in (c.base, c.guest)) or c.binary or c.kind == "mode changed":
        return None
    else:
        old = write.read_nofollow(g.target.files.baseline, c.path, limit=DIFF_LIMIT) if c.base else b""
        new = write.read_as_reviewed(g.source, c.path, c.guest, limit=DIFF_LIMIT)
    if old is None or new is None or not (is_text(old) and is_text(new)):
        return None
    if max(old.count(b"\n"), new.count(b"\n")) > hunks.HUNK_LINES:
        return None  # taken or left whole
    return old, new


def provenance(plan: Plan) -> Provenance | None:
    """Who wrote what in the guest, as its journal said when the review was made (None: nothing to say). The
    guest's word: shown, never a reason to apply or hold anything."""
    return plan.gathered.provenance


def steps(plan: Plan) -> tuple[Step, ...]:
    """The steps of the session (its commands, as the host kept them, and those only the guest registered), each
    with the egress requests the proxy logged while it ran."""
    prov = plan.gathered.provenance
    return () if prov is None else _with_egress(prov.steps, plan.gathered.target.files.proxy_log)


def made_by(plan: Plan, c: Change, hunk: Hunk | None) -> tuple[Maker, ...]:
    """Who made a hunk of a change (one of hunks_of(*texts(plan, c))), or the whole change (None): each writer
    once, as the guest's journal named it; () when it named none."""
    prov = plan.gathered.provenance
    if prov is None:
        return ()
    if hunk is None or c.merge is None or not c.merge.clean:
        return blame.makers(prov, c.path, hunk)
    # a clean merge's hunks count the lines of the host's file and the merged text: found back in the guest's
    try:
        guest = write.read_as_reviewed(plan.gathered.source, c.path, c.guest, limit=attribute.LIMIT)
    except ChangedError:
        guest = None
    if guest is None:
        return blame.makers(prov, c.path, None)
    return blame.makers(prov, c.path, hunk, merged=(guest, c.merge.text))


def holds(item: Item) -> list[tuple[str, str]]:
    """Why an item waits for an explicit choice: (what, why), in the order a person reads them."""
    c = item.first
    found: list[tuple[str, str]] = []
    if item.secret:
        found.append(("secret", item.secret))
    if item.risky:
        found.append(("quarantined", item.risky))
    if item.ignored:
        found.append(("ignored", item.ignored))
    if item.binary:
        found.append(("binary", "binary content: applied only when chosen"))
    if c.status is Status.CONFLICT:
        found.append(("conflict", "the host changed it too"))
    if c.status is Status.UNSAFE:
        found.append(("unsafe", c.notes[0] if c.notes else "can never be written"))
    return found


@dataclass(frozen=True)
class Choice:
    """A person's choice of one item of a review: its number, the fingerprint they were shown, the hunks taken
    (None: all of it), an edit of an overlapping merge (None: none)."""

    item: int
    shown: str
    hunks: Collection[int] | None = None
    edit: bytes | None = None


@dataclass
class Chosen:
    decisions: Decisions
    refused: list[str] = field(default_factory=list)  # choices not taken, and why
    refused_items: list[int] = field(default_factory=list)  # the item each of them named, in the same order


def decide(plan: Plan, choices: list[Choice], *, commits: bool = False, again: str = "look again") -> Chosen:
    """Choices on a frozen review as the Decisions the core carries out on it: each must name an item of that
    review with what was shown of it (`again`: what a person does when it does not); hunks and edits are
    composed from the texts the review saw."""
    accept: list[Item] = []
    contents: dict[str, bytes] = {}
    refused: list[str] = []
    which: list[int] = []
    for choice in choices:
        item = plan.todo[choice.item] if 0 <= choice.item < len(plan.todo) else None
        if item is None or fingerprint(item) != choice.shown:
            refused.append(f"item {choice.item}: not what this review showed; {again}")
            which.append(choice.item)
            continue
        try:
            why = _content(plan, item, choice, contents)
        except ChangedError as exc:
            why = exc.message
        if why is None:
            accept.append(item)
        elif why:
            refused.append(f"{item.label}: {why}")
            which.append(choice.item)
    decisions = Decisions(tuple(accept), (), commits and plan.gathered.refs_changed, contents=contents)
    return Chosen(decisions, refused, which)


def _content(plan: Plan, item: Item, choice: Choice, contents: dict[str, bytes]) -> str | None:
    """Put in `contents` what the choice says to write for the item; why it is not applied ("" to leave it
    quietly: no hunk taken), or None to apply it."""
    c = item.first
    if choice.edit is not None and c.merge is not None and not c.merge.clean:
        return edited(c.path, c.merge.text, choice.edit, contents)
    if choice.hunks is None:
        return None
    both = texts(plan, c)
    if both is None:
        return "it has no hunks to choose from (not text, or too long): choose it whole"
    every = {h.index for h in hunks.hunks(*both)}
    unknown = sorted(set(choice.hunks) - every)
    if unknown:
        return f"it has no hunk {', '.join(f'h{n}' for n in unknown)}: choose from the hunks the review showed"
    taken = set(choice.hunks)
    if not taken:
        return ""
    if taken != every:
        contents[c.path] = hunks.compose(*both, taken)
    return None


UNEDITABLE = (
    "both sides changed the same lines, and the text holds characters that hide or reorder what surrounds them: "
    "it is not edited here (leave it pending, or apply to keep the guest's version beside the file; "
    "`vmsandbox pull NAME PATH` shows it escaped)"
)


def editable(merged: bytes) -> bool:
    """Whether an overlapping merge may be edited by a person in a page (what they see is what its bytes are)."""
    from vmsandbox import ui

    text = merged.decode(errors="replace")
    return ui.visible(text) == text


def edited(path: str, merged: bytes, text: bytes, contents: dict[str, bytes]) -> str | None:
    """An overlapping merge (`merged`, with its markers) as the person left it."""
    if not editable(merged):
        return UNEDITABLE
    if b"\r\n" not in merged:
        text = text.replace(b"\r\n", b"\n")  # a browser sends a textarea's lines with CRLF
    if text == merged:
        return None  # not resolved: the guest's version is kept beside the file, as at the terminal
    if merge.has_markers(text):
        return "conflict markers remain in the merged text; resolve them or leave the file"
    contents[path] = text
    return None


def counts(plan: Plan) -> Mapping[str, int]:
    """The summary at the top of a review."""
    found = {"created": 0, "modified": 0, "deleted": 0, "merged": 0, "conflicts": 0, "risky": 0, "ignored": 0,
             "binary": 0, "credentials": 0}  # fmt: skip
    for item in plan.todo:
        c = item.first
        found[{"added": "created", "deleted": "deleted"}.get(c.kind, "modified")] += 1
        found["merged"] += c.status is Status.MERGED
        found["conflicts"] += c.status is Status.CONFLICT
        found["risky"] += item.quarantined
        found["ignored"] += bool(item.ignored)
        found["binary"] += item.binary
        found["credentials"] += bool(item.secret)
    return found


MAX_EGRESS = 200  # requests kept per step
GUEST_HOW = "guest"  # how a step only the guest registered was made (madeby.GUEST)
MAX_GUEST_STEPS = attribute.MAX_GUEST_STEPS  # steps only the guest registered (no time: no egress), kept
LOG_READ = proxylog.MAX_LOG_BYTES + 64 * 1024  # read of each of the proxy's two log files at most (rotated past 8 MiB)


def _with_egress(found: tuple[Step, ...], log_file: Path) -> tuple[Step, ...]:
    """Each step with the proxy's log lines of its time (by time: the proxy cannot tell which process asked). A step
    only the guest registered has no time kept: no egress (and at most MAX_GUEST_STEPS of them are kept)."""
    guest = [s for s in found if s.how == GUEST_HOW][:MAX_GUEST_STEPS]
    timed = [s for s in found if s.how != GUEST_HOW]
    if not timed:
        return tuple(guest)
    events: list[tuple[float, dict[str, object]]] = []
    for path in (proxylog.rotated(log_file), log_file):
        for line in _log_lines(path):
            event = proxylog.parse(line)
            if event is None or event.get("decision") == "policy":
                continue
            try:
                ts = float(event.get("ts", 0))
            except (TypeError, ValueError):
                continue
            if not math.isnan(ts):
                events.append((ts, event))
    events.sort(key=lambda e: e[0])
    times = [ts for ts, _ in events]
    now = time.time()
    shown: list[Step] = []
    for s in timed:
        end = s.ended if s.ended is not None else now
        lo, hi = bisect.bisect_left(times, s.started), bisect.bisect_right(times, end)
        picked = tuple(_request(event) for _, event in events[lo : min(hi, lo + MAX_EGRESS)]) if lo < hi else ()
        shown.append(Step(s.id, s.command, s.started, s.ended, s.exit, s.how, picked))
    return (*shown, *guest)


def _log_lines(path: Path) -> list[str]:
    """The proxy's log file at `path` (no link followed), at most LOG_READ bytes of it, as lines ([]: none)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return []
    try:
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return []
            data = f.read(LOG_READ)
    except OSError:
        return []
    return data.decode(errors="replace").split("\n")


def _request(event: dict[str, object]) -> str:
    """One request in words: decision, method, where (the guest chose the target: front ends escape it)."""
    target = f"{event['host']}:{event.get('port', '?')}" if "host" in event else str(event.get("target", "?"))
    return f"{event.get('decision', '?')} {event.get('method', '-')} {target}"[:300]
