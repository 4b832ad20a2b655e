"""Every value a client names, made once by its validator: the backend takes these types, never a bare string.

A value of one of these types was checked when it was made (`__post_init__`), so holding one is proof: a
session name is one `vmsandbox` accepts anywhere (the core's rule), a guest path has no NUL, no `..` and
no part too long for the guest's filesystem, a project path is an absolute directory on this machine.
A refusal is a VmsandboxError with the fix; the edge answers it as a 400.
"""

from __future__ import annotations

import posixpath
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from vmsandbox.core import images, moments, sessions
from vmsandbox.errors import VmsandboxError

PATH_BYTES = 4096  # PATH_MAX
PART_BYTES = 255  # NAME_MAX
USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}\Z")  # a POSIX account name as useradd takes it
TOKEN_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")  # ids the backend makes (reviews, items, hunks)
DIGEST_RE = re.compile(r"^[0-9a-f]{16,128}\Z")
TAG_RE = re.compile(r"^[\x21-\x7e]{1,64}\Z")  # a process tag: printable ASCII, no space


class InvalidError(VmsandboxError):
    """A value from a client that is not one: answered 400, with the rule it broke and how to fix it."""


@dataclass(frozen=True)
class SessionName:
    """A session (E2B: a sandbox id)."""

    value: str

    def __post_init__(self) -> None:
        try:
            sessions.validate_name(self.value)
        except VmsandboxError as exc:
            raise InvalidError(f"not a session name: {self.value[:80]!r}", hint=exc.hint) from None

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class CheckpointLabel:
    value: str

    def __post_init__(self) -> None:
        if not moments.is_label(self.value):
            raise InvalidError(
                f"not a checkpoint label: {self.value[:80]!r}",
                hint="use 1-40 lowercase letters, digits, dots, dashes and underscores",
            )

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class BlueprintName:
    """What a session is made from (E2B: a template)."""

    value: str

    def __post_init__(self) -> None:
        if not images.is_blueprint_name(self.value):
            raise InvalidError(
                f"not a blueprint name: {self.value[:80]!r}",
                hint="name a blueprint `vmsandbox image ls --blueprints` lists (e.g. `base`), "
                "or a snapshot as SESSION:LABEL",
            )


@dataclass(frozen=True)
class SnapshotRef:
    """A checkpoint of a session, as E2B names a snapshot: `SESSION:LABEL`."""

    session: SessionName
    label: CheckpointLabel

    @classmethod
    def parse(cls, text: str) -> SnapshotRef:
        session, sep, label = text.partition(":")
        if not sep:
            raise InvalidError(f"not a snapshot id: {text[:80]!r}", hint="a snapshot id is SESSION:LABEL")
        return cls(SessionName(session), CheckpointLabel(label))

    def __str__(self) -> str:
        return f"{self.session}:{self.label}"


@dataclass(frozen=True)
class GuestPath:
    """A path inside the guest, absolute or relative to the user's home there (as envd takes it). The guest
    resolves it; what it must not hold is what no guest can name (NUL, parts over 255 bytes) or what reads two
    ways (`..`, which the guest would resolve after symlinks and a reader would not)."""

    value: str

    def __post_init__(self) -> None:
        text = self.value
        hint = "give an absolute path in the guest (or one relative to the user's home there), without `..`"
        if not text or "\0" in text:
            raise InvalidError("a guest path must be a non-empty text without NUL", hint=hint)
        if len(text.encode("utf-8", "surrogatepass")) > PATH_BYTES:
            raise InvalidError(f"a guest path is at most {PATH_BYTES} bytes", hint=hint)
        parts = text.split("/")
        if ".." in parts:
            raise InvalidError(f"a guest path may not hold `..`: {text[:200]!r}", hint=hint)
        if any(len(p.encode("utf-8", "surrogatepass")) > PART_BYTES for p in parts):
            raise InvalidError(f"a part of a guest path is at most {PART_BYTES} bytes", hint=hint)

    @property
    def absolute(self) -> bool:
        return self.value.startswith("/")

    def normal(self) -> str:
        """The path without `.`, doubled or trailing slashes (`..` is refused, so nothing resolves away)."""
        return posixpath.normpath(self.value) if self.value != "/" else "/"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class GuestUser:
    """An account in the guest (envd's `user`): its name only; whether it exists is the guest's to say."""

    value: str

    def __post_init__(self) -> None:
        if not USER_RE.match(self.value):
            raise InvalidError(
                f"not an account name: {self.value[:40]!r}",
                hint="leave the user out for the session's user, or give `root`",
            )


@dataclass(frozen=True)
class ProjectPath:
    """A project on this machine that a session captures (as `vmsandbox run PATH` does)."""

    value: Path

    def __post_init__(self) -> None:
        text = str(self.value)
        hint = "give the project's absolute path on this machine, e.g. /home/me/src/app"
        if "\0" in text or not self.value.is_absolute() or ".." in self.value.parts:
            raise InvalidError(f"not an absolute path without `..`: {text[:200]!r}", hint=hint)
        if not self.value.is_dir():
            raise InvalidError(f"no directory at {text[:200]!r}", hint=hint)


@dataclass(frozen=True)
class Token:
    """An id the backend made (a review, an item in it, a hunk): only its characters are checked here; whether
    it names anything is the backend's to say."""

    value: str

    def __post_init__(self) -> None:
        if not TOKEN_RE.match(self.value):
            raise InvalidError(f"not an id: {self.value[:80]!r}", hint="use the ids the review gave, unchanged")

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Digest:
    """The digest a review showed for an item: applying takes it back, so an item changed since is not applied."""

    value: str

    def __post_init__(self) -> None:
        if not DIGEST_RE.match(self.value):
            raise InvalidError(f"not a digest: {self.value[:80]!r}", hint="use the digest the review gave, unchanged")


def fresh_name(prefix: str) -> SessionName:
    """A new session's name when none is given: `prefix` (a blueprint's, a session's: its first 22 characters, `_`
    as `-`, so the name stays within 31) and eight hex digits."""
    stem = prefix.replace("_", "-")[:22].rstrip("-")
    return SessionName(f"{stem}-{secrets.token_hex(4)}")


def tag(text: str) -> str:
    if not TAG_RE.match(text):
        raise InvalidError(f"not a process tag: {text[:80]!r}", hint="a tag is 1-64 printable ASCII characters")
    return text
