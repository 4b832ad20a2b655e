"""A plan (sync.plan) as the review page shows it, and the page's form as Decisions.

Each item of the plan is a file view: what applying or leaving it does and why it is held (badges.py), its diff
as hunks a person takes one by one (sync/hunks.py), or for an overlapping merge the three-way text to edit. The
source changes come first; what is held after, in groups of one choice each (sync/review/outline.py). The plan
is a frozen review (sync.frozen); the form names it, and each item by its number in it and a hash of everything
the page showed of it: the apply takes that review, never a new fetch, and a content that is no longer what was
shown is not applied.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from markupsafe import Markup, escape

from vmsandbox import ui
from vmsandbox.sync.git import fetch as commitfetch
from vmsandbox.sync.git import refs
from vmsandbox.sync.land import write as apply
from vmsandbox.sync.review import diff, hunks, merge, outline
from vmsandbox.sync.review.compare import Change, Status
from vmsandbox.sync.review.diff import DIFF_LIMIT
from vmsandbox.sync.review.plan import Decisions, Item, Plan
from vmsandbox.sync.tree.manifest import CARRIED, FILE
from vmsandbox.web import badges, highlight

CONTEXT = 3  # unchanged lines shown around a hunk
PAGE_ITEMS = 100  # files per page: a mass change is read a page at a time


@dataclass
class Row:
    kind: str  # "ctx", "del", "add"
    old: int | None  # 1-based line numbers
    new: int | None
    html: Markup


@dataclass
class HunkView:
    index: int
    rows: list[Row]


@dataclass
class FileView:
    id: int  # the item's number in the frozen review (plan.todo)
    label: str
    kind: str
    status: str
    digest: str
    words: badges.Words  # what applying and leaving it do, its hold, the facts beside
    group: str | None = None  # the held group it is shown in (outline.keys), None: a source change
    hunks: list[HunkView] = field(default_factory=list)
    note: str = ""  # what a non-text change is
    three_way: str | None = None  # an overlapping merge, to edit
    default: str = "apply"  # the choice preselected: safe changes apply, the rest waits for a person

    @property
    def outcome(self) -> badges.Badge:
        """What happens to it with the choice preselected."""
        return self.words.on_apply if self.default == "apply" else self.words.on_skip


@dataclass
class Shelf:
    """A held group as one page shows it: one line with its reason and the one choice that takes every file of it
    listed on this page, the files shown on request."""

    key: str
    reason: str
    total: int  # in the whole review (a mass change's groups span pages)
    files: list[FileView]


def digest_of(item: Item) -> str:
    """Everything a page shows of an item, as one short hash: each change's path, status, kind, carried mode,
    content hash and link target on the guest's side, and every hold and badge. A form names it beside the
    item, so a choice is only ever taken for exactly what was shown."""
    shown = [
        [c.path, c.status.value, c.kind, c.risky, c.held, c.binary, c.secret, c.notes,
         None if c.guest is None else [c.guest.kind, c.guest.mode & CARRIED, c.guest.digest, c.guest.target],
         None if c.merge is None else hashlib.sha256(c.merge.text).hexdigest()]
        for c in item.changes
    ]  # fmt: skip
    return hashlib.sha256(json.dumps([item.label, item.repository, shown]).encode()).hexdigest()[:32]


def texts(plan: Plan, c: Change) -> tuple[bytes, bytes] | None:
    """The two texts a change's hunks are made of (before, after), as the review saw them, or None where it is
    not text. apply.ChangedError when one of them is no longer what the review saw."""
    g = plan.gathered
    old: bytes | None
    new: bytes | None
    if c.merge is not None and c.merge.clean:
        old, new = apply.read_as_reviewed(g.project, c.path, c.host, limit=DIFF_LIMIT), c.merge.text
    elif any(e is not None and e.kind != FILE for e in (c.base, c.guest)) or c.binary or c.kind == "mode changed":
        return None
    else:
        old = apply.read_nofollow(g.target.files.baseline, c.path, limit=DIFF_LIMIT) if c.base else b""
        new = apply.read_as_reviewed(g.source, c.path, c.guest, limit=DIFF_LIMIT)
    if old is None or new is None or not (diff.is_text(old) and diff.is_text(new)):
        return None
    if max(old.count(b"\n"), new.count(b"\n")) > hunks.HUNK_LINES:
        return None  # taken or left whole
    return old, new


def _hunk_views(old: bytes, new: bytes, old_html: list[Markup], new_html: list[Markup]) -> list[HunkView]:
    found = hunks.hunks(old, new)
    views: list[HunkView] = []
    for n, h in enumerate(found):
        rows: list[Row] = []
        shown_before = min(found[n - 1].old_end + CONTEXT, h.old_start) if n else 0  # the last hunk's context
        start = max(shown_before, h.old_start - CONTEXT)
        rows += [Row("ctx", i + 1, None, old_html[i]) for i in range(start, h.old_start)]
        rows += [Row("del", i + 1, None, old_html[i]) for i in range(h.old_start, h.old_end)]
        rows += [Row("add", None, j + 1, new_html[j]) for j in range(h.new_start, h.new_end)]
        end = min(found[n + 1].old_start if n + 1 < len(found) else len(old_html), h.old_end + CONTEXT)
        rows += [Row("ctx", i + 1, None, old_html[i]) for i in range(h.old_end, end)]
        views.append(HunkView(h.index, rows))
    return views


def files(plan: Plan, page: int = 0) -> list[FileView]:
    """The file views of one page of the plan's items, as a person reads them (outline.py): the source changes
    first, then the held groups."""
    shape = outline.outline(plan.todo, plan.mass is not None)
    held = {n: g.key for g in shape.groups for n in g.numbers}
    pairs: list[tuple[int, bytes, bytes]] = []
    views: list[FileView] = []
    for i in shape.order[page * PAGE_ITEMS : (page + 1) * PAGE_ITEMS]:
        view, both = _view(plan, i, held.get(i))
        if both is not None:
            pairs.append((len(views), *both))
        views.append(view)
    shown = highlight.lines(
        [(views[k].label, text.decode(errors="replace")) for k, old, new in pairs for text in (old, new)]
    )
    for n, (k, old, new) in enumerate(pairs):
        old_html, new_html = shown[2 * n], shown[2 * n + 1]
        if len(old_html) != len(hunks.lines(old)) or len(new_html) != len(hunks.lines(new)):
            old_html, new_html = _plain(old), _plain(new)
        views[k].hunks = _hunk_views(old, new, old_html, new_html)
    return views


def _view(plan: Plan, i: int, group: str | None) -> tuple[FileView, tuple[bytes, bytes] | None]:
    """Item `i`'s view, and its two texts when it is shown as hunks."""
    item = plan.todo[i]
    c = item.first
    view = FileView(i, item.label, item.kind, c.status.value, digest_of(item), badges.words(item, group), group)
    safe = c.status in (Status.APPLY, Status.MERGED) and not (item.risky or item.held or item.binary or item.secret)
    view.default = "apply" if safe and group is None else "skip"  # (a mass change's items are all in groups)
    try:
        both = None if item.repository else texts(plan, c)
    except apply.ChangedError as exc:
        both, view.note = None, exc.message
    if c.merge is not None and not c.merge.clean:
        text = c.merge.text.decode(errors="replace")
        if ui.visible(text) == text:
            view.three_way = text
        else:  # shown escaped, an edit of it would be the escapes: resolved at the terminal instead
            view.note = UNEDITABLE
        return view, None
    if both is None:
        view.note = view.note or diff.describe(c) or c.kind
    return view, both


