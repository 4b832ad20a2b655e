"""`vmsandbox checkpoint create|ls|rm|restore`: a running session's whole state — memory, disks, workspace — kept
to return to (or to copy: `vmsandbox create --from NAME:LABEL`)."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from vmsandbox import ui
from vmsandbox.cli import output
from vmsandbox.cli.base import Label, SessionName, age, noun
from vmsandbox.cli.output import AsJson, Column, Listing, Output, Quiet

checkpoint = noun(
    "checkpoint",
    "A session's state kept to return to: create, ls, rm, restore.\n\n"
    "Its memory (its processes), disks and workspace; `vmsandbox create --from NAME:LABEL` copies one into a new "
    "session.\n\n"
    "Examples: `vmsandbox checkpoint create exp1 before` · `vmsandbox checkpoint restore exp1 before` (later)",
)


def _mib(size: int | None) -> str:
    return "? MiB" if size is None else f"{size / 1024**2:.0f} MiB"


@checkpoint.command("create")
def create(
    name: SessionName,
    label: Annotated[
        str | None, typer.Argument(help="A label for it \\[default: cp-DATE-TIME].", metavar="LABEL")
    ] = None,
) -> None:
    """Take a checkpoint of a running session.

    Its memory (its processes), disks and workspace are kept while it runs on: the guest pauses for the save's
    last pass (under TCG with a QEMU older than 9.0, for the save: a second or two), and writes into the workspace
    wait about a second (a guest that cannot freeze its workspace pauses for a few seconds instead).

    Example: `vmsandbox checkpoint create exp1 before-refactor`"""
    from vmsandbox.core import moments

    cp = moments.take(name, label)
    ui.info(
        f"[green]✓[/] Checkpoint [bold]{cp.label}[/] of session {name} ({_mib(cp.size)}, {cp.seconds or 0:.1f} s); "
        f"`vmsandbox checkpoint restore {name} {cp.label}` returns to it"
    )


CHECKPOINTS = Listing(
    fields=("label", "created", "overlay", "bytes"),
    columns=(
        Column("label"),
        Column("age", made=lambda r: age(time.time() - r["created"])),
        Column("size", made=lambda r: _mib(r["bytes"])),
    ),
    example="{{.Label}} {{.Size}}",
    key="label",
)


@checkpoint.command("ls")
def ls(
    name: SessionName,
    as_json: AsJson = False,
    quiet: Quiet = False,
    fmt: Annotated[str | None, output.format_option(CHECKPOINTS.example)] = None,
    wide: Output = None,
) -> None:
    """List a session's checkpoints, oldest first, with their age and size on disk.

    Examples: `vmsandbox checkpoint ls exp1` · `vmsandbox checkpoint ls exp1 --format '{{.Label}} {{.Bytes}}'`"""
    from vmsandbox.core import moments

    shape = CHECKPOINTS.shape(as_json=as_json, quiet=quiet, fmt=fmt, output=wide)
    rows = [c.as_dict() for c in moments.kept(name)]
    empty = f"Session {name} has no checkpoints: `vmsandbox checkpoint create {name} [LABEL]` takes one."
    CHECKPOINTS.show(rows, shape, empty=empty)


@checkpoint.command("rm")
def rm(name: SessionName, label: Label) -> None:
    """Remove a checkpoint of a session.

    Example: `vmsandbox checkpoint rm exp1 before-refactor`"""
    from vmsandbox.core import moments

    moments.remove(name, label)
    ui.info(f"Removed checkpoint {label} of session {name}")


@checkpoint.command("restore")
def restore(name: SessionName, label: Label) -> None:
    """Return a session to one of its checkpoints.

    Its processes, files and disks come back as they were then. Changes not yet pulled are exported first (a
    patch and the files), never lost.

    Example: `vmsandbox checkpoint restore exp1 before-refactor`"""
    from vmsandbox.core import moments

    back = moments.restore(name, label)
    if back.box is not None:
        ui.info(f"{back.left} unsynced change(s) from before the restore are kept in {back.box}")
        ui.info(f"  (its changes.patch applies with `git apply`; the changed files are in {back.box}/files)")
    ui.info(f"[green]✓[/] Session {name} is back at checkpoint {label} ({back.seconds:.1f} s)")
