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
