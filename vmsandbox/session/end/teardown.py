"""The end of a `run` without the wait: the review is done and the exit code known, so destroying the VM
(1 to 3 s) happens in a process of its own (started by lifecycle.finish), which holds the session's lock while it
works. If it is killed, the record still says how the session ends (Record.ending) and `gc` finishes the job.

    python -m vmsandbox.session.end.teardown NAME
"""

from __future__ import annotations

import sys

from vmsandbox import failpoint, paths
from vmsandbox.errors import VmsandboxError
from vmsandbox.session import lock
from vmsandbox.session.end import lifecycle
from vmsandbox.session.record import Record


def main(argv: list[str]) -> int:
    (name,) = argv
    try:
        with lock.held(paths.session_paths(name), name, lock.TEARDOWN, wait=True):
            record = Record.load(name)  # as the run that handed it over left it
            if record.ending is not None:
                failpoint.hit("run.teardown")
                lifecycle.end_now(record)
    except VmsandboxError as exc:
        print(f"teardown of session {name}: {exc.message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
