"""One way to walk beneath a directory (confine.beneath): every name plain and beneath, no link followed in any
component, writes beside and renamed; and every reader and writer that walks a project, a mirror or a config
directory answers a hostile name the same way (they used to disagree on `..`)."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.unit import another
from vmsandbox import paths, trust
from vmsandbox.confine import beneath, cases
from vmsandbox.errors import VmsandboxError
from vmsandbox.image import blueprint
from vmsandbox.session.running import logins
from vmsandbox.sync.git import refs
from vmsandbox.sync.land import write
from vmsandbox.sync.review import holds
from vmsandbox.sync.tree import manifest

SECRET = b"outside the root\n"


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    """A root with a file, a directory, links in and out, and a secret file beside the root (its sibling)."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "d" / "e").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret").write_bytes(SECRET)
    (root / "d" / "e" / "f").write_text("inside\n")
    (root / "in").symlink_to("d")  # leads inside
    (root / "out").symlink_to(outside)  # leads out
    (root / "d" / "up").symlink_to("../..")  # leads out through `..`
    return root, outside


@pytest.mark.parametrize("name", ["..", ".", "a/../b", "a/./b", "a//b", "/etc/passwd", "a/", "a\0b", "d/e/.."])
def test_a_name_that_is_not_plainly_beneath_is_refused(name: str) -> None:
    with pytest.raises(beneath.Outside):
        beneath.split(name)


def test_the_root_itself_is_the_empty_name(layout: tuple[Path, Path]) -> None:
    root, _ = layout
    assert beneath.split("") == []
    with beneath.Root.open(root) as top:
        fd = top.opendir("")
        try:
            assert os.fstat(fd).st_ino == root.stat().st_ino
        finally:
            os.close(fd)


@pytest.mark.parametrize("through", ["in", "out", "d/up"])
def test_a_link_in_any_component_is_never_followed_whether_it_leads_in_or_out(
    layout: tuple[Path, Path], through: str
) -> None:
    root, _ = layout
    with beneath.Root.open(root) as top:
        with pytest.raises(OSError) as raised:
            top.opendir(f"{through}/e")
        assert raised.value.errno in (errno.ELOOP, errno.ENOTDIR)
        assert raised.value.filename == through  # the path up to the component refused
        assert top.read(f"{through}/secret", limit=100) is None
        assert top.read(f"{through}/e/f", limit=100) is None
        assert top.lstat(f"{through}/e") is None
        assert top.read("d/e/f", limit=100) == b"inside\n"


def test_the_last_component_is_never_followed_either(layout: tuple[Path, Path]) -> None:
    root, _ = layout
    with beneath.Root.open(root) as top:
        assert top.open_regular("out") is None
        st = top.lstat("out")
        assert st is not None and stat.S_ISLNK(st.st_mode)
        assert top.readlink("out") == str(layout[1])
        assert top.readlink("d/e/f") is None


def test_a_missing_component_names_where_it_stopped(layout: tuple[Path, Path]) -> None:
    root, _ = layout
    with beneath.Root.open(root) as top, pytest.raises(FileNotFoundError) as raised:
        top.opendir("d/nope/deeper")
    assert raised.value.filename == "d/nope"


def test_the_top_is_opened_once_and_a_link_there_only_when_asked(layout: tuple[Path, Path], tmp_path: Path) -> None:
    root, _ = layout
    (tmp_path / "alias").symlink_to(root)
    with pytest.raises(OSError) as raised:
        beneath.Root.open(tmp_path / "alias")
    assert raised.value.errno in (errno.ELOOP, errno.ENOTDIR)
    with beneath.Root.open(tmp_path / "alias", follow=True) as top:
        assert top.read("d/e/f", limit=100) == b"inside\n"


def test_a_fifo_or_a_large_file_is_not_read(layout: tuple[Path, Path]) -> None:
    root, _ = layout
    os.mkfifo(root / "fifo")
    (root / "big").write_bytes(b"x" * 101)
    with beneath.Root.open(root) as top:
        assert top.read("fifo", limit=100) is None  # never blocks: opened non-blocking, then refused
        assert top.read("big", limit=100) is None
        assert top.read("big", limit=101) == b"x" * 101


