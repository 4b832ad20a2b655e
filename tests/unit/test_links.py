"""Where a link leads in the tree as it will be (confine.resolve, sync.tree.final, review.risk.judge_links): every
link of both sides followed, a component nobody has unknown (not a directory), links already on the host judged
again when a change passes through them, and names compared as the project's file system compares them."""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.unit import another
from vmsandbox.confine import beneath, resolve
from vmsandbox.confine.resolve import DIR, LINK, OTHER, Node, Reach
from vmsandbox.sync.land import write
from vmsandbox.sync.review import plan
from vmsandbox.sync.review.threeway import Change, Status, compare
from vmsandbox.sync.tree import manifest, views
from vmsandbox.sync.tree.manifest import Entry

D = Entry(manifest.DIR, 0o755)
F = Entry(manifest.FILE, 0o644, 1, digest="0" * 64)


def link(target: str) -> Entry:
    return Entry(manifest.SYMLINK, 0o777, target=target)


def leads(at: str, target: str, nodes: Mapping[str, Node]) -> resolve.Verdict:
    return resolve.leads(at, target, lambda key: [nodes.get(key)])


# ---------------------------------------------------------------------- the resolver's rules


@pytest.mark.parametrize(
    ("at", "target", "nodes", "reach"),
    [
        ("a", "..", {}, Reach.OUT),  # above the top
        ("d/a", "../../x", {"d": Node(DIR)}, Reach.OUT),
        ("a", "/etc/passwd", {}, Reach.OUT),  # absolute
        ("x", "abs/etc", {"abs": Node(LINK, "/")}, Reach.OUT),  # absolute through a link
        ("l1", "l2/x", {"l1": Node(LINK, "l2/x"), "l2": Node(LINK, "l1/x")}, Reach.OUT),  # a loop
        ("d/s", "s1/../../etc", {"d": Node(DIR), "d/s1": Node(LINK, "e"), "d/e": Node(DIR)}, Reach.INSIDE),
        ("d/s", "s1/../../../etc", {"d": Node(DIR), "d/s1": Node(LINK, "..")}, Reach.OUT),  # a link in the middle
        ("s", "s1", {"s1": Node(LINK, "../x")}, Reach.OUT),  # a link as the last component
        ("a", "b", {}, Reach.INSIDE),  # dangling, inside
        ("a", "b/c", {"b": Node(DIR)}, Reach.INSIDE),
        ("a", "x/..", {}, Reach.INSIDE),  # x nobody has: unresolved, but `..` after it stays inside
        ("w/L", "x/../../..", {"w": Node(DIR)}, Reach.OUT_ONCE_MADE),  # out once x is made
        ("a", "f/../..", {"f": Node(OTHER)}, Reach.OUT_ONCE_MADE),  # a file in the middle: unresolved too
    ],
)
def test_the_resolvers_rules(at: str, target: str, nodes: dict[str, Node], reach: Reach) -> None:
    assert leads(at, target, nodes).reach is reach


def test_a_component_nobody_has_is_unresolved_not_a_directory() -> None:
    found = leads("p/L", "x/../y", {"p": Node(DIR)})
    assert (found.reach, found.unresolved) == (Reach.INSIDE, "p/x")
    assert leads("p/L", "y/z", {"p": Node(DIR), "p/y": Node(DIR)}).unresolved is None
    assert leads("p/L", "y", {"p": Node(DIR)}).unresolved is None  # the last component may be missing
    assert {"p/x", "p/y"} <= found.through


def test_every_choice_is_followed() -> None:
    choices = {
        "up": [Node(DIR), Node(LINK, "..")],
        "d": [Node(DIR)],
    }  # a directory on one side, a link out on the other
    found = resolve.leads("x", "up/y", lambda key: choices.get(key, [None]))
    assert found.reach is Reach.OUT and found.why is not None and "above the project" in found.why
    assert resolve.leads("x", "d/y", lambda key: choices.get(key, [None])).reach is Reach.INSIDE


def test_names_fold_where_the_file_system_folds() -> None:
    nodes = {"x": Node(LINK, "..")}
    assert resolve.leads("L", "X/y", lambda key: [nodes.get(key)]).reach is Reach.INSIDE  # X is nobody's
    folded = {resolve.fold(k): v for k, v in nodes.items()}
    got = resolve.leads("L", "X/y", lambda key: [folded.get(key)], name=resolve.fold)
    assert got.reach is Reach.OUT
    assert resolve.fold("STRASSE") == resolve.fold("straße") and resolve.fold("É") == resolve.fold("e\u0301")


