"""A review frozen when it is shown: what a person saw is what an apply takes, from every front end.

When a review is made (sync.review.plan.make over what was gathered), it is written host-side into the session
directory under a random id, before anything shows it: every change with its three sides (kind, mode, content
hash, link target), its status, every hold and badge (risky, ignored, binary, credential, notes), the merge
text a person would apply, and the tips of the guest's branches and tags. A front end that shows it (the
terminal, the session page, the compare page, the API) names that id when it hands back a person's choices,
and the apply (sync.review.plan.carry_out) takes the review from here: nothing is gathered again from the guest.

What the review does not copy is the guest's file content: the apply reads it from where the review read it
(the mirror, or the outbox) and checks it against the content hash frozen here as it streams it into place
(sync.land.write). A change whose guest content is no longer what was shown there (a later fetch brought a newer
version) is not applied: the person is told to look again. Modes, kinds and link targets come from the
review, never from the mirror; the guest's commits are fetched at the tips shown, not at the guest's refs of
the moment of the apply.

A review is applied once (its file goes with the apply); a session keeps its last few reviews.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
from typing import Any

from vmsandbox import filewrite
from vmsandbox.errors import VmsandboxError
from vmsandbox.sync.provenance import store
from vmsandbox.sync.provenance.model import FileOrigin, Provenance
from vmsandbox.sync.review.gather import OUTBOX_FILES, Gathered, Origin
from vmsandbox.sync.review.plan import Item, Plan
from vmsandbox.sync.review.threeway import Change, Merge, Status
from vmsandbox.sync.target import Target
from vmsandbox.sync.tree.manifest import Entry

REVIEWS = "reviews"  # in the session directory
KEEP = 8  # reviews kept per session (a page left open, a second tab): older ones are dropped
_ID = re.compile(r"[0-9a-f]{32}")
MAX_REVIEW_BYTES = 512 * 1024**2
MAX_PROVENANCE_BYTES = 64 * 1024**2  # of a review's provenance (kept inside it as one JSON text)
UNKEPT_LINES = "its lines were not kept with the review (its provenance was too large)"


class StaleError(VmsandboxError):
    """A review that is not there any more (applied, replaced, or never made)."""


def freeze(plan: Plan) -> Plan:
    """Write the plan under a new id (plan.id is set) and return it; the oldest reviews past KEEP go."""
    files = plan.gathered.target.files
    where = files.root / REVIEWS
    where.mkdir(mode=0o700, exist_ok=True)
    plan.id = secrets.token_hex(16)
    filewrite.write_atomically(where / f"{plan.id}.json", json.dumps(_to_json(plan)))
    kept = sorted(where.glob("*.json"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    for old in kept[KEEP:]:
        old.unlink(missing_ok=True)
    return plan


def load(target: Target, review_id: str) -> Plan:
    """The review `review_id` of the session, as it was shown."""
    if not _ID.fullmatch(review_id):
        raise StaleError(f"{review_id!r} is not a review of session {target.name}", hint=_AGAIN.format(target.name))
    try:
        fd = os.open(target.files.root / REVIEWS / f"{review_id}.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise StaleError(
            f"this review of session {target.name} was applied already or replaced by a newer one",
            hint=_AGAIN.format(target.name),
        ) from None
    with os.fdopen(fd, "rb") as f:
        data = json.loads(f.read(MAX_REVIEW_BYTES))
    try:
        plan = _from_json(data, target)
    except KeyError:  # frozen by a vmsandbox whose reviews said other things (e.g. a change's `held`)
        raise StaleError(
            f"this review of session {target.name} was made by another version of vmsandbox",
            hint=_AGAIN.format(target.name),
        ) from None
    plan.id = review_id
    return plan


_AGAIN = "look at the changes again: reload the page, or `vmsandbox pull {0}`"


def consume(plan: Plan) -> None:
    """The review was applied: it cannot be applied again."""
    if plan.id:
        (plan.gathered.target.files.root / REVIEWS / f"{plan.id}.json").unlink(missing_ok=True)


# ---------------------------------------------------------------- as JSON


def _entry(e: Entry | None) -> dict[str, Any] | None:
    return None if e is None else e.as_dict()


def _change_json(c: Change) -> dict[str, Any]:
    merge = (
        None if c.merge is None else {"text": base64.b64encode(c.merge.text).decode(), "conflicts": c.merge.conflicts}
    )
    return {
        "path": c.path, "base": _entry(c.base), "guest": _entry(c.guest), "host": _entry(c.host),
        "status": c.status.value, "risky": c.risky, "notes": c.notes, "ignored": c.ignored, "binary": c.binary,
        "secret": c.secret, "merge": merge,
    }  # fmt: skip


def _change(d: dict[str, Any]) -> Change:
    def entry(e: dict[str, Any] | None) -> Entry | None:
        return None if e is None else Entry.from_dict(e)

    m = d["merge"]
    merge = None if m is None else Merge(base64.b64decode(m["text"]), int(m["conflicts"]))
    return Change(
        d["path"], entry(d["base"]), entry(d["guest"]), entry(d["host"]), Status(d["status"]), d["risky"],
        list(d["notes"]), d["ignored"], bool(d["binary"]), d["secret"], merge,
    )  # fmt: skip


def _to_json(plan: Plan) -> dict[str, Any]:
    g = plan.gathered
    index = {id(c): n for n, c in enumerate(g.changes)}
    return {
        "changes": [_change_json(c) for c in g.changes],
        "shown": [index[id(c)] for c in plan.shown],
        "todo": [{"label": i.label, "changes": [index[id(c)] for c in i.changes], "repository": i.repository}
                 for i in plan.todo],
        "mass": plan.mass,
        "origin": g.origin.value,
        "refs_changed": g.refs_changed,
        "git_refused": g.git_refused,
        "tips": g.tips,
        "limit": g.limit,
        "provenance": None if g.provenance is None else _provenance_json(g.provenance),
    }  # fmt: skip


def _from_json(data: dict[str, Any], target: Target) -> Plan:
    found = [_change(d) for d in data["changes"]]
    origin = Origin(data["origin"])
    source = target.files.outbox / OUTBOX_FILES if origin is Origin.OUTBOX else target.files.guest_tree
    tips = data["tips"]
    g = Gathered(
        target, found, source, bool(data["refs_changed"]), origin, data["git_refused"], int(data["limit"]),
        tips=None if tips is None else {str(k): str(v) for k, v in tips.items()},
        provenance=_provenance(data.get("provenance")),
    )  # fmt: skip
    todo = [Item(i["label"], tuple(found[n] for n in i["changes"]), bool(i["repository"])) for i in data["todo"]]
    return Plan(g, [found[n] for n in data["shown"]], todo, data["mass"])


def _provenance_json(prov: Provenance) -> str | None:
    """The review's provenance as one JSON text, at most MAX_PROVENANCE_BYTES: past it without its lines (each file
    keeps its writers), and past it still, none."""
    text = json.dumps(store.to_json(prov))
    if len(text) > MAX_PROVENANCE_BYTES:
        files = {path: FileOrigin(o.writers, incomplete=UNKEPT_LINES) for path, o in prov.files.items()}
        text = json.dumps(store.to_json(Provenance(prov.steps, prov.writers, files, prov.incomplete)))
    return text if len(text) <= MAX_PROVENANCE_BYTES else None


def _provenance(data: Any) -> Provenance | None:
    """The review's provenance (None: a review frozen before there was any, none to show, or one too large or not
    read: it only ever informs, and a review, or its apply, never fails for it)."""
    if not isinstance(data, str) or len(data) > MAX_PROVENANCE_BYTES:
        return None
    try:
        return store.from_json(json.loads(data))
    except (ValueError, RecursionError):
        return None