def test_replace_writes_beside_and_renames_and_leaves_nothing_when_it_fails(layout: tuple[Path, Path]) -> None:
    root, _ = layout
    made: list[tuple[int, bool]] = []

    def writing(data: bytes) -> Callable[[int, str], None]:
        def make(fd: int, name: str) -> None:
            out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=fd)
            os.write(out, data)
            os.close(out)
            if data == b"fail":
                raise RuntimeError("the source changed")

        return make

    with beneath.Root.open(root) as top:
        top.replace("n/m/file", writing(b"one"), mode=0o700, each=lambda fd, new: made.append((fd, new)))
        assert [new for _fd, new in made] == [True, True]
        assert (root / "n" / "m" / "file").read_bytes() == b"one"
        with pytest.raises(RuntimeError):
            top.replace("n/m/file", writing(b"fail"))
        assert (root / "n" / "m" / "file").read_bytes() == b"one"
        assert sorted(p.name for p in (root / "n" / "m").iterdir()) == ["file"]
        with pytest.raises(OSError):  # never through a link on the way
            top.replace("out/planted", writing(b"x"), mode=0o700)
        top.remove("n/m/file")
    assert sorted(p.name for p in layout[1].iterdir()) == ["secret"]
    assert list((root / "n" / "m").iterdir()) == []


def test_links_lists_every_link_beneath_and_never_descends_through_one(layout: tuple[Path, Path]) -> None:
    root, outside = layout
    (outside / "far").symlink_to("/etc")  # beyond the link `out`: never listed
    (root / "d" / "e" / "deep").symlink_to("../../in/e/f")
    with beneath.Root.open(root) as top:
        assert top.links() == {"in": "d", "out": str(outside), "d/up": "../..", "d/e/deep": "../../in/e/f"}
        walked = {rel: sorted(dirs + files) for rel, dirs, files, _fd in top.walk()}
    assert walked == {"": ["d", "in", "out"], "d": ["e", "up"], "d/e": ["deep", "f"]}


def test_names_compare_as_the_file_system_compares_them(layout: tuple[Path, Path], tmp_path: Path) -> None:
    root, _ = layout
    (root / "Readme").write_text("r")
    with beneath.Root.open(root) as top:
        assert not top.folds()  # this machine's file system tells `Readme` from `rEADME`
    # a folding stand-in: the name's other case is the same file, as a case-insensitive file system shows it
    folding = tmp_path / "folding"
    folding.mkdir()
    (folding / "Readme").write_text("r")
    os.link(folding / "Readme", folding / "rEADME")
    with beneath.Root.open(folding) as top:
        assert top.folds()
    empty = tmp_path / "Empty"  # nothing in it to ask: its own name in its parent is asked
    empty.mkdir()
    (tmp_path / "eMPTY").symlink_to("Empty")  # another file under the other case: not the same one
    with beneath.Root.open(empty) as top:
        assert not top.folds()


def test_a_name_the_guest_chose_cannot_make_a_folding_file_system_say_no(tmp_path: Path) -> None:
    """(Audit: the first name of the top with a case used to decide. On NTFS over CIFS `0ß` and `0SS` are two names,
    so a guest's `0ß` listed first said "no folding" where `Readme` and `rEADME` are one file.) Only names of
    ASCII letters are asked; the stand-in folds them as such a file system does (a hard link)."""
    top = tmp_path / "1"  # (its own name has no letter to ask)
    top.mkdir()
    (top / "Readme").write_text("r")
    os.link(top / "Readme", top / "rEADME")
    for n in range(200):  # a name of the guest's that the directory lists before both (its order is the hash's)
        guests = f"{n}\u00df"
        (top / guests).write_text("g")
        listed = [p.name for p in top.iterdir() if p.name.swapcase() != p.name]
        if listed[0] == guests:
            break
        (top / guests).unlink()
    assert listed[0] == guests and not (top / guests.swapcase()).exists()
    with beneath.Root.open(top) as root:
        assert root.folds()


def test_a_top_with_no_name_to_ask_asks_a_name_of_its_own_and_leaves_none(tmp_path: Path) -> None:
    top = tmp_path / "2"
    top.mkdir()
    (top / "0\u00df").write_text("g")  # (no ASCII letter: not asked)
    with beneath.Root.open(top) as root:
        assert not root.folds()  # this machine's file system tells the made name from its other case
    assert [p.name for p in top.iterdir()] == ["0\u00df"]


