"""The guest's commits, brought into the user's repository as refs/remotes/vmsandbox-NAME/* — reading nothing
but the guest's own objects.

The guest controls its `.git` completely: it can make it a symlink or a `gitdir:` file that points at another
repository on the host, add `objects/info/alternates` or `commondir` for git to follow, plant config that git
obeys, or send objects built to crash a parser. So git never reads the mirror of the guest's repository
directly. Instead:

1. refs.py checks that the mirror's `.git` is a real repository of its own and reads the refs it added or
   moved since the session started, as files.
2. An *incoming* repository is made in a private temporary directory owned by the user: our own minimal
   config, those refs, the object files the guest added (copied as regular files, by their exact names;
   never alternates, commondir or anything else), and as its only alternate the user's own object store (so
   objects the host already has are not copied).
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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from vmsandbox import proc
from vmsandbox.confine import accounts
from vmsandbox.confine.accounts import Identity
from vmsandbox.confine.jail import Jail
from vmsandbox.sync.git import refs
from vmsandbox.sync.tree import manifest


@dataclass(frozen=True)
class Incoming:
    """The incoming repository for one fetch (see the module docstring)."""

    path: Path
    refs: dict[str, str]


def _object_files(gitdir: Path) -> Iterator[tuple[str, int, os.stat_result]]:
    """(path under objects/, dir fd, stat) of every loose object and pack file, regular files only."""
    objects = gitdir / "objects"
    if not refs.is_real_dir(objects):
        return
    for dirpath, _dirs, files, dir_fd in os.fwalk(objects, follow_symlinks=False):
        rel_dir = os.path.relpath(dirpath, objects)
        for name in files:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if not (refs.LOOSE.match(rel) or refs.PACK.match(rel)):
                continue
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode):
                yield rel, dir_fd, st


def _known_objects(gitdir: Path) -> set[tuple[str, int]]:
    """(name, size) of the object files the baseline already had: those need no copy."""
    return {(rel, st.st_size) for rel, _fd, st in _object_files(gitdir)}


def make_incoming(
    guest_git: Path, base_git: Path, project_git: Path, wanted: dict[str, str], who: Identity | None
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
        (path / "packed-refs").write_text("".join(f"{oid} {name}\n" for name, oid in sorted(wanted.items())))
        known = _known_objects(base_git)
        for rel, dir_fd, st in _object_files(guest_git):
            if (rel, st.st_size) in known:  # named by its hash: the host has it already
                continue
            src = manifest.open_file_at(dir_fd, rel.rsplit("/", 1)[-1], st)
            if src is None:
                continue
            dest = path / "objects" / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                with dest.open("wb") as out:
                    for chunk in manifest.chunks(src):
                        out.write(chunk)
            finally:
                os.close(src)
        accounts.hand_over(path, who)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    return Incoming(path, wanted)


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
        **accounts.clean_env(who),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ASKPASS": "/bin/false",
    }


@dataclass(frozen=True)
class Repository:
    """The project's own git repository and whose it is: every git call in it runs as its owner (asked once,
    when it is made), jailed, taking nothing from anywhere but that repository."""

    project: Path
    who: Identity | None  # None: the owner is who runs vmsandbox already

    @classmethod
    def of(cls, project: Path, uid: int, gid: int) -> Repository:
        return cls(project, accounts.invoking_user(uid, gid))

    def run(
        self,
        *args: str,
        check: bool = True,
        hint: str | None = None,
        input: str | None = None,
        writable: tuple[Path, ...] = (),
        readable: tuple[Path, ...] = (),
    ) -> proc.Result:
        """git in the project as its owner, jailed: it reads guest objects and refs, and may write only the
        project's repository (and `writable`); of the host it sees only the project, the object stores the
        project's own repository borrows from, and `readable`."""
        project = self.project
        return proc.run(
            [*git_argv(project), *args],
            jail=Jail(writable=(project / ".git", *writable), readable=(project, *_borrowed(project), *readable)),
            input=input,
            env=git_env(self.who),
            as_user=self.who,
            limits=accounts.GIT_LIMITS,
            cwd=project,
            check=check,
            hint=hint,
        )

    def fetch(self, guest_tree: Path, baseline: Path, session: str, tips: Mapping[str, str]) -> str | None:
        """Fetch the guest's branches and tags at `tips` (name -> commit: what the review showed, not what the
        guest's refs say now) into the session's staging namespace of the project (`staged(session)`;
        git/review.py promotes them). Refused raises with the reason when the repository is not read at all;
        refs that could not be fetched (the others were) are returned as one line saying why."""
        guest_git = guest_tree / ".git"
        refs.check_guest_gitdir(guest_git)
        wanted = {name: oid for name, oid in tips.items() if refs.valid_ref(name) and refs.is_oid(oid)}
        if not wanted:
            return None
        incoming = make_incoming(guest_git, baseline / ".git", self.project / ".git", wanted, self.who)
        prefix = staged(session)
        try:
            specs = [f"+refs/heads/*:{prefix}/*", f"+refs/tags/*:{prefix}/tags/*"]
            args = ["fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--no-recurse-submodules"]
            seen = (incoming.path,)
            result = self.run(*args, str(incoming.path), *specs, check=False, readable=seen)
            failed: list[str] = []
            if result.returncode != 0:  # one bad ref (an object the guest does not have) must not block the rest
                for name in sorted(wanted):
                    dest = name.replace("refs/heads/", f"{prefix}/", 1).replace("refs/tags/", f"{prefix}/tags/", 1)
                    one = self.run(*args, str(incoming.path), f"+{name}:{dest}", check=False, readable=seen)
                    if one.returncode != 0:
                        failed.append(name)
        finally:
            shutil.rmtree(incoming.path, ignore_errors=True)
        if failed:
            return f"the guest's {', '.join(failed)} could not be fetched (objects missing or failing git's checks)"
        return None

    def new_commits(self, prefix: str) -> list[str]:
        """One line per commit under prefix that no local branch or tag has (at most 20)."""
        listing = self.run(
            "log", "--oneline", "--no-decorate", "--max-count=20", f"--glob={prefix}/*", "--not", "--branches",
            "--tags", check=False,
        )  # fmt: skip
        return listing.stdout.splitlines() or [f"refs updated under {prefix}/"]

    @contextlib.contextmanager
    def private_tmp(self) -> Iterator[Path]:
        """A temporary directory only the owner (and root) can use."""
        path = Path(tempfile.mkdtemp(prefix="vmsandbox-"))
        try:
            accounts.hand_over(path, self.who)
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def fetch_bundle(self, bundle: Path, session: str) -> None:
        """The guest's commits kept in an exported bundle (made by `bundle` below) back into the project's
        staging namespace, reviewed again (git/review.py) wherever they had been."""
        prefix, stage = remote_prefix(session), staged(session)
        with self.private_tmp() as tmp:
            copy = tmp / bundle.name
            shutil.copyfile(bundle, copy)
            accounts.hand_over(tmp, self.who)
            self.run(
                "fetch", "--quiet", "--no-tags", "--no-write-fetch-head", str(copy), f"+{prefix}/*:{stage}/*",
                f"+{stage}/*:{stage}/*", readable=(tmp,),
                hint="the exported bundle of the guest's commits could not be read; its working-tree files still sync",
            )  # fmt: skip

    def bundle(self, dest: Path, session: str) -> None:
        """A bundle of the session's staged refs (the outbox keeps them in it), made by git as the owner, kept at
        dest."""
        with self.private_tmp() as tmp:
            made = tmp / dest.name
            # every ref the guest changed, as staged (held ones too): reviewed again when the bundle is fetched
            self.run("bundle", "create", "--quiet", str(made), f"--glob={staged(session)}/*", writable=(tmp,))
            shutil.copyfile(made, dest)


def _borrowed(project: Path) -> list[Path]:
    """The object stores the host's repository lists as alternates (a `git clone --reference`): the user's own
    setting, read from their repository, never from the guest's."""
    objects = project / ".git" / "objects"
    try:
        lines = (objects / "info" / "alternates").read_text(errors="replace").splitlines()
    except OSError:
        return []
    found = [objects / line.strip() for line in lines if line.strip() and not line.startswith("#")]
    return [p for p in found if p.is_dir()]


def remote_prefix(session: str) -> str:
    return f"refs/remotes/vmsandbox-{session}"


def staged(session: str) -> str:
    """Where the guest's refs wait, fetched but not reviewed: no `git branch -a` or merge target shows them."""
    return f"refs/vmsandbox-incoming/{session}"