def shelves(plan: Plan, views: list[FileView]) -> list[Shelf]:
    """The held groups of the page that shows `views`, in the order they are read."""
    found: list[Shelf] = []
    for g in outline.outline(plan.todo, plan.mass is not None).groups:
        members = [v for v in views if v.group == g.key]
        if members:
            found.append(Shelf(g.key, g.reason, len(g.numbers), members))
    return found


def _plain(text: bytes) -> list[Markup]:
    return [escape(ui.visible(line.decode(errors="replace").rstrip("\r\n"))) for line in hunks.lines(text)]


@dataclass
class Chosen:
    decisions: Decisions
    refused: list[str]  # items not decided on, and why


def decisions(plan: Plan, form: dict[str, list[str]]) -> Chosen:
    """The form of the review page as Decisions on `plan`, the frozen review the page showed: per item (by its
    number in the review, with the hash of all it showed) apply or not — its own choice, or its held group's
    (`g-KEY`: every item of the group the page listed, each still named by number and hash) — the hunks taken,
    an edited merge; the guest's commits if asked."""
    accept: list[Item] = []
    contents: dict[str, bytes] = {}
    refused: list[str] = []
    groups = outline.keys(plan.todo, plan.mass is not None)
    for key in (k for k in form if k.startswith("d") and k[1:].isdigit() and k[1:].isascii()):
        n = key[1:]
        index = int(n)
        item = plan.todo[index] if index < len(plan.todo) else None
        if item is None or form[key][0] != digest_of(item):
            refused.append(f"item {n}: not what this review showed; reload the page")
            continue
        group = groups[index]
        taken = group is not None and form.get(f"g-{group}", [""])[0] == "apply"  # its group's one choice
        if form.get(f"f{n}", ["skip"])[0] != "apply" and not taken:
            continue
        try:
            why = _content(plan, item, form, n, contents)
        except apply.ChangedError as exc:
            why = exc.message
        if why is None:
            accept.append(item)
        elif why:
            refused.append(f"{item.label}: {why}")
    commits = form.get("commits", [""])[0] == "take"
    return Chosen(Decisions(tuple(accept), (), commits and plan.gathered.refs_changed, contents=contents), refused)


