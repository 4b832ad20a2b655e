"""The refs of a repository the guest wrote, read as files (git never reads that repository).

The guest's `.git` must be a real directory of its own: not a symlink, not a `gitdir:` file, with no
`objects/info/alternates` or `commondir` for git to follow to other repositories. Its branches and tags are
read from loose ref files and packed-refs (regular files only, reached without following links, names and
object ids checked); only refs the guest added or moved since the session started matter.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

from vmsandbox.confine import atfd, beneath
from vmsandbox.errors import VmsandboxError

MAX_REFS = 10_000
MAX_REF_FILE = 4096
MAX_PACKED_REFS = 64 * 1024**2
_OID = re.compile(r"^([0-9a-f]{40}|[0-9a-f]{64})\Z")
LOOSE = re.compile(r"^[0-9a-f]{2}/([0-9a-f]{38}|[0-9a-f]{62})\Z")
PACK = re.compile(r"^pack/pack-([0-9a-f]{40}|[0-9a-f]{64})\.(pack|idx|rev)\Z")
_REF_COMPONENT = re.compile(r"^[A-Za-z0-9_+][A-Za-z0-9._+-]*\Z")
FORBIDDEN = ("commondir", "objects/info/alternates", "objects/info/http-alternates")
COPIED_REF_SPACES = ("refs/heads/", "refs/tags/")


class Refused(VmsandboxError):  # noqa: N818 - a decision, like netpolicy.Refused
    """The guest's repository is not read at all; the message says why."""


def valid_ref(name: str) -> bool:
    """A conservative subset of git check-ref-format: refs/heads/... or refs/tags/..., plain components."""
    if not name.startswith(COPIED_REF_SPACES) or len(name) > 1024:
        return False
    parts = name.split("/")[2:]
    return bool(parts) and all(
        _REF_COMPONENT.match(p) and not p.endswith((".lock", ".")) and ".." not in p and "@{" not in p for p in parts
    )


def is_real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(path.lstat().st_mode)
    except FileNotFoundError:
        return False


def _loose_refs(gitdir: beneath.Root) -> Iterator[tuple[str, str]]:
    for space in COPIED_REF_SPACES:
        try:
            walked = list(_walk_refs(gitdir, space.rstrip("/")))
        except OSError:  # not there, or a link (`.git/refs` that links to another repository's is not read)
            continue
        yield from walked


def _walk_refs(gitdir: beneath.Root, space: str) -> Iterator[tuple[str, str]]:
    for rel_dir, _dirs, files, dir_fd in gitdir.walk(space):
        for name in files:
            fd = atfd.regular_at(dir_fd, name)
            if fd is None:
                continue
            try:
                data = atfd.read_at_most(fd, MAX_REF_FILE)
            finally:
                os.close(fd)
            if data is not None:
                yield "/".join(p for p in (space, rel_dir, name) if p), data.decode("ascii", "replace").strip()


def _packed_refs(gitdir: beneath.Root) -> Iterator[tuple[str, str]]:
    data = gitdir.read("packed-refs", limit=MAX_PACKED_REFS)
    for line in (data or b"").decode("ascii", "replace").splitlines():
        if line.startswith(("#", "^")):
            continue
        oid, _, name = line.partition(" ")
        yield name, oid


def read_refs(gitdir: Path) -> dict[str, str]:
    """Branches and tags of a repository (refs/heads, refs/tags), read as files: loose refs win over packed
    ones, as in git. Symbolic refs, bad names and bad object ids are left out."""
    if not is_real_dir(gitdir):
        return {}
    try:
        top = beneath.Root.open(gitdir)  # (not through a link: it was just seen to be a directory)
    except OSError:
        return {}
    with top:
        found = dict(_packed_refs(top))
        found.update(_loose_refs(top))
    refs = {name: oid for name, oid in found.items() if valid_ref(name) and _OID.match(oid)}
    if len(refs) > MAX_REFS:
        raise Refused(f"the guest's repository has more than {MAX_REFS} branches and tags; they are not fetched")
    return refs


def is_oid(text: str) -> bool:
    return _OID.match(text) is not None


def check_guest_gitdir(gitdir: Path) -> None:
    """Refuse (with the reason) a guest .git that is not a plain repository of its own."""
    try:
        st = gitdir.lstat()
    except FileNotFoundError:
        raise Refused("the guest removed its .git; there are no commits to fetch") from None
    if stat.S_ISLNK(st.st_mode):
        raise Refused(
            f"the guest's .git is a symlink (to {str(gitdir.readlink())!r}); only a real .git directory is read"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise Refused("the guest's .git is a file (a `gitdir:` pointer); only a real .git directory is read")
    for rel in FORBIDDEN:
        try:
            (gitdir / rel).lstat()
        except FileNotFoundError:
            continue
        raise Refused(f"the guest's .git has {rel}, which points git at other repositories; its commits are not read")


def changed_refs(base: dict[str, str], guest: dict[str, str]) -> dict[str, str]:
    """Refs the guest added or moved since the session started."""
    return {name: oid for name, oid in guest.items() if base.get(name) != oid}
