"""`vmsandbox host setup`, `doctor` and `trust`: the host, its checks, and which project configs you trust."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from vmsandbox import ui
from vmsandbox.cli.base import AsJson, app, host_app, print_json
from vmsandbox.errors import VmsandboxError


@host_app.command("setup")
def host_setup(
    user: Annotated[
        str | None,
        typer.Option("--user", help="who joins the libvirt group and then needs no sudo (default: who ran sudo)"),
    ] = None,
) -> None:
    """Set this machine up where no service manager does it.

    Create the guest-data account and the libvirt group, give /dev/kvm udev's group and mode, start
    virtlogd and libvirtd with the group's socket, share the image store with the group (root).

    Example: `sudo vmsandbox host setup` (you join the libvirt group: log in again, then no more sudo)"""
    from vmsandbox import paths
    from vmsandbox.session import settings as config
    from vmsandbox.vm import hostsetup

    invoker = paths.sudo_invoker()
    if user is None and invoker is not None:
        user = invoker.pw_name
    for line in hostsetup.setup(config.load().libvirt_uri, user):
        ui.info(f"[green]✓[/] {line}")


@app.command()
def doctor(as_json: AsJson = False) -> None:
    """Check everything a session needs; print the fix for each failure.

    Example: `vmsandbox doctor | less`"""
    from vmsandbox import trust
    from vmsandbox.session import settings as config
    from vmsandbox.session.host import doctor as doctor_mod

    try:
        settings = config.load(Path.cwd())
    except trust.UntrustedError as exc:
        ui.warn(f"{exc.message} — checking with your own settings only")
        settings = config.load()
    checks = doctor_mod.run_checks(settings)
    if as_json:
        print_json([{"name": c.name, "level": c.level, "detail": c.detail, "fix": c.fix} for c in checks])
    else:
        marks = {"ok": "[green]✓[/]", "warn": "[yellow]![/]", "fail": "[red]✗[/]"}
        for c in checks:  # the report is this command's output: stdout (`vmsandbox doctor | less`)
            ui.out.print(f"{marks[c.level]} {c.name}: {ui.printable(c.detail)}")
            if c.fix and not c.ok:
                ui.out.print(f"    fix: {ui.printable(c.fix)}")
    failed = [c for c in checks if c.level == "fail"]
    if failed:
        if not as_json:
            ui.out.print(f"[red]A session cannot start here:[/] {len(failed)} check(s) failed.")
        raise typer.Exit(1)


@app.command("trust")
def trust_command(
    path: Annotated[
        Path,
        typer.Argument(help="A project directory (or its .vmsandbox.yaml / a blueprint file in it).", metavar="PATH"),
    ] = Path(),
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Trust without asking (after showing).")] = False,
    revoke: Annotated[bool, typer.Option("--revoke", help="Stop trusting these files.")] = False,
    list_all: Annotated[bool, typer.Option("--list", help="List every trusted file and whether it changed.")] = False,
) -> None:
    """Trust a project's vmsandbox config, after showing what it changes.

    Trust a project's .vmsandbox.yaml and .vmsandbox/blueprints/*.yaml, after showing what they change.

    A project file that widens what a session may do (network, allowlist, secrets, blueprints) is used only
    once you trusted its exact content; a changed file must be trusted again. Trust is kept outside every
    project, in your config directory.

    Example: `vmsandbox trust ~/src/app`
    """
    from vmsandbox import trust
    from vmsandbox.session.host import trust as projecttrust

    if list_all:
        _list_trusted()
        return
    candidates = projecttrust.trust_candidates(path)
    if revoke:
        for c in candidates:
            if trust.revoke(c.path):
                ui.info(f"No longer trusted: {ui.printable(str(c.path))}")
        return
    for c in candidates:
        st = c.state
        label = "trusted" if st.trusted else "changed since you trusted it" if st.changed else "not trusted"
        ui.err.print(f"[bold]{ui.printable(str(c.path))}[/] ({label}, sha256 {trust.digest(c.raw)[:12]})")
        for line in c.lines:
            ui.err.print(f"  {ui.printable(line)}")
    todo = [c for c in candidates if not c.state.trusted]
    if not todo:
        ui.info("Everything shown is trusted already.")
        return
    if not yes:
        if not ui.is_interactive():
            raise VmsandboxError("nothing trusted: no terminal to ask on", hint="rerun with --yes after reading it")
        answer = ui.err.input(f"Trust {len(todo)} file(s) with exactly this content? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            ui.info("Nothing trusted.")
            raise typer.Exit(1)
    for c in todo:
        trust.trust(c.path, c.raw)
        ui.info(f"[green]Trusted[/] {ui.printable(str(c.path))}")


def _list_trusted() -> None:
    from vmsandbox import trust

    for name, entry in sorted(trust.records().items()):
        path = Path(name)
        try:
            raw = trust.read_project_file(path)
        except VmsandboxError:
            raw = None
        state = "missing" if raw is None else "trusted" if trust.state(path, raw).trusted else "changed (untrusted)"
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(entry.get("trusted_at", 0))))
        print(f"{state:20} {when}  {ui.printable(name, markup=False)}")  # the path last: never cut
