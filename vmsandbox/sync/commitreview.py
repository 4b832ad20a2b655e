"""The guest's commits reviewed like its files: every path a fetched commit touches is classed by the same rules
as the working tree, and a branch or tag whose commits touch a risky path is not created unless asked.

A commit "Fix typo in README" that adds an agent hook, a git-hook-manager script and `.envrc` is as dangerous as
those files in the working tree: the user's next `git merge` puts them in place. So the guest's refs are first
fetched into a staging namespace of the project (`refs/vmsandbox-incoming/SESSION/…`, objects only: nothing
checks them out), each staged ref's new commits (those no branch, tag or remote-tracking ref has) are listed
with `git diff-tree` — against every parent of a merge, so an evil merge shows too — and only refs whose
commits touch no risky path are promoted to `refs/remotes/vmsandbox-SESSION/…`. The others stay staged for the
outbox's bundle (then go): `--include-risky` promotes them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from vmsandbox.confine import Identity
from vmsandbox.sync import commits
from vmsandbox.sync.risk import risky_name

MAX_COMMITS = 1000  # more new commits than this on one ref: it is not reviewed, so it is held
_OID = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")
_META = re.compile(r"^:(\d{6}) (\d{6}) [0-9a-f]+ [0-9a-f]+ ([A-Z])\d*$")


@dataclass(frozen=True)
class Touch:
    path: str
    why: str


@dataclass(frozen=True)
class RefReview:
    name: str  # below the prefix: `main`, `tags/v1`
    commits: int
    risky: tuple[Touch, ...]

    def line(self, session: str) -> str:
        shown = "; ".join(f"{t.path} ({t.why})" for t in self.risky[:5]) + (" …" if len(self.risky) > 5 else "")
        return (
            f"commits of {self.name} ({self.commits} new) touch {shown}: not fetched into "
            f"{commits.remote_prefix(session)}/ (`vmsandbox pull {session} --include-risky` fetches it)"
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


def parse_diff_tree(output: str) -> list[tuple[str, Touch | None]]:
    """`git diff-tree --stdin -m -r -z --raw --no-renames --root` output as (commit, risky touch or None) per
    path. A path follows its `:` line; a commit id stands where a `:` line could, so names cannot pose as ids."""
    found: list[tuple[str, Touch | None]] = []
    tokens = output.split("\0")
    commit, i = "", 0
    while i < len(tokens):
        token = tokens[i]
        meta = _META.match(token)
        if meta is not None and i + 1 < len(tokens):
            src, dst, status = meta.groups()
            path = tokens[i + 1]
            why = risk_of_entry(src, dst, status, path)
            found.append((commit, Touch(path, why) if why else None))
            i += 2
            continue
        if _OID.match(token):
            commit = token
        elif token:
            raise ValueError(f"unexpected diff-tree output: {token[:80]!r}")
        i += 1
    return found


def review(project: Path, who: Identity | None, ref: str) -> RefReview | None:
    """The new commits of one staged ref and what they touch (None: they could not be listed)."""
    listed = commits.run_git(
        project, who, "rev-list", f"--max-count={MAX_COMMITS + 1}", ref, "--not", "--branches", "--tags", "--remotes",
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
    tree = commits.run_git(
        project, who, "diff-tree", "--stdin", "-m", "-r", "-z", "--raw", "--no-abbrev", "--no-renames", "--root",
        check=False, input="".join(f"{o}\n" for o in oids),
    )  # fmt: skip
    if tree.returncode != 0:
        return None
    try:
        touched = parse_diff_tree(tree.stdout)
    except ValueError:
        return None
    risky = {t.path: t for _c, t in touched if t is not None}
    return RefReview(name, len(oids), tuple(risky[p] for p in sorted(risky)))


def _staged(project: Path, who: Identity | None, session: str) -> list[tuple[str, str]]:
    """(ref, object id) of every ref staged for the session."""
    listing = commits.run_git(
        project, who, "for-each-ref", "--format=%(objectname) %(refname)", commits.staged(session) + "/"
    )
    return [(ref, oid) for oid, _, ref in (line.partition(" ") for line in listing.stdout.splitlines())]


def promote(project: Path, who: Identity | None, session: str, *, include_risky: bool) -> tuple[int, list[str]]:
    """Review every staged ref; move those whose commits touch nothing risky (every one with include_risky) to
    refs/remotes/vmsandbox-SESSION/. How many moved, and one line per ref held back saying what it touches."""
    held: list[str] = []
    updates: list[str] = []
    prefix = commits.remote_prefix(session)
    for ref, oid in _staged(project, who, session):
        found = review(project, who, ref)
        name = ref.split("/", 3)[3]
        if found is None:
            held.append(f"commits of {name}: could not be listed; not fetched")
        elif found.risky and not include_risky:
            held.append(found.line(session))
        else:
            updates.append(f"update {prefix}/{name} {oid}\n")
    if updates:
        commits.run_git(project, who, "update-ref", "--stdin", input="".join(updates))
    return len(updates), held


def drop_staged(project: Path, who: Identity | None, session: str) -> None:
    """The staged refs go (their objects stay, unreachable, for git's own gc)."""
    doomed = [f"delete {ref}\n" for ref, _oid in _staged(project, who, session)]
    if doomed:
        commits.run_git(project, who, "update-ref", "--stdin", input="".join(doomed))
