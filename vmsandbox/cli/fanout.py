"""A fan-out's run and its summary (`run --fanout N`, `vmsandbox fanout N`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

import typer

from vmsandbox import ui
from vmsandbox.cli.base import columns, sync_limit

if TYPE_CHECKING:
    from vmsandbox.session.options import Run


def fan_out(planned: Run, n: int, check: str | None) -> NoReturn:
    """Run a fan-out and print its summary; exit 0 when every session's command (and check) passed."""
    from vmsandbox.session.moments import fanout

    group, names = fanout.names(planned, n)
    ui.info(f"Fan-out [bold]{group}[/]: {n} session(s), {names[0]} … {names[-1]}")

    outcomes = fanout.fan_out(planned, n, check, limit=sync_limit())
    columns(
        ["SESSION", "EXIT", "TIME", "FILES", "+", "-", "CHECK"],
        [
            [
                o.name,
                "-" if o.code is None else str(o.code),
                f"{o.seconds:.1f}s",
                str(o.files),
                str(o.added),
                str(o.removed),
                {None: "-", True: "pass", False: "FAIL"}[o.check],
            ]
            for o in outcomes
        ],
    )
    for o in outcomes:
        if o.error:
            ui.warn(f"{o.name}: {o.error}")
    ui.info(
        f"Each command's output: fanout.log in the session's directory. Compare them with `vmsandbox compare "
        f"{' '.join(o.name for o in outcomes)}`, take one with `vmsandbox pull NAME`, then "
        f"`vmsandbox destroy --group {group}`"
    )
    raise typer.Exit(0 if outcomes and all(o.ok for o in outcomes) else 1)
