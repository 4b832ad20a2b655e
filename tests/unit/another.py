"""A block run in a child process as an account that is not root (nobody, when the tests run as root): what a
person who runs vmsandbox without root meets, where the kernel, not root's override, says what may be read."""

from __future__ import annotations

import json
import os
import resource
from collections.abc import Callable
from pathlib import Path

NOBODY = 65534


def owned(top: Path) -> None:
    """Give `top` and everything in it to the account the block runs as (nobody, when the tests run as root)."""
    if os.geteuid() != 0:
        return
    os.chown(top, NOBODY, NOBODY, follow_symlinks=False)
    for here, dirs, files in os.walk(top):
        for name in dirs + files:
            os.chown(Path(here) / name, NOBODY, NOBODY, follow_symlinks=False)


def run_as_another(block: Callable[[], object], top: Path, *, open_files: int | None = None) -> object:
    """What `block` returns (anything JSON holds), run in a child as nobody (when root) in the directory `top`
    (entered first: the block names what is in it by relative paths, and never passes pytest's directories above
    it, which are root's, 0700), with at most `open_files` descriptors. An exception it raises comes back as
    ["raised", its type's name, its message]."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        os.close(read)
        try:
            os.chdir(top)
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            if open_files is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))
            try:
                said: object = block()
            except Exception as exc:  # noqa: BLE001 - handed to the parent to assert on
                said = ["raised", type(exc).__name__, getattr(exc, "message", str(exc))]
            os.write(write, json.dumps(said, default=repr).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and data, "the child said nothing"
    return json.loads(data)