def _random_tree(rng: random.Random, root: Path) -> list[str]:
    """A small tree on disk of directories, files and links (relative and absolute, in and out, dangling,
    chained); its links' paths."""
    names = ["a", "b", "c"]
    dirs = [""]
    made: list[str] = []
    for _ in range(rng.randint(6, 16)):
        parent = rng.choice(dirs)
        path = f"{parent}/{rng.choice(names)}".lstrip("/")
        if (root / path).exists() or (root / path).is_symlink():
            continue
        kind = rng.random()
        if kind < 0.35 and path.count("/") < 3:
            (root / path).mkdir()
            dirs.append(path)
        elif kind < 0.5:
            (root / path).write_text("f")
        else:
            parts = [rng.choice([*names, "..", ".", "a/b"]) for _ in range(rng.randint(1, 4))]
            (root / path).symlink_to("/".join(parts) if rng.random() > 0.05 else "/" + "/".join(parts))
            made.append(path)
    return made


def _nodes(root: Path) -> dict[str, Node]:
    found = {}
    for path, e in manifest.scan(root).items():
        kind = LINK if e.kind == manifest.SYMLINK else DIR if e.kind == manifest.DIR else OTHER
        found[path] = Node(kind, e.target)
    return found


def _kernels(path: Path) -> str | None:
    """Where the kernel resolves path (None: it cannot today: dangling, a loop, a file in the middle)."""
    try:
        fd = os.open(path, os.O_PATH)
    except OSError:
        return None
    try:
        return str(Path(f"/proc/self/fd/{fd}").readlink())
    finally:
        os.close(fd)


def _inside(root: Path, real: str) -> bool:
    return Path(real) == root or root in Path(real).parents


def test_the_resolver_agrees_with_the_kernel_on_trees_that_exist(tmp_path: Path) -> None:
    """Over hundreds of random trees on disk: a link the kernel resolves outside the root is never judged inside;
    one the kernel resolves has no unresolved component; one judged inside with every component there resolves
    (as far as it goes) inside."""
    rng = random.Random(57)  # noqa: S311 - a fixed sample of trees, not a secret
    resolved = outside = 0
    for n in range(300):
        root = tmp_path / f"t{n}" / "root"
        root.mkdir(parents=True)
        made = _random_tree(rng, root)
        nodes = _nodes(root)
        for path in made:
            target = str((root / path).readlink())
            verdict = leads(path, target, nodes)
            shown = (path, target, verdict)
            real = _kernels(root / path)
            if real is not None:
                resolved += 1
                assert verdict.unresolved is None, shown
                if not _inside(root, real):
                    outside += 1
                    assert verdict.reach is not Reach.INSIDE, shown
            if verdict.reach is Reach.INSIDE and verdict.unresolved is None:
                assert _inside(root, os.path.realpath(root / path)), shown
    assert resolved > 150 and outside > 30  # (the trees hold both kinds)


# ---------------------------------------------------------------------- the judge of a review (issue 57)

DEEP = "p/q/r/s/t/u/v/w"
LEAK = "x/../../../../../../../../../etc/passwd"  # through x, which nobody has yet
UP = "../../../../../../../.."  # from DEEP: the project's top


def dirs(path: str) -> dict[str, Entry]:
    parts = path.split("/")
    return {"/".join(parts[: i + 1]): D for i in range(len(parts))}


def pull(host: dict[str, Entry], guest: dict[str, Entry], *, fold: bool = False) -> dict[str, Change]:
    """The review of a guest that holds `guest` over the session's baseline (DEEP's directories), against `host`."""
    baseline = dirs(DEEP)
    return {c.path: c for c in compare(baseline, host, {**baseline, **guest}, fold=fold)}


def test_a_link_through_what_nobody_has_waits_for_a_person() -> None:
    first = pull(dirs(DEEP), {f"{DEEP}/L": link(LEAK)})[f"{DEEP}/L"]
    assert first.status is Status.APPLY and first.risky is not None
    assert f"{DEEP}/x" in first.risky and "not known" in first.risky
    assert plan.Item(first.path, (first,)).quarantined  # `--yes` leaves it: only an explicit take applies it


