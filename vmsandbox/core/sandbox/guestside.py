"""A guest side of the sandbox (supervisor.py for processes, guestfiles.py for files): sent as one `python3 -c`
argument with each call (never installed in the image), run over the session's pinned ssh as root or as an
account, its words shown as a client or a log may show them."""

from __future__ import annotations

import base64
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from vmsandbox import proc, ui
from vmsandbox.core.sessions import Endpoint

CALL_TIMEOUT = 120.0
SSH = ("-T", "-a")  # no terminal; never the host's agent, even for a session made with --ssh-agent
SUPERVISOR = "supervisor.py"  # the guest's side of processes (files have theirs: files.GUEST_SIDE)


def guest_program(script: str = SUPERVISOR) -> str:
    """A guest side (a file beside this one), as one `python3 -c` argument (never installed in the image)."""
    code = (Path(__file__).parent / script).read_bytes()
    loader = (
        f"import base64, sys; exec(compile(base64.b64decode({base64.b64encode(code).decode()!r}), 'vmsandbox', 'exec'))"
    )
    return f"python3 -c {shlex.quote(loader)}"


def guest_call(
    endpoint: Endpoint,
    args: Sequence[str],
    *,
    input: bytes | IO[bytes] | None = None,
    as_user: str | None = None,
    script: str = SUPERVISOR,
) -> proc.Result:
    """One verb of a guest side (`script`), as root or (`as_user`) as that account; `input` bytes, or a file
    streamed in (never read whole here)."""
    run = f"{guest_program(script)} {shlex.join(args)}"
    if as_user is not None:
        run = f"runuser -u {shlex.quote(as_user)} -- {run}"
    argv = [*endpoint.ssh_argv(*SSH, user="root"), "--", run]
    if input is None or isinstance(input, bytes):
        return proc.run(argv, input=input, check=False, timeout=CALL_TIMEOUT)
    child = proc.start(argv, stdin=input)
    return proc.finish(child, check=False, timeout=CALL_TIMEOUT)


def said(text: str, most: int = 300) -> str:
    """A guest's words (its stderr, its messages) as a client or a log may show them: their characters as they
    are (ui.visible: no escape, no reordering), at most `most` of them."""
    return ui.visible(text.strip()[-most:])
