"""The guest's commits reviewed like its files: every path a fetched commit touches is classed by the same rules
as the working tree (risky names and modes; paths the project ignores; binary content), and a branch or tag
whose commits touch such a path is not created unless asked (`--include-risky`, `--include-ignored`,
`--include-binary`: the same choices as for files).

A commit "Fix typo in README" that adds an agent hook, a git-hook-manager script and `.envrc` is as dangerous as
those files in the working tree: the user's next `git merge` puts them in place. So the guest's refs are first
fetched into a staging namespace of the project (`refs/vmsandbox-incoming/SESSION/…`, objects only: nothing
checks them out), each staged ref's new commits (those no branch, tag or remote-tracking ref has) are listed
with `git diff-tree` — against every parent of a merge, so an evil merge shows too — and only refs whose
commits touch nothing held back are promoted to `refs/remotes/vmsandbox-SESSION/…`. The others stay staged for
the outbox's bundle (then go): the flags named in the review's line promote them. Ignored means what the
host's repository ignores (`git check-ignore` over its own ignore files, as for files); binary means what git's
numstat calls binary (a NUL in the first 8,000 bytes: the working tree's test).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vmsandbox.sync.git import refs, repository
from vmsandbox.sync.review.risk import risky_name
from vmsandbox.sync.review.take import Take

MAX_COMMITS = 1000  # more new commits than this on one ref: it is not reviewed, so it is held
_OID = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?\Z")
_META = re.compile(r"^:(\d{6}) (\d{6}) [0-9a-f]+ [0-9a-f]+ ([A-Z])\d*\Z")


class Kind:
    RISKY = "risky"
    IGNORED = "ignored"
    BINARY = "binary"


FLAGS = {Kind.RISKY: "--include-risky", Kind.IGNORED: "--include-ignored", Kind.BINARY: "--include-binary"}


@dataclass(frozen=True)
class Touch:
    path: str
    why: str
    kind: str = Kind.RISKY


@dataclass(frozen=True)
class RefReview:
    name: str  # below the prefix: `main`, `tags/v1`
    commits: int
    risky: tuple[Touch, ...]  # every touch that holds the ref back unless taken (risky, ignored or binary)

    def holds(self, take: Take) -> tuple[Touch, ...]:
        taken = {Kind.RISKY: take.risky, Kind.IGNORED: take.ignored, Kind.BINARY: take.binary}
        return tuple(t for t in self.risky if not taken[t.kind])

    def line(self, session: str, take: Take | None = None) -> str:
        held = self.holds(take or Take()) or self.risky
        shown = "; ".join(f"{t.path} ({t.why})" for t in held[:5]) + (" …" if len(held) > 5 else "")
        flags = " ".join(FLAGS[k] for k in (Kind.RISKY, Kind.IGNORED, Kind.BINARY) if any(t.kind == k for t in held))
        return (
            f"commits of {self.name} ({self.commits} new) touch {shown}: not fetched into "
            f"{repository.remote_prefix(session)}/ (`vmsandbox pull {session} {flags}` fetches it)"
        )


def risk_of_entry(src_mode: str, dst_mode: str, status: str, path: str) -> str | None:
    """Why one path a commit touches is risky, by the working tree's rules (and what only a commit can hold)."""
    why = risky_name(path)
    if why is not None:
        return why
    if dst_mode == "120000":
        return "a symlink (where a commit's links lead is not checked)"
    if dst_mode == "160000":
        return "a submodule (gitlink)"
    if dst_mode == "100755" and src_mode != "100755":
        return "newly executable"
    if dst_mode == "100755" and status == "M":
        return "executable, its content changed"
    return None


@dataclass(frozen=True)
class Entry:
    commit: str
    src: str
    dst: str
    status: str
    path: str


def parse_entries(output: str) -> list[Entry]:
    """`git diff-tree --stdin -m -r -z --raw --no-renames --root` output, one Entry per path. A path follows its
    `:` line; a commit id stands where a `:` line could, so names cannot pose as ids."""
    found: list[Entry] = []
    tokens = output.split("\0")
    commit, i = "", 0
    while i < len(tokens):
        token = tokens[i]
        meta = _META.match(token)
        if meta is not None and i + 1 < len(tokens):
            src, dst, status = meta.groups()
            found.append(Entry(commit, src, dst, status, tokens[i + 1]))
            i += 2
            continue
        if _OID.match(token):
            commit = token
        elif token:
            raise ValueError(f"unexpected diff-tree output: {token[:80]!r}")
        i += 1
    return found


def parse_diff_tree(output: str) -> list[tuple[str, Touch | None]]:
    """(commit, its risky touch or None) per path of `parse_entries`."""
    found: list[tuple[str, Touch | None]] = []
    for e in parse_entries(output):
        why = risk_of_entry(e.src, e.dst, e.status, e.path)
        found.append((e.commit, Touch(e.path, why) if why else None))
    return found


def parse_numstat(output: str) -> set[str]:
    """The paths `git diff-tree --stdin -m -r -z --numstat --no-renames --root` calls binary (`-\t-\t`). An
    entry always holds two tabs before its path, so a path cannot pose as a commit id."""
    found: set[str] = set()
    for token in output.split("\0"):
        added, tab, rest = token.partition("\t")
        if not tab:
            if token and not _OID.match(token):
                raise ValueError(f"unexpected diff-tree output: {token[:80]!r}")
            continue
        deleted, tab, path = rest.partition("\t")
        if not tab:
            raise ValueError(f"unexpected diff-tree output: {token[:80]!r}")
        if added == "-" and deleted == "-":
            found.add(path)
    return found