def test_two_pulls_each_apply_never_make_a_link_that_leads_out() -> None:
    """Issue 57: pull 1 lands L (a person took it), pull 2 adds x: x is refused, naming L."""
    host = {**dirs(DEEP), f"{DEEP}/L": link(LEAK)}
    second = pull(host, {f"{DEEP}/L": link(LEAK), f"{DEEP}/x": link(UP)})
    assert second[f"{DEEP}/L"].status is Status.SAME
    x = second[f"{DEEP}/x"]
    assert x.status is Status.UNSAFE
    assert f"the link {DEEP}/L -> {LEAK!r} already in the project leads out" in x.notes[0]


def test_the_other_order_and_one_pull_refuse_the_link_itself() -> None:
    host = {**dirs(DEEP), f"{DEEP}/x": link(UP)}  # pull 1 landed x: alone it leads to the project's top
    assert pull(dirs(DEEP), {f"{DEEP}/x": link(UP)})[f"{DEEP}/x"].status is Status.APPLY
    later = pull(host, {f"{DEEP}/x": link(UP), f"{DEEP}/L": link(LEAK)})[f"{DEEP}/L"]
    assert later.status is Status.UNSAFE and "leaves the project" in later.notes[0]
    both = pull(dirs(DEEP), {f"{DEEP}/x": link(UP), f"{DEEP}/L": link(LEAK)})
    assert both[f"{DEEP}/L"].status is Status.UNSAFE
    assert both[f"{DEEP}/x"].status is Status.APPLY


def test_on_a_file_system_that_folds_one_pull_is_refused() -> None:
    """`x` is `X` there: the guest's X (a link to the top) and L through x, in one pull."""
    guest = {f"{DEEP}/X": link(UP), f"{DEEP}/L": link(LEAK)}
    folding = pull(dirs(DEEP), guest, fold=True)
    assert folding[f"{DEEP}/L"].status is Status.UNSAFE
    plain = pull(dirs(DEEP), guest)  # where it does not fold, x is nobody's: L waits for a person
    assert plain[f"{DEEP}/L"].status is Status.APPLY and plain[f"{DEEP}/L"].risky is not None
    # and the two pulls, where it folds: L on the host, then X
    host = {**dirs(DEEP), f"{DEEP}/L": link(LEAK)}
    second = pull(host, {f"{DEEP}/L": link(LEAK), f"{DEEP}/X": link(UP)}, fold=True)
    assert second[f"{DEEP}/X"].status is Status.UNSAFE and f"{DEEP}/L" in second[f"{DEEP}/X"].notes[0]
    assert pull(host, {f"{DEEP}/L": link(LEAK), f"{DEEP}/X": link(UP)})[f"{DEEP}/X"].status is Status.APPLY


def test_a_change_that_makes_a_host_link_lead_out_is_refused() -> None:
    base = {"d1": D, "d1/d2": D, "a": link("d1/d2"), "L": link("a/../../etc")}  # L: d1/d2/.. /.. = the top
    for guest, why in (({"a": D}, "a directory where a link was"), ({}, "a link removed")):
        baseline = dict(base)
        changes = {c.path: c for c in compare(baseline, base, {k: v for k, v in base.items() if k != "a"} | guest)}
        assert changes["a"].status is Status.UNSAFE, why
        assert "the link L -> 'a/../../etc'" in changes["a"].notes[0], why


def test_a_host_link_that_leads_out_already_is_the_hosts_own() -> None:
    """The user's `L -> m/../../sibling` leads out today: a guest change to m does not make it so."""
    base = {"d": D, "e": D, "m": link("d"), "L": link("m/../../sibling")}
    changes = {c.path: c for c in compare(base, base, {**base, "m": link("e")})}
    assert changes["m"].status is Status.APPLY


def test_the_host_is_walked_for_its_links_only_when_a_change_moves_one() -> None:
    asked: list[int] = []

    def host_links() -> dict[str, str]:
        asked.append(1)
        return {}

    base = {"d": D}
    compare(base, base, {**base, "d/f": F}, host_links=host_links)
    assert asked == []
    compare(base, base, {**base, "d/l": link("f")}, host_links=host_links)
    assert asked == [1]


# ---------------------------------------------------------------------- what the host cannot read (audit F2)

HERE = Path()  # (the project as the other account names it: it is run in it)


