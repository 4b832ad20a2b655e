"""`vmsandbox ls`, `stop`, `start`, `port`, `logs`, `clean`, `destroy` and `gc`: looking at sessions, pausing
and ending them."""

from __future__ import annotations

import itertools
import sys
from typing import Annotated

import typer

from vmsandbox import ui
from vmsandbox.cli.base import ALIASES, AsJson, Quiet, SessionName, age, app, columns, print_json, sync_limit
from vmsandbox.errors import VmsandboxError


@app.command("ls")
def ls(as_json: AsJson = False, quiet: Quiet = False) -> None:
    """List sessions (`-q`: names only). Lists what it knows even when libvirt does not answer.

    Example: `vmsandbox ls -q`"""
    from vmsandbox.session import config, state

    rows = [s.as_dict() for s in state.all_status(config.load().libvirt_uri)]
    if as_json:
        print_json(rows)
        return
    if quiet:
        for r in rows:
            print(r["name"])
        return
    if not rows:
        ui.info("No sessions.")
        return
    headers = ["NAME", "STATE", "AGE", "ACCEL", "SSH", "MEMORY", "DISK", "NETWORK", "UNSYNCED", "HOST", "PROJECT"]
    columns(
        headers,
        [
            [
                r["name"],
                r["state"],
                age(r["age_seconds"]),
                r["accel"],
                f"127.0.0.1:{r['ports']['ssh']}",
                f"{r['memory_mib']} MiB",
                f"{r['disk_bytes'] / 1024**2:.0f} MiB",
                r["network"] + ("" if r["egress"] in ("up", "off") else f" ({r['egress']})"),
                "?" if r["unsynced"] is None else str(r["unsynced"]),
                r["host"],
                r["project"],
            ]
            for r in rows
        ],
    )


for _alias in ("ps", "list"):
    app.command(_alias, help="Same as `ls`.", rich_help_panel=ALIASES)(ls)


@app.command()
def stop(name: SessionName) -> None:
    """Stop a kept session: save its VM (memory and devices) to disk and free its CPU and RAM.
    `vmsandbox start NAME` resumes it where it was; `pull`, `diff` and `destroy` work while it is stopped.

    Example: `vmsandbox stop exp1`
    """
    from vmsandbox.session import suspend

    saved = suspend.where_saved(suspend.stop(name))
    ui.info(f"Stopped session [bold]{name}[/] ({saved}); `vmsandbox start {name}` resumes it")


@app.command()
def start(name: SessionName) -> None:
    """Resume a stopped session where it was: its processes, files, egress and published ports.

    Example: `vmsandbox start exp1`"""
    from vmsandbox.session import suspend

    suspend.start(name)
    ui.info(f"Session [bold]{name}[/] is running again: `vmsandbox shell {name}`")


HostsArg = Annotated[list[str], typer.Argument(help="HOST, *.DOMAIN or HOST:PORT (one or more).")]


@app.command()
def allow(name: SessionName, hosts: HostsArg) -> None:
    """Let a running session reach more hosts: its proxy allows them from the next connection on (the change
    is in `vmsandbox logs NAME proxy`). Example: `vmsandbox allow exp1 crates.io '*.crates.io'`"""
    from vmsandbox.session import runtime

    added = runtime.allow(name, hosts)
    ui.info(f"Session {name} now also reaches {', '.join(added)}" if added else "Already allowed; nothing changed")


@app.command()
def deny(name: SessionName, hosts: HostsArg) -> None:
    """Take hosts off a running session's allowlist: new connections to them are refused (HOST also removes
    its HOST:PORT entries). Example: `vmsandbox deny exp1 registry.npmjs.org`"""
    from vmsandbox.session import runtime

    removed = runtime.deny(name, hosts)
    ui.info(f"Session {name} no longer reaches {', '.join(removed)} (new connections)")