def _diff_tree(repo: repository.Repository, oids: list[str], form: str) -> str | None:
    done = repo.run(
        "diff-tree", "--stdin", "-m", "-r", "-z", form, "--no-abbrev", "--no-renames", "--root",
        check=False, input="".join(f"{o}\n" for o in oids),
    )  # fmt: skip
    return done.stdout if done.returncode == 0 else None


def _ignored(repo: repository.Repository, paths: set[str]) -> set[str] | None:
    """The paths the host's repository ignores (as for the working tree's files), or None if git failed."""
    if not paths:
        return set()
    done = repo.run("check-ignore", "-z", "--stdin", check=False, input="".join(p + "\0" for p in sorted(paths)))
    if done.returncode not in (0, 1):  # 1: nothing is ignored
        return None
    return {p for p in done.stdout.split("\0") if p}


def review(repo: repository.Repository, ref: str) -> RefReview | None:
    """The new commits of one staged ref and what they touch (None: they could not be listed)."""
    listed = repo.run(
        "rev-list", f"--max-count={MAX_COMMITS + 1}", ref, "--not", "--branches", "--tags", "--remotes",
        check=False,
    )  # fmt: skip
    if listed.returncode != 0:
        return None
    oids = listed.stdout.split()
    name = ref.split("/", 3)[3]
    if len(oids) > MAX_COMMITS:
        return RefReview(name, len(oids), (Touch("…", f"more than {MAX_COMMITS} new commits: not reviewed"),))
    if not oids:
        return RefReview(name, 0, ())
    touched = _touched(repo, oids)
    return None if touched is None else RefReview(name, len(oids), touched)


def _touched(repo: repository.Repository, oids: list[str]) -> tuple[Touch, ...] | None:
    """What these commits touch that holds them back, a path once (its first reason: risky, ignored, binary);
    None if git could not say."""
    raw = _diff_tree(repo, oids, "--raw")
    numstat = _diff_tree(repo, oids, "--numstat")
    if raw is None or numstat is None:
        return None
    try:
        entries = parse_entries(raw)
        binary = parse_numstat(numstat)
    except ValueError:
        return None
    held = {e.path: Touch(e.path, why) for e in entries if (why := risk_of_entry(e.src, e.dst, e.status, e.path))}
    written = {e.path for e in entries if e.dst != "000000"}  # deleting a file brings nothing in
    ignored = _ignored(repo, written - set(held))
    if ignored is None:
        return None
    for path in sorted(ignored):
        held[path] = Touch(path, "ignored by the project (.gitignore)", Kind.IGNORED)
    for path in sorted((binary & written) - set(held)):
        held[path] = Touch(path, "binary", Kind.BINARY)
    return tuple(held[p] for p in sorted(held))


def staged_refs(repo: repository.Repository, session: str) -> list[tuple[str, str]]:
    """(ref, object id) of every ref staged for the session."""
    listing = repo.run("for-each-ref", "--format=%(objectname) %(refname)", repository.staged(session) + "/")
    return [(ref, oid) for oid, _, ref in (line.partition(" ") for line in listing.stdout.splitlines())]


def promote(repo: repository.Repository, session: str, *, take: Take) -> tuple[int, list[str]]:
    """Review every staged ref; move those whose commits touch nothing held back (risky, ignored, binary: unless
    `take` takes that kind) to refs/remotes/vmsandbox-SESSION/. How many moved, and one line per ref held back
    saying what it touches and which flag fetches it."""
    held: list[str] = []
    updates: list[str] = []
    prefix = repository.remote_prefix(session)
    for ref, oid in staged_refs(repo, session):
        found = review(repo, ref)
        name = ref.split("/", 3)[3]
        if found is None:
            held.append(f"commits of {name}: could not be listed; not fetched")
        elif found.holds(take):
            held.append(found.line(session, take))
        else:
            updates.append(f"update {prefix}/{name} {oid}\n")
    if updates:
        repo.run("update-ref", "--stdin", input="".join(updates))
    return len(updates), held


def drop_staged(repo: repository.Repository, session: str) -> None:
    """The staged refs go (their objects stay, unreachable, for git's own gc)."""
    doomed = [f"delete {ref}\n" for ref, _oid in staged_refs(repo, session)]
    if doomed:
        repo.run("update-ref", "--stdin", input="".join(doomed))


def drop_leftover(repo: repository.Repository, session: str) -> bool:
    """When a session goes: the refs a killed pull left staged for it in the project (the project's own
    repository, read as the host's data). Git runs only if some are there. Whether any were."""
    gitdir = repo.project / ".git"
    if not refs.is_real_dir(gitdir):
        return False
    space = f"{repository.staged(session)}/"
    loose = gitdir.joinpath(*space.strip("/").split("/"))
    packed = gitdir / "packed-refs"
    there = refs.is_real_dir(loose) or (
        packed.is_file() and not packed.is_symlink() and space.encode() in packed.read_bytes()
    )
    if there:
        drop_staged(repo, session)
    return there
