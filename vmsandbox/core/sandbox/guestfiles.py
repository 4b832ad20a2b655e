"""The guest's side of a sandbox's files (files.py sends this file to the guest's python3 over the session's ssh,
at every call, run as the user the file is read or written as: `runuser -u USER -- python3 …`; nothing of it is
installed in the image). A relative path is relative to that user's home; each verb answers one JSON line, or
an error as {"error": KIND, "message": …} with exit code 3:

    stat PATH · ls PATH DEPTH · mkdir PATH · mv FROM TO · rm PATH · write PATH (the bytes on stdin)

This file imports nothing of vmsandbox: it runs in the guest.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import sys
from typing import Any

CHUNK = 64 * 1024  # what `write` reads of its stdin at a time


class Refused(Exception):  # noqa: N818 - an answer: (kind, message)
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _path(given: str) -> str:
    home = pwd.getpwuid(os.getuid()).pw_dir
    return os.path.normpath(os.path.join(home, given))


def _entry(path: str) -> dict[str, Any]:
    import grp
    import stat as st_mod

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise Refused("not_found", f"{path} does not exist") from None
    except PermissionError:
        raise Refused("refused", f"{path}: permission denied") from None
    kind = ("dir" if st_mod.S_ISDIR(st.st_mode) else "file" if st_mod.S_ISREG(st.st_mode)
            else "symlink" if st_mod.S_ISLNK(st.st_mode) else "other")  # fmt: skip
    owner, group = str(st.st_uid), str(st.st_gid)
    with contextlib.suppress(KeyError):
        owner = pwd.getpwuid(st.st_uid).pw_name
    with contextlib.suppress(KeyError):
        group = grp.getgrgid(st.st_gid).gr_name
    return {
        "name": os.path.basename(path) or path, "type": kind, "path": path, "size": st.st_size,
        "mode": st_mod.S_IMODE(st.st_mode), "permissions": st_mod.filemode(st.st_mode), "owner": owner,
        "group": group, "modified": st.st_mtime, "target": os.readlink(path) if kind == "symlink" else None,
    }  # fmt: skip


def _listing(path: str, depth: int) -> list[dict[str, Any]]:
    if _entry(path)["type"] != "dir":
        raise Refused("refused", f"{path} is not a directory")
    found: list[dict[str, Any]] = []
    todo = [(path, 1)]
    while todo:
        where, level = todo.pop(0)
        try:
            names = sorted(os.listdir(where))
        except PermissionError:
            continue
        for name in names:
            entry = _entry(os.path.join(where, name))
            found.append(entry)
            if entry["type"] == "dir" and level < depth:
                todo.append((entry["path"], level + 1))
    return found


def _mkdir(where: str) -> dict[str, Any]:
    if os.path.lexists(where):
        raise Refused("exists", f"{where} exists already")
    os.makedirs(where)
    return _entry(where)


def _write(path: str) -> dict[str, Any]:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.vmsandbox-{os.getpid()}"
    with open(tmp, "wb") as f:
        while data := sys.stdin.buffer.read(CHUNK):
            f.write(data)
    os.replace(tmp, path)
    return _entry(path)


def files(verb: str, args: list[str]) -> None:
    import shutil

    try:
        if verb == "stat":
            said: Any = _entry(_path(args[0]))
        elif verb == "ls":
            said = _listing(_path(args[0]), int(args[1]))
        elif verb == "mkdir":
            said = _mkdir(_path(args[0]))
        elif verb == "mv":
            os.rename(_path(args[0]), _path(args[1]))
            said = _entry(_path(args[1]))
        elif verb == "rm":
            where = _path(args[0])
            if _entry(where)["type"] == "dir":
                shutil.rmtree(where)
            else:
                os.unlink(where)
            said = None
        else:
            said = _write(_path(args[0]))
    except Refused as exc:
        print(json.dumps({"error": exc.kind, "message": str(exc)}))
        sys.exit(3)
    except FileNotFoundError as exc:
        print(json.dumps({"error": "not_found", "message": f"{exc.filename}: no such file or directory"}))
        sys.exit(3)
    except OSError as exc:
        print(json.dumps({"error": "refused", "message": f"{exc.filename}: {exc.strerror}"}))
        sys.exit(3)
    print(json.dumps(said))


if __name__ == "__main__":
    files(sys.argv[1], sys.argv[2:])
