"""The guest's commits, brought into the user's repository as refs/remotes/vmsandbox-NAME/* — reading nothing
but the guest's own objects.

The guest controls its `.git` completely: it can make it a symlink or a `gitdir:` file that points at another
repository on the host, add `objects/info/alternates` or `commondir` for git to follow, plant config that git
obeys, or send objects built to crash a parser. So git never reads the mirror of the guest's repository
directly. Instead:

1. The mirror's `.git` must be a real directory (lstat), and its refs are read by us, not by git: loose refs
   under refs/heads and refs/tags and the packed-refs file, regular files only, names and object ids checked.
   Only refs that are new or moved since the session started come back.
2. An *incoming* repository is made in a private temporary directory owned by the user: our own minimal
   config, the refs from step 1, the object files the guest added (copied as regular files, by their exact
   names; never alternates, commondir or anything else), and as its only alternate the user's own object
   store (so objects the host already has are not copied).
3. git fetches from it into the project as the invoking user (never root), with no system or global config,
   no hooks, and every received object checked (fsck), under resource limits.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from vmsandbox import confine, proc
from vmsandbox.confine import Identity
from vmsandbox.errors import VmsandboxError
from vmsandbox.sync import tree

MAX_REFS = 10_000
MAX_REF_FILE = 4096
MAX_PACKED_REFS = 64 * 1024**2
_OID = re.compile(r"^([0-9a-f]{40}|[0-9a-f]{64})$")
_LOOSE = re.compile(r"^[0-9a-f]{2}/([0-9a-f]{38}|[0-9a-f]{62})$")
_PACK = re.compile(r"^pack/pack-([0-9a-f]{40}|[0-9a-f]{64})\.(pack|idx|rev)$")
_REF_COMPONENT = re.compile(r"^[A-Za-z0-9_+][A-Za-z0-9._+-]*$")
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


def _lstat_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(path.lstat().st_mode)
    except FileNotFoundError:
        return False


def _read_small(dir_fd: int, name: str, limit: int) -> str | None:
    fd = tree.open_file_at(dir_fd, name)
    if fd is None:
        return None
    try:
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    return None if len(data) > limit else data.decode("ascii", "replace")


def _loose_refs(gitdir: Path) -> Iterator[tuple[str, str]]:
    for space in COPIED_REF_SPACES:
        top = gitdir / space
        if not _lstat_dir(top):
            continue
        for dirpath, _dirs, files, dir_fd in os.fwalk(top, follow_symlinks=False):
            rel = os.path.relpath(dirpath, gitdir)
            for name in files:
                text = _read_small(dir_fd, name, MAX_REF_FILE)
                if text is not None:
                    yield (f"{rel}/{name}" if rel != "." else name), text.strip()


def _packed_refs(gitdir: Path) -> Iterator[tuple[str, str]]:
    fd = os.open(gitdir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        text = _read_small(fd, "packed-refs", MAX_PACKED_REFS)
    finally:
        os.close(fd)
    for line in (text or "").splitlines():
        if line.startswith(("#", "^")):
            continue
        oid, _, name = line.partition(" ")
        yield name, oid


def read_refs(gitdir: Path) -> dict[str, str]:
    """Branches and tags of a repository (refs/heads, refs/tags), read as files: loose refs win over packed
    ones, as in git. Symbolic refs, bad names and bad object ids are left out."""
    if not _lstat_dir(gitdir):
        return {}
    found = dict(_packed_refs(gitdir))
    found.update(_loose_refs(gitdir))
    refs = {name: oid for name, oid in found.items() if valid_ref(name) and _OID.match(oid)}
    if len(refs) > MAX_REFS:
        raise Refused(f"the guest's repository has more than {MAX_REFS} branches and tags; they are not fetched")
    return refs


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


@dataclass(frozen=True)
class Incoming:
    """The incoming repository for one fetch (see the module docstring)."""

    path: Path
    refs: dict[str, str]


def _object_files(gitdir: Path) -> Iterator[tuple[str, int, os.stat_result]]:
    """(path under objects/, dir fd, stat) of every loose object and pack file, regular files only."""
    objects = gitdir / "objects"
    if not _lstat_dir(objects):
        return
    for dirpath, _dirs, files, dir_fd in os.fwalk(objects, follow_symlinks=False):
        rel_dir = os.path.relpath(dirpath, objects)
        for name in files:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if not (_LOOSE.match(rel) or _PACK.match(rel)):
                continue
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode):
                yield rel, dir_fd, st


def _known_objects(gitdir: Path) -> set[tuple[str, int]]:
    """(name, size) of the object files the baseline already had: those need no copy."""
    known: set[tuple[str, int]] = set()
    objects = gitdir / "objects"
    if not _lstat_dir(objects):
        return known
    for dirpath, _dirs, files, _fd in os.fwalk(objects, follow_symlinks=False):
        rel_dir = os.path.relpath(dirpath, objects)
        for name in files:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if _LOOSE.match(rel) or _PACK.match(rel):
                st = os.stat(name, dir_fd=_fd, follow_symlinks=False)
                known.add((rel, st.st_size))
    return known


def make_incoming(
    guest_git: Path, base_git: Path, project_git: Path, refs: dict[str, str], who: Identity | None
) -> Incoming:
    """The incoming repository (a private temporary directory, owned by `who`)."""
    path = Path(tempfile.mkdtemp(prefix="vmsandbox-incoming-"))
    try:
        for sub in ("objects/info", "objects/pack", "refs/heads", "refs/tags"):
            (path / sub).mkdir(parents=True, exist_ok=True)
        (path / "HEAD").write_text("ref: refs/heads/vmsandbox-none\n")
        (path / "config").write_text("[core]\n\trepositoryformatversion = 0\n\tbare = true\n")
        fmt = _object_format(base_git)
        if fmt == "sha256":
            (path / "config").write_text(
                "[core]\n\trepositoryformatversion = 1\n\tbare = true\n[extensions]\n\tobjectformat = sha256\n"
            )
        (path / "objects/info/alternates").write_text(f"{project_git.resolve() / 'objects'}\n")
        (path / "packed-refs").write_text("".join(f"{oid} {name}\n" for name, oid in sorted(refs.items())))
        known = _known_objects(base_git)
        for rel, dir_fd, st in _object_files(guest_git):
            if (rel, st.st_size) in known:  # named by its hash: the host has it already
                continue
            src = tree.open_file_at(dir_fd, rel.rsplit("/", 1)[-1], st)
            if src is None:
                continue
            dest = path / "objects" / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                with dest.open("wb") as out:
                    for chunk in tree.chunks(src):
                        out.write(chunk)
            finally:
                os.close(src)
        confine.hand_over(path, who)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    return Incoming(path, refs)


def _object_format(gitdir: Path) -> str:
    try:
        text = (gitdir / "config").read_text(errors="replace")
    except OSError:
        return "sha1"
    return "sha256" if re.search(r"^\s*objectformat\s*=\s*sha256\s*$", text, re.MULTILINE | re.IGNORECASE) else "sha1"


def git_argv(project: Path) -> list[str]:
    """git on the project, taking nothing from anywhere but the project's own repository: no hooks,
    every object checked, no background maintenance."""
    return [
        "git",
        "-C",
        str(project),
        "-c",
        "core.hooksPath=/dev/null",
        "-c",
        "core.fsmonitor=false",
        "-c",
        "transfer.fsckObjects=true",
        "-c",
        "fetch.fsckObjects=true",
        "-c",
        "receive.fsckObjects=true",
        "-c",
        "gc.auto=0",
        "-c",
        "maintenance.auto=false",
        "-c",
        "fetch.writeCommitGraph=false",
        "-c",
        "protocol.file.allow=always",
    ]


def git_env(who: Identity | None) -> dict[str, str]:
    return {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": who.home if who is not None else "/root",
        "LC_ALL": "C.UTF-8",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ASKPASS": "/bin/false",
    }


def run_git(
    project: Path, who: Identity | None, *args: str, check: bool = True, hint: str | None = None
) -> proc.Result:
    return proc.run(
        [*git_argv(project), *args],
        env=git_env(who),
        as_user=who,
        limits=confine.GIT_LIMITS,
        cwd=project,
        check=check,
        hint=hint,
    )


def fetch(project: Path, guest_tree: Path, baseline: Path, session: str, uid: int, gid: int) -> list[str]:
    """Fetch the guest's new or moved branches and tags into refs/remotes/vmsandbox-SESSION/*; return the
    new commits as one-line summaries. Refused raises with the reason."""
    guest_git = guest_tree / ".git"
    check_guest_gitdir(guest_git)
    refs = changed_refs(read_refs(baseline / ".git"), read_refs(guest_git))
    if not refs:
        return []
    who = confine.invoking_user(uid, gid)
    incoming = make_incoming(guest_git, baseline / ".git", project / ".git", refs, who)
    prefix = remote_prefix(session)
    try:
        specs = [f"+refs/heads/*:{prefix}/*", f"+refs/tags/*:{prefix}/tags/*"]
        args = ["fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--no-recurse-submodules"]
        result = run_git(project, who, *args, str(incoming.path), *specs, check=False)
        failed: list[str] = []
        if result.returncode != 0:  # one bad ref (an object the guest does not have) must not block the rest
            for name in sorted(refs):
                dest = name.replace("refs/heads/", f"{prefix}/", 1).replace("refs/tags/", f"{prefix}/tags/", 1)
                one = run_git(project, who, *args, str(incoming.path), f"+{name}:{dest}", check=False)
                if one.returncode != 0:
                    failed.append(name)
    finally:
        shutil.rmtree(incoming.path, ignore_errors=True)
    if failed:
        raise Refused(
            f"the guest's {', '.join(failed)} could not be fetched (objects missing or failing git's checks)"
            + (f"; the others arrived under {prefix}/" if len(failed) < len(refs) else "")
        )
    return new_commits(project, who, prefix)


def remote_prefix(session: str) -> str:
    return f"refs/remotes/vmsandbox-{session}"


def new_commits(project: Path, who: Identity | None, prefix: str) -> list[str]:
    """One line per commit under prefix that no local branch or tag has (at most 20)."""
    listing = run_git(
        project,
        who,
        "log",
        "--oneline",
        "--no-decorate",
        "--max-count=20",
        f"--glob={prefix}/*",
        "--not",
        "--branches",
        "--tags",
        check=False,
    )
    return listing.stdout.splitlines() or [f"refs updated under {prefix}/"]


@contextlib.contextmanager
def private_tmp(who: Identity | None) -> Iterator[Path]:
    """A temporary directory only `who` (and root) can use."""
    path = Path(tempfile.mkdtemp(prefix="vmsandbox-"))
    try:
        confine.hand_over(path, who)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def fetch_bundle(project: Path, bundle: Path, session: str, uid: int, gid: int) -> list[str]:
    """The guest's commits kept in an exported bundle (made by `bundle` below) back into the project."""
    who = confine.invoking_user(uid, gid)
    prefix = remote_prefix(session)
    with private_tmp(who) as tmp:
        readable = tmp / bundle.name
        shutil.copyfile(bundle, readable)
        confine.hand_over(tmp, who)
        run_git(
            project,
            who,
            "fetch",
            "--quiet",
            "--no-tags",
            "--no-write-fetch-head",
            str(readable),
            f"+{prefix}/*:{prefix}/*",
            hint="the exported bundle of the guest's commits could not be read; its working-tree files still sync",
        )
    return new_commits(project, who, prefix)


def bundle(project: Path, dest: Path, session: str, uid: int, gid: int) -> None:
    """A bundle of refs/remotes/vmsandbox-SESSION/*, made by git as the invoking user, kept at dest."""
    who = confine.invoking_user(uid, gid)
    with private_tmp(who) as tmp:
        made = tmp / dest.name
        run_git(project, who, "bundle", "create", "--quiet", str(made), f"--glob={remote_prefix(session)}/*")
        shutil.copyfile(made, dest)
