from __future__ import annotations

from vmsandbox.sync.compare import Status, compare, is_git_managed, risk_of
from vmsandbox.sync.tree import DIR, FILE, OTHER, SYMLINK, Entry


def f(digest: str, mode: int = 0o644) -> Entry:
    return Entry(FILE, mode, 1, digest=digest)


def by_path(base: dict[str, Entry], host: dict[str, Entry], guest: dict[str, Entry]) -> dict[str, Status]:
    return {c.path: c.status for c in compare(base, host, guest)}


def test_three_way_statuses() -> None:
    base = {"same": f("a"), "g": f("a"), "both": f("a"), "agree": f("a"), "hostonly": f("a"), "del": f("a")}
    host = {"same": f("a"), "g": f("a"), "both": f("h"), "agree": f("x"), "hostonly": f("h"), "del": f("a")}
    guest = {"same": f("a"), "g": f("g"), "both": f("g"), "agree": f("x"), "hostonly": f("a"), "new": f("n")}
    assert by_path(base, host, guest) == {
        "g": Status.APPLY,
        "both": Status.CONFLICT,
        "agree": Status.SAME,
        "new": Status.APPLY,
        "del": Status.APPLY,
    }


def test_unsafe_entries() -> None:
    guest = {
        "fifo": Entry(OTHER, 0o644),
        "out": Entry(SYMLINK, 0o777, target="/etc/passwd"),
        "d/up": Entry(SYMLINK, 0o777, target="../../x"),
        "d": Entry(DIR, 0o755),
        "d/in": Entry(SYMLINK, 0o777, target="../ok"),
    }
    statuses = by_path({}, {}, guest)
    assert statuses["fifo"] is Status.UNSAFE
    assert statuses["out"] is Status.UNSAFE and statuses["d/up"] is Status.UNSAFE
    assert statuses["d/in"] is Status.APPLY


def test_risky_paths_and_new_exec_bits() -> None:
    for path in (
        ".git/hooks/pre-commit",
        ".git/config",
        "sub/.gitattributes",
        ".envrc",
        ".vscode/tasks.json",
        ".github/workflows/ci.yml",
        ".husky/pre-push",
        ".gitmodules",
        "pkg/.npmrc",
    ):
        assert risk_of(path, None, f("x")), path
    assert risk_of("src/main.py", None, f("x")) is None
    assert risk_of("run.sh", None, f("x", 0o755)) == "newly executable"
    assert risk_of("run.sh", f("x", 0o644), f("y", 0o755)) == "newly executable"
    assert risk_of("run.sh", f("x", 0o755), f("y", 0o755)) == "executable, its content changed"
    assert risk_of("run.sh", f("x", 0o755), f("x", 0o700)) is None  # the same bytes: nothing new runs
    assert risk_of("run.sh", f("x", 0o755), f("y", 0o644)) is None  # no longer executable


def test_git_internals_managed_by_git_are_not_file_changes() -> None:
    assert is_git_managed(".git/objects/ab/cdef") and is_git_managed(".git/refs/heads/main")
    assert is_git_managed(".git/index") and is_git_managed(".git/HEAD")
    assert not is_git_managed(".git/config") and not is_git_managed(".git/hooks/pre-commit")
    base = {".git/config": f("a"), ".git/index": f("i")}
    guest = {".git/config": f("b"), ".git/index": f("j"), ".git/objects/aa/bb": f("o")}
    changes = compare(base, base, guest)
    assert [(c.path, c.risky is not None) for c in changes] == [(".git/config", True)]


def test_mode_change_detected_as_far_as_modes_travel() -> None:
    base = {"x": f("a", 0o644), "w": f("b", 0o664)}
    changes = compare(base, base, {"x": f("a", 0o4755), "w": f("b", 0o666)})
    assert [(c.path, c.kind) for c in changes] == [("x", "mode changed")]  # o+w never travels: no change


def test_a_chained_symlink_is_judged_where_it_leads() -> None:
    guest = {
        "a": Entry(DIR, 0o755),
        "a/b": Entry(DIR, 0o755),
        "a/b/s1": Entry(SYMLINK, 0o777, target=".."),  # = a: inside
        "a/b/s2": Entry(SYMLINK, 0o777, target="s1/../../etc/passwd"),  # text says a/etc/passwd; really ../etc
    }
    statuses = by_path({}, {}, guest)
    assert statuses["a/b/s1"] is Status.APPLY
    assert statuses["a/b/s2"] is Status.UNSAFE


def test_a_symlink_through_a_host_side_link_is_refused() -> None:
    host = {"up": Entry(SYMLINK, 0o777, target="..")}  # the user's own link, already on the host
    guest = {"up": Entry(SYMLINK, 0o777, target=".."), "x": Entry(SYMLINK, 0o777, target="up/secret")}
    changes = {c.path: c for c in compare({"up": host["up"]}, host, guest)}
    assert changes["x"].status is Status.UNSAFE
    assert "leaves the project" in changes["x"].notes[0]


def test_guest_names_cannot_inject_markup_or_escape_sequences() -> None:
    from vmsandbox import ui

    hostile = "x[link=file:///etc]y\x1b]8;;http://evil\x07z\x1b[2J"
    shown = ui.printable(hostile)
    assert "\x1b" not in shown and "\x07" not in shown
    assert "\\[link" in shown  # markup escaped
    assert ui.printable("tab\tand\nnewline", markup=False) == "tab\tand\nnewline"


def test_applied_setuid_file_is_not_a_conflict_afterwards() -> None:
    guest = {"s.sh": f("x", 0o4755)}
    host_after_apply = {"s.sh": f("x", 0o755)}  # bits dropped on the way
    assert compare({}, host_after_apply, guest)[0].status is Status.SAME
