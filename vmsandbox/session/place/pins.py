"""What other accounts' sessions rest on.

Every account of the libvirt group shares the image store, yet none can see another's sessions (each keeps
them under its own home). So each session leaves a pin in the store, `images/.pins/<uid>.<session>`: the
image version and the warm-start template its disk rests on. `image rm` and `gc` keep whatever another
account's pin names; an account removes its own pin with the session. The pins directory is sticky: a member
can add pins, and remove only its own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pwd
from dataclasses import dataclass
from pathlib import Path

from vmsandbox import filewrite, paths
from vmsandbox.confine import access

log = logging.getLogger(__name__)

DIR = paths.IMAGE_PINS


@dataclass(frozen=True)
class Pin:
    uid: int
    session: str
    image: str
    template: str | None

    def __str__(self) -> str:
        try:
            who = pwd.getpwuid(self.uid).pw_name
        except KeyError:
            who = f"uid {self.uid}"
        return f"session {self.session} of {who}"


def _dir() -> Path:
    return paths.images_dir() / DIR


def pin(session: str, image: str, template: str | None) -> None:
    """Leave (or update) this account's pin for a session. Where the store takes no pins (not shared), other
    accounts cannot use it either: nothing to tell them."""
    d = _dir()
    data = {"image": image, "template": template, "dir": str(paths.session_paths(session).root)}
    try:
        access.shared_dir(d, sticky=True)
        filewrite.write_atomically(d / f"{os.geteuid()}.{session}", json.dumps(data), mode=0o644)  # others read it
    except OSError as exc:
        log.warning("could not pin session %s in %s: %s", session, d, exc)


def unpin(session: str) -> None:
    with contextlib.suppress(OSError):
        (_dir() / f"{os.geteuid()}.{session}").unlink(missing_ok=True)


def collect(*, dry: bool = False) -> list[str]:
    """gc: this account's pins whose session directory is gone (a session removed behind vmsandbox's back);
    with `dry`, only named."""
    removed: list[str] = []
    for entry in _mine():
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            if not Path(json.loads(entry.read_text())["dir"]).is_dir():
                if not dry:
                    entry.unlink()
                removed.append(entry.name.partition(".")[2])
    return removed


def _mine() -> list[Path]:
    try:
        return sorted(_dir().glob(f"{os.geteuid()}.*"))
    except OSError:
        return []


def of_others() -> list[Pin]:
    """The pins of every other account (unreadable or malformed ones skipped)."""
    found: list[Pin] = []
    try:
        entries = sorted(_dir().iterdir())
    except OSError:
        return found
    for entry in entries:
        uid, _, session = entry.name.partition(".")
        if not uid.isdigit() or int(uid) == os.geteuid() or not session:
            continue
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            data = json.loads(entry.read_text())
            template = data["template"]
            found.append(Pin(int(uid), session, str(data["image"]), str(template) if template else None))
    return found