def _content(plan: Plan, item: Item, form: dict[str, list[str]], n: str, contents: dict[str, bytes]) -> str | None:
    """Put in `contents` what the form says to write for the item (hunks, an edit); why it is not applied
    ("" to leave it quietly: no hunk taken), or None to apply it."""
    c = item.first
    edited = form.get(f"m{n}")
    if edited is not None and c.merge is not None and not c.merge.clean:
        return _edited(c.path, c.merge.text, edited[0], contents)
    both = texts(plan, c) if f"hs{n}" in form else None
    if both is None:
        return None
    taken = {int(h) for h in form.get(f"h{n}", []) if h.isdigit() and h.isascii()}
    every = {h.index for h in hunks.hunks(*both)}
    if not taken & every:
        return ""
    if not taken >= every:
        contents[c.path] = hunks.compose(*both, taken)
    return None


UNEDITABLE = (
    "both sides changed the same lines, and the text holds characters that hide or reorder what surrounds them: "
    "it is not edited here (leave it pending, or apply to keep the guest's version beside the file; "
    "`vmsandbox pull NAME PATH` shows it escaped)"
)


def _edited(path: str, merged: bytes, edited: str, contents: dict[str, bytes]) -> str | None:
    """An overlapping merge (`merged`, with its markers) as the person left it in the page."""
    if ui.visible(merged.decode(errors="replace")) != merged.decode(errors="replace"):
        return UNEDITABLE
    text = edited.encode()
    if b"\r\n" not in merged:
        text = text.replace(b"\r\n", b"\n")  # a browser sends a textarea's lines with CRLF
    if text == merged:
        return None  # not resolved: the guest's version is kept beside the file, as at the terminal
    if merge.has_markers(text):
        return "conflict markers remain in the merged text; resolve them or leave the file"
    contents[path] = text
    return None


def commits(plan: Plan) -> tuple[list[commitfetch.RefView], str | None]:
    """The guest's branches and tags with their commits and the files they touch (staged, listed, dropped)."""
    try:
        return commitfetch.preview(plan.gathered)
    except refs.Refused as exc:
        return [], exc.message


def counts(plan: Plan) -> dict[str, int]:
    """The summary at the top of the page."""
    items: Iterable[Item] = plan.todo
    found = {"created": 0, "modified": 0, "deleted": 0, "merged": 0, "conflicts": 0, "risky": 0, "ignored": 0,
             "binary": 0, "credentials": 0}  # fmt: skip
    for item in items:
        c = item.first
        kind = {"added": "created", "deleted": "deleted"}.get(c.kind, "modified")
        found[kind] += 1
        found["merged"] += c.status is Status.MERGED
        found["conflicts"] += c.status is Status.CONFLICT
        found["risky"] += item.quarantined
        found["ignored"] += bool(item.held)
        found["binary"] += item.binary
        found["credentials"] += bool(item.secret)
    return found