def test_ext4s_casefold_flag_says_the_directory_folds(
    layout: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """(This machine's kernel has no CONFIG_UNICODE: a casefold ext4 does not mount here; the flag's answer is
    stood in for.)"""
    root, _ = layout
    asked: list[int] = []

    def ioctl(fd: int, request: int, arg: bytes) -> bytes:
        asked.append(request)
        return struct.pack("i", cases.FS_CASEFOLD_FL | 0x80000) + bytes(4)

    monkeypatch.setattr(fcntl, "ioctl", ioctl)
    with beneath.Root.open(root) as top:
        assert top.folds()
    assert asked == [cases.FS_IOC_GETFLAGS]


# ---------------------------------------------------------------------- every walker answers alike

HOSTILE = ["../outside/secret", "d/../../outside/secret", "/outside/secret", "out/secret", "d/up/outside/secret"]


@pytest.mark.parametrize("name", HOSTILE)
def test_every_reader_reaches_nothing_outside(layout: tuple[Path, Path], name: str) -> None:
    root, _ = layout
    assert write.read_nofollow(root, name, limit=100) is None  # land.write (the review's and the apply's reads)
    assert write.open_nofollow(root, name) is None
    assert not holds.is_binary(root, name)  # review.holds
    assert manifest.entry_under(root, name) is None  # tree.manifest (the host's side of a review, the mirror's delta)
    assert manifest.scan_under(root, name) == {}
    parent = name.rpartition("/")[0]
    assert manifest.open_dir_under(root, parent) is None


@pytest.mark.parametrize("name", HOSTILE)
def test_every_writer_refuses_to_write_outside(layout: tuple[Path, Path], name: str) -> None:
    root, outside = layout
    owner = write.Owner(os.getuid(), os.getgid())
    with pytest.raises((write.UnsafePathError, FileNotFoundError)):
        write.write_symlink(root, name.replace("secret", "planted"), "x", owner)
    with pytest.raises((write.UnsafePathError, FileNotFoundError)):
        write.make_dir(root, name.replace("secret", "planted"), 0o755, owner)
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]


def test_a_project_file_is_read_only_plainly_beneath_its_project(layout: tuple[Path, Path]) -> None:
    root, outside = layout
    (outside / ".vmsandbox.yaml").write_text("cpus: 2\n")
    with pytest.raises(VmsandboxError, match="not in the project"):  # trust: `..` used to be walked
        trust.read_project_file(root / "d" / ".." / ".." / "outside" / ".vmsandbox.yaml", root)
    with pytest.raises(VmsandboxError, match="is a symlink"):
        trust.read_project_file(root / "out" / ".vmsandbox.yaml", root)
    assert trust.read_project_file(root / "nope" / ".vmsandbox.yaml", root) is None


def test_refs_are_read_beneath_the_repository(layout: tuple[Path, Path]) -> None:
    root, outside = layout
    gitdir = root / ".git"
    (gitdir / "refs").mkdir(parents=True)
    (outside / "heads").mkdir()
    (outside / "heads" / "stolen").write_text("a" * 40 + "\n")
    (gitdir / "refs" / "heads").symlink_to(outside / "heads")
    (gitdir / "refs" / "tags").mkdir()
    (gitdir / "refs" / "tags" / "v1").write_text("b" * 40 + "\n")
    (gitdir / "packed-refs").symlink_to(outside / "heads" / "stolen")
    assert refs.read_refs(gitdir) == {"refs/tags/v1": "b" * 40}


def test_kept_logins_are_read_and_written_beneath_the_config(tmp_path: Path) -> None:
    claude = blueprint.load("claude")
    paths.config_subdir(paths.config_dir())
    assert logins.keep(claude, {".claude/.credentials.json": b"{}"}) == [".claude/.credentials.json"]
    assert logins.kept(claude) == [".claude/.credentials.json"]
    with pytest.raises(VmsandboxError, match="refusing the login file path"):
        logins.keep(claude, {"../../escape": b"{}"})
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / ".credentials.json").write_text("root's")
    store = logins.store("claude")
    (store / ".claude" / ".credentials.json").unlink()
    (store / ".claude").rmdir()
    (store / ".claude").symlink_to(victim)  # a link planted in the store: read through, nothing comes back
    assert logins.kept(claude) == []
    with pytest.raises(VmsandboxError, match="not a directory of your config"):
        logins.keep(claude, {".claude/.credentials.json": b"{}"})
    assert (victim / ".credentials.json").read_text() == "root's"