def _pulls(hidden_by: str) -> object:
    """The audit's three pulls, each taken as `--yes` takes them, by an account that is not root: the project has
    `a/b/c/w -> e`; pull 1 adds `a/b/c/d/x -> ../w/../../../..` (inside); then `a/b/c/d` is made search-only (by
    the guest's pull 2, or by the person's own hand); pull 3 retargets w to `../../..`, inside by itself, which
    would make x lead four levels above the project. What each pull did, and where x leads in the end."""
    project = HERE / "home" / "u" / "proj"
    baseline = manifest.scan(project)
    guest = dict(baseline)
    owner = write.Owner(os.getuid(), os.getgid())
    said: list[list[object]] = []

    def pull() -> None:
        with beneath.Root.open(project, follow=True) as top:
            found = compare(baseline, views.Lookup(project), guest, host_links=top.links, fold=top.folds())
        for c in (c for c in found if c.status is not Status.SAME):
            taken = c.status in (Status.APPLY, Status.MERGED) and not plan.Item(c.path, (c,)).quarantined
            said.append([c.path, c.status.value, c.notes[:1], taken])
            if taken:
                write.apply_one(project, HERE / "nothing", c, owner)

    guest["a/b/c/d/x"] = link("../w/../../../..")
    pull()
    del guest["a/b/c/d/x"]
    if hidden_by == "guest":
        guest["a/b/c/d"] = Entry(manifest.DIR, 0o100)
    pull()
    if hidden_by == "person":
        (project / "a/b/c/d").chmod(0o100)
    guest["a/b/c/w"] = link("../../..")
    pull()
    return [said, os.path.relpath(os.path.realpath(project / "a/b/c/d/x"), project)]


@pytest.mark.parametrize("hidden_by", ["guest", "person"])
def test_a_directory_the_person_cannot_list_hides_no_link_from_the_judge(tmp_path: Path, hidden_by: str) -> None:
    """Without root the kernel says what may be read: a directory made search-only used to read as empty to the
    judge, and w landed. Now a directory from the guest always lands with its owner's rwx, and one the person made
    so is not known: the change is refused, with what to do."""
    top = tmp_path / "tree"
    for d in ("a/b/c/d", "a/b/c/e"):
        (top / "home/u/proj" / d).mkdir(parents=True)
    for d in ("a", "a/b", "a/b/c", "a/b/c/d", "a/b/c/e"):
        (top / "home/u/proj" / d).chmod(0o755)  # (whatever the umask)
    (top / "home/u/proj/a/b/c/w").symlink_to("e")
    another.owned(top)
    answer = another.run_as_another(lambda: _pulls(hidden_by), top)
    assert isinstance(answer, list), answer
    said, x_leads_to = answer
    assert not x_leads_to.startswith(".."), said  # x stays inside the project
    w = [s for s in said if s[0] == "a/b/c/w"]
    assert len(w) == 1 and w[0][1] == "unsafe" and w[0][3] is False, said
    if hidden_by == "guest":  # the guest's 0100 landed as 0700: the judge sees x and names it
        assert ["a/b/c/d", "apply", [], True] in said
        assert "the link a/b/c/d/x -> '../w/../../../..' already in the project leads out" in w[0][2][0]
        assert (top / "home/u/proj/a/b/c/d").stat().st_mode & 0o777 == 0o700
    else:
        (why,) = w[0][2]
        assert why.startswith("not written: whether it makes a link already in the project lead out is not known")
        assert "a/b/c/d cannot be read (Permission denied)" in why and "chmod u+rwx" in why


def test_a_change_whose_host_side_cannot_be_read_is_refused_with_what_to_do(tmp_path: Path) -> None:
    top = tmp_path / "tree"
    (top / "d").mkdir(parents=True)
    (top / "d" / "f").write_text("the person's")
    another.owned(top)
    (top / "d").chmod(0o100)

    def look() -> object:
        with beneath.Root.open(HERE) as top:
            found = compare({"d": D}, views.Lookup(HERE), {"d": D, "d/f": F, "n": link("d/f")}, host_links=top.links)
        return [[c.path, c.status.value, c.notes] for c in found]

    said = another.run_as_another(look, top)
    assert said == [
        ["d/f", "unsafe", ["not written: d cannot be read (Permission denied): what it holds is not known; "
                           "make it readable for you (`chmod u+rwx 'd'`), then try again"]],
        ["n", "unsafe", ["not written: where the link leads is not known, as d cannot be read (Permission denied): "
                         "what it holds is not known; make it readable for you (`chmod u+rwx 'd'`), then try again"]],
    ], said  # fmt: skip
