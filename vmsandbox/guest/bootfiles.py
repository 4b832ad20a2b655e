"""What a session copies into its guest at boot: host config files a blueprint names, the git identity, and
environment variables. They travel as fw_cfg files the guest's identity unit applies before sshd starts;
nothing is ever read back from where they land (the review covers the project only)."""

from __future__ import annotations

import errno
import io
import os
import pwd
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from vmsandbox import proc, ui
from vmsandbox.confine import atfd, beneath, rights
from vmsandbox.confine.accounts import Identity
from vmsandbox.errors import VmsandboxError

MAX_COPY_BYTES = 16 * 1024**2


@dataclass(frozen=True)
class GuestUser:
    """The guest user mirrors the invoking host user (name, uid, gid). Root (not under sudo) maps to root."""

    name: str
    uid: int
    gid: int

    @classmethod
    def of_host(cls, environ: dict[str, str] | None = None) -> GuestUser:
        """The invoking user: under sudo that is SUDO_USER (not root), so files keep the real owner."""
        env = os.environ if environ is None else environ
        if os.geteuid() == 0 and env.get("SUDO_UID", "0") != "0" and env.get("SUDO_USER"):
            return cls(env["SUDO_USER"], int(env["SUDO_UID"]), int(env.get("SUDO_GID", env["SUDO_UID"])))
        uid = os.getuid()
        return cls(pwd.getpwuid(uid).pw_name, uid, os.getgid())

    @property
    def guest_home(self) -> PurePosixPath:
        return PurePosixPath("/root") if self.uid == 0 else PurePosixPath("/home") / self.name

    def host_home(self) -> Path:
        """This user's home on the host: under sudo, the invoking user's (not root's)."""
        if self.uid != os.getuid():
            try:
                return Path(pwd.getpwnam(self.name).pw_dir)
            except KeyError:
                pass
        return Path.home()


class Bundle:
    """A tar of files with guest paths and owners, built in memory."""

    def __init__(self, owner: GuestUser) -> None:
        self.owner = owner
        self._buf = io.BytesIO()
        self._tar = tarfile.open(fileobj=self._buf, mode="w", format=tarfile.PAX_FORMAT)  # noqa: SIM115 - closed in close()
        self._dirs: set[PurePosixPath] = set()
        self.size = 0
        self.copied: list[str] = []

    def _info(self, path: PurePosixPath, kind: bytes, mode: int) -> tarfile.TarInfo:
        info = tarfile.TarInfo(str(path).lstrip("/"))
        info.type = kind
        info.mode = mode
        info.uid, info.gid = self.owner.uid, self.owner.gid
        info.uname, info.gname = "", ""
        info.mtime = int(time.time())
        return info

    def _parents(self, path: PurePosixPath) -> None:
        home = self.owner.guest_home
        for parent in reversed(path.parents):
            if parent in self._dirs or not parent.is_relative_to(home) or parent == home:
                continue
            self._tar.addfile(self._info(parent, tarfile.DIRTYPE, 0o700))
            self._dirs.add(parent)

    def add_bytes(self, guest_path: PurePosixPath, data: bytes, mode: int = 0o600) -> None:
        self.size += len(data)
        if self.size > MAX_COPY_BYTES:
            raise VmsandboxError(
                f"the files to copy into the guest exceed {MAX_COPY_BYTES // 1024**2} MiB at {guest_path}",
                hint="copy fewer or smaller files (blueprint `copy:`)",
            )
        self._parents(guest_path)
        info = self._info(guest_path, tarfile.REGTYPE, mode & 0o777)
        info.size = len(data)
        self._tar.addfile(info, io.BytesIO(data))

    def copy_from_home(self, home: Path, item: str) -> None:
        """`~/rel` from the host home to the same place under the guest user's home (files and directories;
        symlinks, devices and the like are skipped). A missing source is not an error. Read beneath the home with no
        link followed on the way; under sudo only what the person may read (confine.rights), so root copies for
        them nothing they could not read themselves."""
        rel = item.removeprefix("~/")
        try:
            top = beneath.Root.open(home, follow=True)
        except OSError:
            return
        with top:
            found = _home_files(top, rel, rights.person())
        for where, data, mode in found:
            self.add_bytes(PurePosixPath(self.owner.guest_home / where), data, mode)
        if found:
            self.copied.append(item)

    def close(self) -> bytes:
        self._tar.close()
        return self._buf.getvalue()


