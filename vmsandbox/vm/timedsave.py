"""A save with a deadline: the memory guard's stop must not wait on a QEMU that holds its migration (its guest took
it over) while the machine runs out — it has other sessions to stop."""

from __future__ import annotations

import threading
from collections.abc import Callable

from vmsandbox.errors import SaveInFlightError, VmsandboxError

ABORT_WAIT = 30.0  # after the abort: a save that outlives it too is said apart (SaveInFlightError)


def bounded(
    save: Callable[[], object],
    abort: Callable[[], object],
    domain: str,
    deadline: float,
    abort_wait: float = ABORT_WAIT,
) -> None:
    """save(), aborted (abort(): the VM runs on) if it has not ended within `deadline` seconds. A save that ended as
    it was aborted is a save (the VM stopped: its file is all there is of its memory); one that outlives the abort
    by `abort_wait` raises SaveInFlightError, whose outcome() waits for its end and says whether it saved."""
    failed: list[BaseException] = []
    thread = threading.Thread(target=_saving, args=(save, failed), name="save", daemon=True)
    thread.start()
    thread.join(deadline)
    if thread.is_alive():
        abort()
        thread.join(abort_wait)
        if thread.is_alive():
            why = f"the save ended neither in {deadline:g} s nor {abort_wait:g} s after abortJob"

            def outcome() -> bool:
                thread.join()
                return not failed

            raise SaveInFlightError(why, domain, outcome)
        if failed:
            raise VmsandboxError(f"the save did not end within {deadline:g} s: it was aborted, and the VM runs on")
    if failed:
        raise failed[0]


def _saving(save: Callable[[], object], failed: list[BaseException]) -> None:
    try:
        save()
    except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread (SaveInFlightError.outcome: after)
        failed.append(exc)
