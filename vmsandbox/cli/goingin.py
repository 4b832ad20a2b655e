"""Before boot: the project's files that look like credentials are named, and left out of the VM unless the
user sends them (sync/inbound.py). At a terminal the person chooses; elsewhere they stay out, said in a line."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from vmsandbox import ui

if TYPE_CHECKING:
    from vmsandbox.session.options import Run

SHOWN = 10  # files named one per line; the rest counted


def screen(planned: Run, *, send: bool) -> Run:
    """`planned` with the files that look like credentials left out (unless `send`, or the person says so)."""
    from vmsandbox.sync.inward import leftout as inbound

    project = planned.options.project.resolve()
    with ui.step("Looking for credentials in the project before it goes into the VM"):
        found = inbound.credentials_in(project)
    if not found or send:
        return planned
    ui.warn(f"{len(found)} file(s) of the project look like credentials:")
    for f in found[:SHOWN]:
        ui.err.print(f"    {ui.printable(f.path)}: {ui.printable(f.what)}", highlight=False)
    if len(found) > SHOWN:
        ui.err.print(f"    … and {len(found) - SHOWN} more", highlight=False)
    if ui.is_interactive():
        answer = ""
        while answer not in ("y", "n"):
            answer = ui.err.input("  Leave them out of the VM? [Y/n] ").strip().lower()[:1] or "y"
        if answer == "n":
            return planned
    ui.info(
        "They stay out of the VM (the project keeps them). To send them: `--send-secrets`; to leave out more, or to "
        f"silence this, name paths in {inbound.IGNORE_FILE} (gitignore syntax); secrets the agent needs go through "
        "`vmsandbox secret set` (the VM sees a placeholder)"
    )
    options = dataclasses.replace(planned.options, leave_out=tuple(f.path for f in found))
    return dataclasses.replace(planned, options=options)