def _home_files(top: beneath.Root, rel: str, who: Identity | None) -> list[tuple[str, bytes, int]]:
    """The regular files at `rel` beneath the home `top` (rel itself, or every one below it: path, bytes, mode),
    never through a link; with `who`, only those they may read through directories they may pass and list."""

    def passable(fd: int, _made: bool) -> None:
        if who is not None and not rights.may(fd, who, rights.PASS):
            raise PermissionError(errno.EACCES, "not the person's to pass", rel)

    try:
        passable(top.fd, False)
        parent, name = top.parent(rel, each=passable)
    except (OSError, beneath.Outside):
        return []
    try:
        one = _readable(parent, name, who)
        if one is not None:
            return [(rel, *one)]
        if who is not None and not rights.may_at(parent, name, who, rights.LIST):
            return []
        try:
            source = beneath.Root(os.open(name, beneath.DIR_FLAGS, dir_fd=parent), top.path / rel)
        except OSError:  # (none there, or not a directory: a link, a device...)
            return []
    finally:
        os.close(parent)
    found = []
    with source:
        for here, dirs, names, fd in source.walk():
            dirs[:] = sorted(d for d in dirs if who is None or rights.may_at(fd, d, who, rights.LIST))
            for file in sorted(names):
                got = _readable(fd, file, who)
                if got is not None:
                    found.append((f"{rel}/{here}/{file}" if here else f"{rel}/{file}", *got))
    return found


def _readable(dir_fd: int, name: str, who: Identity | None) -> tuple[bytes, int] | None:
    """The bytes and mode of the regular file `name` of dir_fd (never through a link), if `who` (None: we) may read
    it."""
    fd = atfd.regular_at(dir_fd, name)
    if fd is None:
        return None
    try:
        st = os.fstat(fd)
        if who is not None and not rights.may(fd, who, rights.READ, st):
            return None
        data = atfd.read_at_most(fd, MAX_COPY_BYTES)
    finally:
        os.close(fd)
    if data is None:
        raise VmsandboxError(
            f"{name}, to copy into the guest, is larger than {MAX_COPY_BYTES // 1024**2} MiB",
            hint="copy fewer or smaller files (blueprint `copy:`)",
        )
    return data, st.st_mode


def git_identity(home: Path) -> tuple[str, str] | None:
    """The host user's git user.name and user.email (from their global config), if both are set. Under sudo git runs
    as them (confine.rights): what their config includes, it reads with their rights, not root's."""
    env = {"HOME": str(home), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    who = rights.person()
    values = []
    for key in ("user.name", "user.email"):
        result = proc.run(["git", "config", "--global", "--get", key], check=False, env=env, as_user=who, cwd=Path("/"))
        values.append(result.stdout.strip())
    if not all(values):
        return None
    return values[0], values[1]


def gitconfig(name: str, email: str) -> bytes:
    def quote(v: str) -> str:
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'

    return f"[user]\n\tname = {quote(name)}\n\temail = {quote(email)}\n".encode()


def build(
    owner: GuestUser, copy: tuple[str, ...], *, git: bool, more: Callable[[Bundle], list[str]] | None = None
) -> tuple[bytes | None, list[str]]:
    """The tar for fw_cfg `files` (None when empty) and a note per thing copied, for the user. `more` adds
    files of its own (a kept login) and says them."""
    home = owner.host_home()
    bundle = Bundle(owner)
    for item in copy:
        bundle.copy_from_home(home, item)
    notes = [f"{item} (copied in; never synced back)" for item in bundle.copied]
    if more is not None:
        notes += more(bundle)
    if git:
        identity = git_identity(home)
        if identity is None:
            ui.warn(f"--git-identity: no user.name and user.email in {home}/.gitconfig; the guest gets none")
        else:
            bundle.add_bytes(owner.guest_home / ".gitconfig", gitconfig(*identity), 0o644)
            notes.append(f"git identity {identity[0]} <{identity[1]}>")
    data = bundle.close()
    return (data if bundle.size or bundle.copied else None), notes


def env_lines(env: dict[str, str]) -> str:
    """KEY=VALUE lines for /etc/environment (pam_env): no newlines or quotes can sneak in."""
    out = []
    for key, value in env.items():
        if any(c in value for c in "\n\r\0"):
            raise VmsandboxError(f"environment variable {key}: its value may not contain a line break")
        out.append(f"{key}={value}\n")
    return "".join(out)