@app.command()
def port(
    name: SessionName,
    action: Annotated[str | None, typer.Argument(help="publish or unpublish (none: list).")] = None,
    spec: Annotated[str | None, typer.Argument(help="[HOST_PORT:]GUEST_PORT")] = None,
    address: Annotated[
        str | None, typer.Option("--publish-address", help="Publish on this address instead of loopback.")
    ] = None,
    as_json: AsJson = False,
) -> None:
    """Show a session's published ports, or publish / unpublish one while it runs.

    Examples: `vmsandbox port exp1` · `vmsandbox port exp1 publish 3000` (a free host port) ·
    `vmsandbox port exp1 publish 8080:3000` · `vmsandbox port exp1 unpublish 3000`"""
    from vmsandbox.session import runtime
    from vmsandbox.session.options import parse_publish
    from vmsandbox.session.record import Record

    if action is not None:
        if action not in ("publish", "unpublish") or spec is None:
            raise VmsandboxError(
                f"`vmsandbox port {name} {action}` needs publish or unpublish and a port",
                hint=f"e.g. `vmsandbox port {name} publish 3000`",
            )
        wanted = parse_publish(spec, address)
        if action == "publish":
            done = runtime.publish(name, wanted)
            ui.info(f"Guest port {done.guest} is published on {', '.join(done.places())}")
        else:
            for gone in runtime.unpublish(name, wanted.guest, wanted.host):
                ui.info(f"Guest port {gone.guest} is no longer published on {', '.join(gone.places())}")
        return
    record = Record.load(name)
    if as_json:
        print_json([p.as_dict() for p in record.publish])
        return
    if not record.publish:
        ui.info(f"Session {name} publishes no ports (`vmsandbox port {name} publish [HOST_PORT:]GUEST_PORT`).")
        return
    for p in record.publish:
        for where in p.places():
            print(f"{p.guest}/tcp -> {where}")


@app.command()
def logs(
    name: SessionName,
    which: Annotated[
        str, typer.Argument(help="console: the VM's serial console; proxy: every egress decision.")
    ] = "console",
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new entries.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="proxy: print the JSON lines as they are.")] = False,
    raw: Annotated[
        bool, typer.Option("--raw", help="console: the guest's bytes as they are (escape sequences included).")
    ] = False,
) -> None:
    """Show a session's logs. The console is the guest's own output: control characters are shown escaped
    (\\x1b …), so it cannot drive your terminal, unless you ask for --raw.

    Example: `vmsandbox logs exp1 proxy --follow`
    """
    from vmsandbox.egress import log as proxylog
    from vmsandbox.session.record import Record

    record = Record.load(name)
    if which not in ("console", "proxy"):
        raise VmsandboxError(f"unknown log {which!r}", hint="available: console, proxy")
    path = record.files.console_log if which == "console" else record.files.proxy_log
    if which == "console":
        from vmsandbox.session import state

        state.refresh_console(record, follow=follow)
    if not follow and not path.exists():
        if which == "proxy":
            ui.info(f"Session {name} has made no requests through its egress proxy yet.")
            return
        raise VmsandboxError(f"session {name} has no console log yet")

    def gone() -> bool:
        return not record.files.record.exists()

    if which == "console":
        for line in proxylog.read(path, follow=follow, stopped=gone):
            text = line if raw else ui.printable(line.rstrip("\r"), markup=False)
            sys.stdout.write(text + "\n")
            if follow:
                sys.stdout.flush()
        return
    older = proxylog.rotated(path)
    lines = proxylog.read(older, follow=False) if older.exists() and not follow else iter(())
    for line in itertools.chain(lines, proxylog.read(path, follow=follow, stopped=gone)):
        if as_json:
            print(line, flush=follow)
            continue
        event = proxylog.parse(line)
        if event is not None:
            ui.out.print(proxylog.describe(event), soft_wrap=True)
            if follow:
                sys.stdout.flush()


