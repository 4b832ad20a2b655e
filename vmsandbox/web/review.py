"""A plan (sync.review.plan) as the review page shows it, and the page's form as Decisions.

Each item of the plan is a file view: what applying or leaving it does and why it is held (badges.py), its diff
as hunks a person takes one by one (core.views.hunks_of), or for an overlapping merge the three-way text to edit. The
source changes come first; what is held after, in groups of one choice each (core.views.outline). The plan
is a frozen review (sync.review.frozen); the form names it, and each item by its number in it and a hash of everything
the page showed of it: the apply takes that review, never a new fetch, and a content that is no longer what was
shown is not applied.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from markupsafe import Markup, escape

from vmsandbox import ui
from vmsandbox.core import views
from vmsandbox.core.views import Plan
from vmsandbox.web import badges, highlight, timeline

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
    made: timeline.Made | None = None  # who made it (None: the review has no provenance)


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
    held: str = ""  # what holds it (views.holds, space-separated; "": nothing): a step's take-all never takes it
    made: timeline.Made | None = None  # who made it (a change without hunks), or the steps among its hunks' makers

    @property
    def steps(self) -> str:
        """The ids of the steps that made any of it (what a step's take-all or leave-all looks for)."""
        found = [self.made.steps] if self.made else []
        return " ".join(dict.fromkeys(" ".join(found + [h.made.steps for h in self.hunks if h.made]).split()))

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


def _hunk_views(found: list[views.Hunk], old_html: list[Markup], new_html: list[Markup]) -> list[HunkView]:
    made: list[HunkView] = []
    for n, h in enumerate(found):
        rows: list[Row] = []
        shown_before = min(found[n - 1].old_end + CONTEXT, h.old_start) if n else 0  # the last hunk's context
        start = max(shown_before, h.old_start - CONTEXT)
        rows += [Row("ctx", i + 1, None, old_html[i]) for i in range(start, h.old_start)]
        rows += [Row("del", i + 1, None, old_html[i]) for i in range(h.old_start, h.old_end)]
        rows += [Row("add", None, j + 1, new_html[j]) for j in range(h.new_start, h.new_end)]
        end = min(found[n + 1].old_start if n + 1 < len(found) else len(old_html), h.old_end + CONTEXT)
        rows += [Row("ctx", i + 1, None, old_html[i]) for i in range(h.old_end, end)]
        made.append(HunkView(h.index, rows))
    return made


def files(plan: Plan, page: int = 0) -> list[FileView]:
    """The file views of one page of the plan's items, as a person reads them (outline.py): the source changes
    first, then the held groups."""
    shape = views.outline(plan)
    held = {n: g.key for g in shape.groups for n in g.numbers}
    pairs: list[tuple[int, bytes, bytes]] = []
    page_views: list[FileView] = []
    for i in shape.order[page * PAGE_ITEMS : (page + 1) * PAGE_ITEMS]:
        view, both = _view(plan, i, held.get(i))
        if both is not None:
            pairs.append((len(page_views), *both))
        page_views.append(view)
    shown = highlight.lines(
        [(page_views[k].label, text.decode(errors="replace")) for k, old, new in pairs for text in (old, new)]
    )
    traced = views.provenance(plan) is not None
    numbers = timeline.numbers(plan) if traced else {}
    for n, (k, old, new) in enumerate(pairs):
        old_html, new_html = shown[2 * n], shown[2 * n + 1]
        if len(old_html) != len(views.lines(old)) or len(new_html) != len(views.lines(new)):
            old_html, new_html = _plain(old), _plain(new)
        found = views.hunks_of(old, new)
        page_views[k].hunks = _hunk_views(found, old_html, new_html)
        for hunk, shown_hunk in zip(found, page_views[k].hunks, strict=True) if traced else ():
            shown_hunk.made = timeline.made(plan, plan.todo[page_views[k].id].first, hunk, numbers)
    for view in page_views if traced else ():
        if not view.hunks:  # (who wrote it: each change of a nested repository's)
            view.made = timeline.whole(plan, plan.todo[view.id].changes, numbers)
    return page_views


def _view(plan: Plan, i: int, group: str | None) -> tuple[FileView, tuple[bytes, bytes] | None]:
    """Item `i`'s view, and its two texts when it is shown as hunks."""
    item = plan.todo[i]
    c = item.first
    view = FileView(i, item.label, item.kind, c.status.value, views.fingerprint(item), badges.words(item, group), group)
    safe = views.safe(item) and group is None  # (a mass change's items are all in groups)
    view.default = "apply" if safe else "skip"
    view.held = " ".join(dict.fromkeys(what for what, _ in views.holds(item))) or ("held" if group else "")
    try:
        both = None if item.repository else views.texts(plan, c)
    except views.ChangedError as exc:
        both, view.note = None, exc.message
    if c.merge is not None and not c.merge.clean:
        text = c.merge.text.decode(errors="replace")
        if views.editable(c.merge.text):
            view.three_way = text
        else:  # shown escaped, an edit of it would be the escapes: resolved at the terminal instead
            view.note = views.UNEDITABLE
        return view, None
    if both is None:
        view.note = view.note or views.describe(c) or c.kind
    return view, both


def named(shown: list[FileView]) -> set[str]:
    """The ids of the steps the makers shown on a page name (the timeline lists each of them)."""
    return {step for view in shown for step in view.steps.split()}


def shelves(plan: Plan, shown: list[FileView]) -> list[Shelf]:
    """The held groups of the page that shows `shown`, in the order they are read."""
    found: list[Shelf] = []
    for g in views.outline(plan).groups:
        members = [v for v in shown if v.group == g.key]
        if members:
            found.append(Shelf(g.key, g.reason, len(g.numbers), members))
    return found


def _plain(text: bytes) -> list[Markup]:
    return [escape(ui.visible(line.decode(errors="replace").rstrip("\r\n"))) for line in views.lines(text)]


def decisions(plan: Plan, form: dict[str, list[str]]) -> views.Chosen:
    """The form of the review page as the core's choices on `plan`, the frozen review the page showed: per item
    (by its number in the review, with the hash of all it showed) apply or not — its own choice, or its held
    group's (`g-KEY`: every item of the group the page listed, each still named by number and hash) — the hunks
    taken, an edited merge; the guest's commits if asked."""
    groups = views.groups(plan)
    choices: list[views.Choice] = []
    for key in (k for k in form if k.startswith("d") and k[1:].isdigit() and k[1:].isascii()):
        n = key[1:]
        index = int(n)
        group = groups[index] if index < len(groups) else None
        taken = group is not None and form.get(f"g-{group}", [""])[0] == "apply"  # its group's one choice
        chosen = form.get(f"f{n}", ["skip"])[0] == "apply" or taken
        if not chosen and index < len(groups) and form[key][0] == views.fingerprint(plan.todo[index]):
            continue  # (left: a page that is not this review's is refused all the same)
        edit = form.get(f"m{n}")
        chosen_hunks = {int(h) for h in form.get(f"h{n}", []) if h.isdigit() and h.isascii()}
        choices.append(views.Choice(
            index, form[key][0],
            hunks=chosen_hunks if f"hs{n}" in form else None,
            edit=None if edit is None else edit[0].encode(),
        ))  # fmt: skip
    commits = form.get("commits", [""])[0] == "take"
    return views.decide(plan, choices, commits=commits, again="reload the page")


commits = views.commits  # (the guest's branches and tags, and why they are refused)
counts = views.counts  # (the summary at the top of the page)
