"""The one exception type the core raises; the CLI turns it into a red line and a hint."""

from __future__ import annotations

from collections.abc import Callable


class VmsandboxError(Exception):
    """A failure the user can act on: `message` says what went wrong, `hint` names the fix."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if self.hint is None else f"{self.message} (hint: {self.hint})"


class UsageError(VmsandboxError):
    """A value given on the command line is refused (`--cpus 0`, a bad `--name`): the command was not run as
    written. The CLI exits 2 for it, as for a usage error of the parser, and 1 for any other failure."""


class SaveInFlightError(VmsandboxError):
    """A save past its deadline that libvirt did not abort either: it may yet end, and stop the VM. `outcome()`
    waits for its end and says whether it saved: its file is all there is of the VM's memory then (else the file
    is partial, and the VM runs on)."""

    def __init__(self, message: str, domain: str, outcome: Callable[[], bool]) -> None:
        hint = f"`vmsandbox ls` says whether it was saved or runs on; `virsh domjobabort {domain}` ends the save"
        super().__init__(message, hint=hint)
        self.outcome = outcome