@app.command()
def clean(name: SessionName) -> None:
    """Wipe volatile credentials in a running session (agent auth files, git credentials, the placeholders
    the proxy swaps for secrets, which it stops honouring); the workspace is not touched.

    Example: `vmsandbox clean exp1`
    """
    from vmsandbox.cli.run import _ready
    from vmsandbox.session import clean as cleaning

    removed = cleaning.clean(_ready(name))
    for path in removed:
        ui.err.print(f"  [red]removed[/] {ui.printable(path)}")
    ui.info(f"Session {name}: {len(removed)} credential file(s) removed, placeholders revoked; workspace untouched.")


@app.command()
def destroy(
    name: Annotated[str, typer.Argument(help="Session name (with --group: the fan-out's name).")],
    force: Annotated[
        bool, typer.Option("--force", help="Destroy even with unsynced changes (they are exported to the outbox).")
    ] = False,
    discard: Annotated[bool, typer.Option("--discard", help="Destroy and throw unsynced changes away.")] = False,
    group: Annotated[bool, typer.Option("--group", help="Destroy every session of the fan-out NAME.")] = False,
) -> None:
    """Destroy a session's VM and remove its files — never silently losing unsynced changes.

    Examples: `vmsandbox destroy exp1` (refused while changes are unsynced) · `vmsandbox destroy --group exp`"""
    from vmsandbox.session import config, lifecycle, lock
    from vmsandbox.session.record import Record, validate_name

    if group:
        _destroy_group(name, force=force, discard=discard)
        return

    try:
        record = Record.load(name)
    except VmsandboxError:
        if discard:
            removed = lifecycle.remove_damaged(validate_name(name), config.load().libvirt_uri)
            if removed is not None:
                ui.info(f"Removed the damaged session directory {removed}")
                return
        raise
    with lock.held(record.files, name, "destroying"):
        record = Record.load(name)
        end = lifecycle.destroy(record, force=force, discard=discard, limit=sync_limit())
    ui.info(f"[green]✓[/] Destroyed {record.domain}")
    if end.outbox is not None:
        ui.info(f"{end.left} unsynced change(s) exported to {end.outbox}")
        ui.info(f"Review them later with `vmsandbox recover {name}`; drop them with `destroy {name} --discard`.")


app.command("rm", help="Same as `destroy`.", rich_help_panel=ALIASES)(destroy)


def _destroy_group(group: str, *, force: bool, discard: bool) -> None:
    """Destroy a fan-out's sessions; the ones holding unsynced changes are kept (unless --force/--discard)
    and named, and the command fails if any was."""
    from vmsandbox.session import fanout, lifecycle, lock
    from vmsandbox.session.record import Record

    members = fanout.group_members(group)
    if not members:
        raise VmsandboxError(f"no fan-out named {group!r}", hint="`vmsandbox ls` lists sessions")
    refused = []
    for record in members:
        try:
            with lock.held(record.files, record.name, "destroying"):
                end = lifecycle.destroy(Record.load(record.name), force=force, discard=discard, limit=sync_limit())
        except VmsandboxError as exc:
            refused.append(record.name)
            ui.warn(exc.message)
            continue
        ui.info(
            f"[green]✓[/] Destroyed {record.domain}"
            + (f" ({end.left} change(s) kept in {end.outbox})" if end.outbox else "")
        )
    if refused:
        raise VmsandboxError(
            f"{len(refused)} session(s) of {group} were kept: {', '.join(refused)}",
            hint=f"pull what you want first; `vmsandbox destroy --group {group} --discard` throws the rest away",
        )


@app.command()
def gc() -> None:
    """Remove sessions whose VM is gone or whose `vmsandbox run` died, and orphaned vmsandbox domains (here, and
    this machine's on every host under `hosts:`; a host that does not answer is said and skipped). Sessions
    holding unsynced changes are kept (a stopped VM's changes are exported to its outbox).

    Example: `vmsandbox gc`
    """
    from vmsandbox.session import config, lifecycle

    settings = config.load()
    done = list(lifecycle.gc(settings.libvirt_uri, limit=sync_limit(), hosts=settings.hosts))
    for line in done:
        ui.info(line)
    if not done:
        ui.info("Nothing to clean up.")
