"""One way to walk beneath a directory (in the spirit of Go's `os.Root`): every host-side reader and writer of a
project, a session's baseline or mirror, or a config directory reaches what it names from the directory's
descriptor, one component at a time, and never leaves it.

- A name is relative and plain: `..`, `.`, an empty component, an absolute name or a NUL is refused (Outside),
  whatever it would resolve to. A `..` that would stay inside is refused too: a caller that means a parent names
  it.
- Each directory on the way is opened with O_NOFOLLOW | O_DIRECTORY from the one above it: a link there is
  refused (ELOOP/ENOTDIR), never followed, whether it leads in or out.
- The last component is opened, read, made, renamed or removed relative to its directory's descriptor and is
  never followed (O_NOFOLLOW, AT_SYMLINK_NOFOLLOW); what is written is made beside its name and renamed over it.
- The top is the caller's: the path it names is trusted, opened once; a link there is refused unless `follow`.
- What cannot be read is unknown, never empty: a directory a walk or a listing of links cannot open or list (no
  permission, no descriptor left, anything but its being gone) raises Unreadable, which a caller turns into a
  refusal a person reads; only a name that is not there (ENOENT) is passed over.

Where a link *would* lead (the review's judge of a guest's link) is confine.resolve's, asked of the same tree;
names compare as the root's file system compares them (`folds`, confine.cases: ext4's casefold, CIFS, a Mac's volume).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType

from vmsandbox.confine import cases
from vmsandbox.confine.atfd import TEMPORARY, read_at_most, regular_at, replace_at
from vmsandbox.errors import VmsandboxError

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

# What to do with each directory on the way to a name: called with its descriptor and whether it was just made.
EachDir = Callable[[int, bool], None]
Listed = tuple[str, list[str], list[str], list[str], int]  # a directory: path, directories, other names, links, fd


class Outside(VmsandboxError):  # noqa: N818 - a refusal, like refs.Refused
    """A name that is not plainly beneath the root (`..`, `.`, empty, absolute, NUL)."""


class Unreadable(VmsandboxError):  # noqa: N818 - an answer, like Outside
    """A name beneath the root that could not be read for another reason than its not being there: what it holds
    is not known (and must never be taken for nothing)."""

    def __init__(self, root: Path, rel: str, exc: OSError) -> None:
        where = root / rel if rel else root
        why = exc.strerror or str(exc)
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            hint = "raise the limit of open files (`ulimit -n`), or flatten the deep directories, then try again"
        elif exc.errno in (errno.ENOTDIR, errno.ELOOP, errno.EINVAL):
            why, hint = "it changed while it was read", "try again once nothing else changes it"
        else:
            hint = f"make it readable for you (`chmod u+rwx '{where}'`), then try again"
        super().__init__(f"{where} cannot be read ({why}): what it holds is not known", hint=hint)
        self.rel = rel


# Errors that say nothing is there as a directory of the root's own: a component missing, a file, or a link (never
# followed). Any other error (EACCES, EMFILE, EIO...) leaves what is there unknown.
NOT_THERE = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ELOOP})


def split(rel: str) -> list[str]:
    """The components of a name beneath a root ("" is the root itself: none)."""
    if rel == "":
        return []
    parts = rel.split("/")
    if rel.startswith("/") or "\0" in rel or any(p in ("", ".", "..") for p in parts):
        raise Outside(f"refusing the path {rel!r}: only plain names beneath the directory are reached")
    return parts


def _step(fd: int, part: str, where: str, mode: int | None, each: EachDir | None) -> int:
    """The directory `part` of fd, opened without following a link (made with `mode` where it is missing); fd
    is closed either way. An error names `where`, the path so far."""
    made = False
    try:
        try:
            inner = os.open(part, DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            if mode is None:
                raise
            with contextlib.suppress(FileExistsError):  # (made meanwhile: opened below as any other)
                os.mkdir(part, mode, dir_fd=fd)
                made = True
            inner = os.open(part, DIR_FLAGS, dir_fd=fd)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, where) from None
    finally:
        os.close(fd)
    if each is not None:
        try:
            each(inner, made)
        except BaseException:
            os.close(inner)
            raise
    return inner


class Root:
    """A directory and what is beneath it, reached only from its descriptor. Close it (or use it as a context
    manager); a Root made by `sub` is closed on its own."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd = fd
        self.path = path  # for messages only: nothing is reached by this name again

    @classmethod
    def open(cls, path: Path | str, *, follow: bool = False) -> Root:
        """The directory `path` names (a link there is refused unless `follow`). OSError when it is not one."""
        return cls(os.open(path, DIR_FLAGS & ~os.O_NOFOLLOW if follow else DIR_FLAGS), Path(path))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Root:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # ------------------------------------------------------------------ directories

    def opendir(self, rel: str, *, mode: int | None = None, each: EachDir | None = None) -> int:
        """A new descriptor of the directory `rel` ("" is the root). With `mode`, each missing directory on the way
        is made with it; `each(fd, made)` is called for every directory below the root on the way. OSError
        (its filename the path up to the component that failed) when one is missing, a link, or not a
        directory."""
        fd = os.dup(self.fd)
        parts = split(rel)
        for i, part in enumerate(parts):
            fd = _step(fd, part, "/".join(parts[: i + 1]), mode, each)
        return fd

    def sub(self, rel: str, *, mode: int | None = None, each: EachDir | None = None) -> Root:
        """The directory `rel` as a Root of its own (Go's OpenRoot)."""
        return Root(self.opendir(rel, mode=mode, each=each), self.path / rel)

    def parent(self, rel: str, *, mode: int | None = None, each: EachDir | None = None) -> tuple[int, str]:
        """A descriptor of the directory that holds `rel`, and rel's last component."""
        parts = split(rel)
        if not parts:
            raise Outside("the top directory itself has no name beneath it")
        return self.opendir("/".join(parts[:-1]), mode=mode, each=each), parts[-1]

    @contextlib.contextmanager
    def directory(self, rel: str) -> Iterator[int | None]:
        """The descriptor of the directory `rel` while the block runs; None when it is not one, or not reached (a
        component missing, a file, a link). Unreadable when it, or a directory on the way, cannot be opened."""
        try:
            fd = self.opendir(rel)
        except Outside:
            yield None
            return
        except OSError as exc:
            if exc.errno not in NOT_THERE:
                raise Unreadable(self.path, exc.filename or rel, exc) from None
            yield None
            return
        try:
            yield fd
        finally:
            os.close(fd)

    def walk(self, rel: str = "") -> Iterator[tuple[str, list[str], list[str], int]]:
        """Everything below the directory `rel`, top down: (its path beneath the root, "" for rel itself relative to
        rel, directory names (prune them in place), other names (links included), its descriptor). No link is
        followed. OSError when `rel` is not there as a directory (as opendir); Unreadable when it, or a directory
        below it, cannot be opened or listed (a name gone meanwhile is passed over)."""
        for here, dirnames, others, _links, fd in self._tree(rel):
            yield here, dirnames, others, fd

    def links(self) -> dict[str, str]:
        """Every symlink beneath the root, and its target. A directory that cannot be opened or listed raises
        Unreadable (a link in it is not known, so none can be said to be missing); a name gone meanwhile is passed
        over. One descriptor is held per level of the walk."""
        found: dict[str, str] = {}
        for here, _dirnames, _others, links, fd in self._tree(""):
            for name in links:
                rel = f"{here}/{name}" if here else name
                try:
                    found[rel] = os.readlink(name, dir_fd=fd)
                except FileNotFoundError:
                    continue
                except OSError as exc:  # (EINVAL: no longer a link)
                    raise Unreadable(self.path, rel, exc) from None
        return found

    def _tree(self, rel: str) -> Iterator[Listed]:
        try:
            top = self.opendir(rel)
        except OSError as exc:
            if exc.errno in NOT_THERE:
                raise
            raise Unreadable(self.path, exc.filename or rel, exc) from None
        try:
            yield from self._below(top, rel, "")
        finally:
            os.close(top)

    def _below(self, fd: int, rel: str, here: str) -> Iterator[Listed]:
        dirnames: list[str] = []
        others: list[str] = []
        links: list[str] = []
        where = "/".join(p for p in (rel, here) if p)
        try:
            with os.scandir(fd) as listed:
                for entry in listed:
                    if entry.is_dir(follow_symlinks=False):
                        dirnames.append(entry.name)
                    else:
                        others.append(entry.name)
                        if entry.is_symlink():
                            links.append(entry.name)
        except OSError as exc:
            raise Unreadable(self.path, where, exc) from None
        yield here, dirnames, others, links, fd
        for name in dirnames:  # (as pruned by the caller)
            below = f"{here}/{name}" if here else name
            try:
                inner = os.open(name, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                continue
            except OSError as exc:  # (ELOOP, ENOTDIR: made a link or a file meanwhile; EACCES, EMFILE...)
                raise Unreadable(self.path, "/".join(p for p in (rel, below) if p), exc) from None
            try:
                yield from self._below(inner, rel, below)
            finally:
                os.close(inner)

    # ------------------------------------------------------------------ what is at a name

    def lstat(self, rel: str) -> os.stat_result | None:
        """The name itself (a link is not followed), or None when it, or a directory on the way, is not there as
        a directory of the root's own."""
        try:
            fd, name = self.parent(rel)
        except (OSError, Outside):
            return None
        try:
            return os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            return None
        finally:
            os.close(fd)

    def readlink(self, rel: str) -> str | None:
        """The target of the link `rel`, or None when it is not a link."""
        try:
            fd, name = self.parent(rel)
        except (OSError, Outside):
            return None
        try:
            return os.readlink(name, dir_fd=fd)
        except OSError:
            return None
        finally:
            os.close(fd)

    def open_regular(self, rel: str, st: os.stat_result | None = None) -> int | None:
        """A descriptor of the regular file `rel` (None when it is none, or is reached only through a link)."""
        try:
            fd, name = self.parent(rel)
        except (OSError, Outside):
            return None
        try:
            return regular_at(fd, name, st)
        finally:
            os.close(fd)

    def read(self, rel: str, *, limit: int) -> bytes | None:
        """At most `limit` bytes of the regular file `rel` (None when it is none, or is larger)."""
        fd = self.open_regular(rel)
        if fd is None:
            return None
        try:
            return read_at_most(fd, limit)
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ writing

    def replace(
        self,
        rel: str,
        make: Callable[[int, str], None],
        *,
        temporary: str = TEMPORARY,
        mode: int | None = None,
        each: EachDir | None = None,
    ) -> None:
        """replace_at in the directory that holds `rel` (`mode` and `each`: as for opendir, for the directories
        on the way)."""
        fd, name = self.parent(rel, mode=mode, each=each)
        try:
            replace_at(fd, name, make, temporary=temporary)
        finally:
            os.close(fd)

    def remove(self, rel: str) -> None:
        """Remove what `rel` is (a link, not what it leads to; a directory with all it holds, by descriptors).
        OSError when it is not there, or a directory on the way is not (or is a link)."""
        fd, name = self.parent(rel)
        try:
            if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                shutil.rmtree(name, dir_fd=fd)  # (fd-based: a link met inside is removed, never followed)
            else:
                os.unlink(name, dir_fd=fd)
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ how names compare

    def folds(self) -> bool:
        """Whether names beneath the root compare case-insensitively (confine.cases)."""
        return cases.folds(self.fd, self.path)