def test_push_copies_into_the_baseline_beneath_it(tmp_path: Path) -> None:
    """The host made a directory a link (to a directory of root's, say): push copies the link into the baseline,
    and then the deletion of what the directory held removes nothing through it."""
    from vmsandbox.sync.inward import push

    project, baseline, victim = tmp_path / "project", tmp_path / "baseline", tmp_path / "victim"
    (baseline / "a").mkdir(parents=True)
    (baseline / "a" / "x").write_text("old")
    victim.mkdir()
    (victim / "x").write_text("root's own")
    project.mkdir()
    (project / "a").symlink_to(victim)
    (project / "new").mkdir()
    (project / "new" / "f").write_text("new")
    for rel in ("a", "a/x", "new", "new/f"):  # as push takes them: in path order
        push._copy_entry(project, baseline, rel)
    assert (baseline / "a").readlink() == victim
    assert (victim / "x").read_text() == "root's own"
    assert (baseline / "new" / "f").read_text() == "new"
    assert sorted(p.name for p in baseline.iterdir()) == ["a", "new"]


def test_remove_takes_a_directory_and_what_it_holds_never_through_a_link(layout: tuple[Path, Path]) -> None:
    root, outside = layout
    (root / "d" / "e" / "far").symlink_to(outside)
    with beneath.Root.open(root) as top:
        top.remove("out")  # the link, not what it leads to
        top.remove("d")  # with the links inside it
        with pytest.raises(OSError):
            top.remove("in/e")  # not beneath: `in` is a link
    assert sorted(p.name for p in root.iterdir()) == ["in"]
    assert (outside / "secret").read_bytes() == SECRET


# ---------------------------------------------------------------------- what cannot be read is not known

HERE = Path()  # (the tree as the other account names it: it is run in it)


@pytest.fixture
def hidden(tmp_path: Path) -> Path:
    """A tree whose `a/d` its owner may enter but not list (mode 0100), with a link in it, owned by the account
    the checks run as (nobody, under root)."""
    top = tmp_path / "tree"
    (top / "a" / "d").mkdir(parents=True)
    (top / "a" / "d" / "x").symlink_to("../../..")
    (top / "a" / "w").symlink_to("d")
    another.owned(top)
    (top / "a" / "d").chmod(0o100)
    return top


def test_a_directory_that_cannot_be_listed_is_not_known_never_empty(hidden: Path) -> None:
    """(The audit's F2: `links()` passed over it, the host's side of a review read nothing there, so a later
    change made the link in it lead out unseen.)"""

    def look() -> object:
        found: list[object] = []
        with beneath.Root.open(HERE) as top:
            asked = (top.links, lambda: list(top.walk()), lambda: manifest.scan(HERE),
                     lambda: manifest.scan_under(HERE, "a"), lambda: manifest.entry_under(HERE, "a/d/x"))  # fmt: skip
            for ask in asked:
                try:
                    ask()
                    found.append("read")
                except beneath.Unreadable as exc:
                    found.append([exc.rel, exc.message, exc.hint])
        found.append(
            [
                None if (e := manifest.entry_under(HERE, p)) is None else e.as_dict()
                for p in ("a/w/x", "a/nope/x", "a/d")
            ]
        )
        return found

    said = another.run_as_another(look, hidden)
    assert isinstance(said, list), said
    *refused, nothing = said
    assert nothing == [
        None,
        None,
        {"kind": "dir", "mode": 0o100, "size": 0},
    ]  # (through a link, missing; the dir itself)
    assert len(refused) == 5
    for said in refused:
        assert isinstance(said, list), said
        rel, message, hint = said
        assert rel == "a/d"
        assert message == "a/d cannot be read (Permission denied): what it holds is not known"
        assert hint == "make it readable for you (`chmod u+rwx 'a/d'`), then try again"


def test_the_links_of_a_tree_deeper_than_the_descriptors_left_are_not_known(tmp_path: Path) -> None:
    """(`links()` holds a descriptor per level: past the limit it used to pass over the rest without a word.)"""
    top = tmp_path / "tree"
    deep = top.joinpath(*["d"] * 40)
    deep.mkdir(parents=True)
    (deep / "x").symlink_to("../" * 41)
    (top / "shallow").symlink_to("d")
    another.owned(top)

    def look() -> object:
        with beneath.Root.open(HERE) as root:
            return sorted(root.links())

    assert another.run_as_another(look, top) == ["d/" * 40 + "x", "shallow"]  # (with descriptors enough)
    said = another.run_as_another(look, top, open_files=len(list(Path("/proc/self/fd").iterdir())) + 16)
    assert isinstance(said, list) and said[:2] == ["raised", "Unreadable"], said
    assert "cannot be read (Too many open files): what it holds is not known" in said[2]
