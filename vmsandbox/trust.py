"""Trust in project configuration. A project's `.vmsandbox.yaml` and `.vmsandbox/blueprints/*.yaml` are code:
they decide what a session may reach (network, secrets, host files copied in, packages installed as root).
A freshly cloned repository — or a guest whose changes were applied — must not get that power silently.

So (as direnv and mise do) a project file that widens what a session may do is obeyed only after the user
trusted its exact content with `vmsandbox config trust`. The record — the file's absolute path and the SHA-256 of
its bytes — lives in the user's config directory, outside every project, so nothing in a project (or a guest)
can write it. A changed file is untrusted again. Keys that only size the VM need no trust.

Files are read once, without following symlinks, and parsed from the very bytes whose hash was checked. Under
sudo, root reads one only where the person who ran sudo could (confine.rights): their rights on the file and on
every directory from the project down to it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmsandbox import filewrite, paths, sudo
from vmsandbox.confine import beneath, rights
from vmsandbox.errors import VmsandboxError

TRUST_FILE = "trusted.json"
MAX_CONFIG_BYTES = 1024**2


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def key(path: Path) -> str:
    """A trust record's key: the file's absolute path, its directory resolved. Only the part the user named (the
    project directory) can hold a link: `read_project_file` refuses one anywhere below the project, so no
    project is ever keyed as another (a `.vmsandbox` linked to a trusted project's would borrow its trust)."""
    return str(path.parent.resolve() / path.name)


def read_project_file(path: Path, project: Path | None = None) -> bytes | None:
    """The bytes of a project config file; None if there is none. A symlink — the file or, given the project,
    any directory between the project and the file —, something that is not a regular file, or a file over
    1 MiB is refused (a project file must be what it looks like, where it looks to be)."""
    try:
        dir_fd = _open_parent(path, project)
    except FileNotFoundError:
        return None
    try:
        fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise VmsandboxError(
                f"{path} is a symlink; a project config file must be a regular file",
                hint="replace the link by the file itself",
            ) from None
        raise VmsandboxError(f"cannot read {path}: {exc.strerror}") from exc
    finally:
        if dir_fd is not None:
            os.close(dir_fd)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise VmsandboxError(f"{path} is not a regular file")
        who = rights.person()
        if who is not None and not rights.may(f.fileno(), who, rights.READ, st):
            raise _not_theirs(path, who.name)
        data = f.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise VmsandboxError(f"{path} is larger than {MAX_CONFIG_BYTES // 1024} KiB; that is not a config file")
    return data


def names_in(directory: Path, project: Path) -> list[str]:
    """The names in a config directory of the project (`.vmsandbox/blueprints`), reached as read_project_file
    reaches a file's: beneath the project, no link followed, under sudo with the person's rights; none when it is
    not there as a directory of the project's own (a link there is refused when a file of it is read)."""
    who = rights.person()

    def passable(fd: int, _made: bool) -> None:
        if who is not None and not rights.may(fd, who, rights.PASS):
            raise _not_theirs(directory, who.name)

    with beneath.Root.open(project, follow=True) as top:
        passable(top.fd, False)
        try:
            fd = top.opendir("/".join(directory.relative_to(project).parts), each=passable)
        except OSError:
            return []
    try:
        if who is not None and not rights.may(fd, who, rights.LIST):
            raise _not_theirs(directory, who.name)
        with os.scandir(fd) as listed:
            return sorted(e.name for e in listed)
    finally:
        os.close(fd)


def _open_parent(path: Path, project: Path | None) -> int | None:
    """A descriptor of the file's directory, reached beneath the project (confine.beneath: one component at a
    time, no link followed, no `..`); None: no project given, the file's directory is used as it is named."""
    if project is None:
        return None
    try:
        rel = path.parent.relative_to(project)
    except ValueError:
        raise VmsandboxError(f"{path} is not in the project {project}") from None
    who = rights.person()

    def passable(fd: int, _made: bool) -> None:
        if who is not None and not rights.may(fd, who, rights.PASS):
            raise _not_theirs(path, who.name)

    with beneath.Root.open(project, follow=True) as top:  # (the project is named by the user: a link there is theirs)
        passable(top.fd, False)
        try:
            return top.opendir("/".join(rel.parts), each=passable)
        except beneath.Outside:
            raise VmsandboxError(f"{path} is not in the project {project}") from None
        except OSError as exc:
            where = project / (exc.filename or "")
            if exc.errno in (errno.ELOOP, errno.ENOTDIR) and where.is_symlink():
                raise VmsandboxError(
                    f"{where} is a symlink; a project's config directories must be its own",
                    hint="replace the link by a directory (a link to another project would borrow its trust)",
                ) from None
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                raise FileNotFoundError(exc.errno, exc.strerror, str(where)) from None
            raise VmsandboxError(f"cannot read {where}: {exc.strerror}") from exc


def _not_theirs(path: Path, name: str) -> VmsandboxError:
    return VmsandboxError(
        f"{path}: you ({name}) may not read it, and vmsandbox reads a project's files for you only as you could",
        hint=f"make it (and the directories above it) readable for {name}, or remove it",
    )


def _store() -> Path:
    return paths.config_dir() / TRUST_FILE


def records() -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(_store().read_text())
    except FileNotFoundError:
        return {}
    except ValueError as exc:
        raise VmsandboxError(
            f"{_store()} is damaged: {exc}",
            hint="remove it; then trust your projects again with `vmsandbox config trust add`",
        ) from exc
    return data if isinstance(data, dict) else {}


def _save(data: dict[str, dict[str, Any]]) -> None:
    with sudo.as_invoker():
        paths.config_subdir(paths.config_dir())
        filewrite.write_atomically(_store(), json.dumps(data, indent=1, sort_keys=True) + "\n", mode=0o600)


@dataclass(frozen=True)
class State:
    trusted: bool
    changed: bool  # trusted once, with other content


def state(path: Path, data: bytes) -> State:
    entry = records().get(key(path))
    if entry is None:
        return State(False, False)
    same = entry.get("sha256") == digest(data)
    return State(same, not same)


def trust(path: Path, data: bytes) -> None:
    found = records()
    found[key(path)] = {"sha256": digest(data), "trusted_at": time.time()}
    _save(found)


def revoke(path: Path) -> bool:
    found = records()
    if found.pop(key(path), None) is None:
        return False
    _save(found)
    return True


class UntrustedError(VmsandboxError):
    """A project file that widens what a session may do and whose content the user has not trusted."""

    def __init__(self, path: Path, keys: list[str], *, changed: bool, project: Path) -> None:
        what = ", ".join(f"`{k}`" for k in keys)
        since = " (it changed since you trusted it)" if changed else ""
        super().__init__(
            f"{path} is not trusted{since}: it sets {what}, which widen what a session may do",
            hint=f"read it, then `vmsandbox config trust add {project}` (it shows what the file changes)",
        )
        self.path = path
        self.keys = keys


def require(path: Path, data: bytes, keys: list[str], *, project: Path) -> None:
    """Raise UntrustedError unless `keys` is empty or the file's exact content is trusted."""
    if not keys:
        return
    st = state(path, data)
    if not st.trusted:
        raise UntrustedError(path, keys, changed=st.changed, project=project)


@dataclass(frozen=True)
class Candidate:
    """A project file `vmsandbox config trust` looks at."""

    path: Path
    raw: bytes
    lines: list[str]  # what it changes, one item per line (plain text)

    @property
    def state(self) -> State:
        return state(self.path, self.raw)
