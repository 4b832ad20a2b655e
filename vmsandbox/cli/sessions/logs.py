"""`vmsandbox allow`, `deny`, `port`, `logs` and `clean`: what a running session may reach, what it publishes,
what it said."""

from __future__ import annotations

import collections
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated

import typer

from vmsandbox import ui
from vmsandbox.cli import complete
from vmsandbox.cli.base import AsJson, SessionName, app, print_json
from vmsandbox.errors import UsageError, VmsandboxError

HostsArg = Annotated[list[str], typer.Argument(help="HOST, *.DOMAIN or HOST:PORT (one or more).", metavar="HOST")]


@app.command()
def allow(name: SessionName, hosts: HostsArg) -> None:
    """Let a running session reach more hosts.

    Let a running session reach more hosts: its proxy allows them from the next connection on (the change
    is in `vmsandbox logs NAME proxy`). Example: `vmsandbox allow exp1 crates.io '*.crates.io'`"""
    from vmsandbox.session.running import reach as runtime

    added = runtime.allow(name, hosts)
    ui.info(f"Session {name} now also reaches {', '.join(added)}" if added else "Already allowed; nothing changed")


@app.command()
def deny(name: SessionName, hosts: HostsArg) -> None:
    """Take hosts off a running session's allowlist.

    Take hosts off a running session's allowlist: new connections to them are refused (HOST also removes
    its HOST:PORT entries). Example: `vmsandbox deny exp1 registry.npmjs.org`"""
    from vmsandbox.session.running import reach as runtime

    removed = runtime.deny(name, hosts)
    ui.info(f"Session {name} no longer reaches {', '.join(removed)} (new connections)")


@app.command()
def port(
    name: SessionName,
    action: Annotated[str | None, typer.Argument(help="publish or unpublish (none: list).", metavar="ACTION")] = None,
    spec: Annotated[str | None, typer.Argument(help="[HOST_PORT:]GUEST_PORT", metavar="PORT")] = None,
    address: Annotated[
        str | None, typer.Option("--publish-address", help="Publish on this address instead of loopback.")
    ] = None,
    as_json: AsJson = False,
) -> None:
    """Show a session's published ports, or publish / unpublish one while it runs.

    Examples: `vmsandbox port exp1` · `vmsandbox port exp1 publish 3000` (a free host port) ·
    `vmsandbox port exp1 publish 8080:3000` · `vmsandbox port exp1 unpublish 3000`"""
    from vmsandbox.session.options import parse_publish
    from vmsandbox.session.record import Record
    from vmsandbox.session.running import reach as runtime

    if action is not None:
        if action not in ("publish", "unpublish") or spec is None:
            raise UsageError(
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
        str,
        typer.Argument(
            help="console: the VM's serial console; proxy: every egress decision.",
            metavar="[console|proxy]",
            autocompletion=complete.logs,
        ),
    ] = "console",
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new entries.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="proxy: print the JSON lines as they are.")] = False,
    raw: Annotated[
        bool, typer.Option("--raw", help="console: the guest's bytes as they are (escape sequences included).")
    ] = False,
    tail: Annotated[int | None, typer.Option("--tail", "-n", min=0, help="Only the last N lines.")] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="proxy: only entries of the last 30s, 10m, 2h or 1d.")
    ] = None,
) -> None:
    """Show a session's console or egress log.

    The console is the guest's own output: control characters are shown escaped (\\x1b …), so it cannot drive
    your terminal, unless you ask for --raw. The proxy log is every egress decision, allowed or denied.

    Examples:

    `vmsandbox logs exp1 --tail 50`

    `vmsandbox logs exp1 proxy --since 10m --follow`
    """
    from vmsandbox.egress import log as proxylog
    from vmsandbox.session.record import Record

    record = Record.load(name)
    if which not in ("console", "proxy"):
        raise UsageError(f"unknown log {which!r}", hint="available: console, proxy")
    if since is not None and which == "console":
        raise UsageError("--since: the console's lines carry no time", hint="--tail N shows the last lines")
    cutoff = None if since is None else time.time() - parse_age(since)
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

    older = proxylog.rotated(path) if which == "proxy" else None
    lines = log_lines(path, older, follow=follow, stopped=gone, tail=tail)
    if which == "console":
        _print_console(lines, raw=raw, follow=follow)
    else:
        _print_proxy(lines, cutoff=cutoff, as_json=as_json, follow=follow)


def _print_console(lines: Iterator[str], *, raw: bool, follow: bool) -> None:
    for line in lines:
        sys.stdout.write((line if raw else ui.printable(line.rstrip("\r"), markup=False)) + "\n")
        if follow:
            sys.stdout.flush()


def _print_proxy(lines: Iterator[str], *, cutoff: float | None, as_json: bool, follow: bool) -> None:
    from vmsandbox.egress import log as proxylog

    for line in lines:
        event = proxylog.parse(line)
        if event is None or (cutoff is not None and float(event.get("ts", 0)) < cutoff):
            continue
        if as_json:
            print(line, flush=follow)
        else:
            ui.out.print(proxylog.describe(event), soft_wrap=True)
            if follow:
                sys.stdout.flush()


AGES = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_age(text: str) -> float:
    """`30s`, `10m`, `2h`, `1d` (or plain seconds) in seconds."""
    found = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd]?)", text.strip())
    if found is None:
        raise UsageError(f"--since {text!r}: expected a duration", hint="e.g. --since 30s, 10m, 2h or 1d")
    return float(found.group(1)) * AGES[found.group(2) or "s"]


def log_lines(
    path: Path, older: Path | None, *, follow: bool, stopped: Callable[[], bool], tail: int | None
) -> Iterator[str]:
    """A log's lines (its rotated part first, when not following), the last `tail` of them only, then with
    `follow` the new ones as they come."""
    from vmsandbox.egress import log as proxylog

    if tail is None:
        if older is not None and older.exists() and not follow:
            yield from proxylog.read(older, follow=False)
        yield from proxylog.read(path, follow=follow, stopped=stopped)
        return
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        text = b""
    whole = text[: text.rfind(b"\n") + 1]  # a line being written is read when it ends
    last: collections.deque[str] = collections.deque(maxlen=tail)
    if older is not None and older.exists():
        last.extend(proxylog.read(older, follow=False))
    last.extend(whole.decode(errors="replace").splitlines())
    yield from last
    if follow:
        yield from proxylog.read(path, follow=True, stopped=stopped, offset=len(whole))


@app.command()
def clean(name: SessionName) -> None:
    """Wipe the credentials a running session holds.

    Wipe volatile credentials in a running session (agent auth files, git credentials, the placeholders
    the proxy swaps for secrets, which it stops honouring); the workspace is not touched.

    Example: `vmsandbox clean exp1`
    """
    from vmsandbox.cli.attach import ready
    from vmsandbox.session.running import clean as cleaning

    removed = cleaning.clean(ready(name))
    for path in removed:
        ui.err.print(f"  [red]removed[/] {ui.printable(path)}")
    ui.info(f"Session {name}: {len(removed)} credential file(s) removed, placeholders revoked; workspace untouched.")
