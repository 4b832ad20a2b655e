"""The one exception type the core raises; the CLI turns it into a red line and a hint."""

from __future__ import annotations


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
    """A save past its deadline that libvirt did not abort either: it may yet end and stop the VM, so its file is
    kept and the session counted as saved (a VM that runs on is listed as running all the same)."""

    def __init__(self, message: str) -> None:
        hint = "`vmsandbox ls` says whether it was saved or runs on; `virsh domjobabort DOMAIN` ends the save"
        super().__init__(message, hint=hint)
