"""`vmsandbox ls` and `inspect`: what sessions there are, and one (or several) in full — or as the ssh config an
editor reaches it with."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import typer

from vmsandbox import ui
from vmsandbox.cli import complete, output
from vmsandbox.cli.base import AllSessions, SessionNames, age, app, each_session
from vmsandbox.cli.output import AsJson, Column, Listing, Output, Quiet
from vmsandbox.errors import UsageError

FIELDS = (  # what a row has (`ls --json` gives each of them; --format names them)
    "name", "state", "host", "created", "age_seconds", "project", "accel", "ports", "cpus", "memory_mib", "image",
    "keep", "domain", "unsynced", "network", "blueprint", "publish", "egress", "start", "group", "forked_from",
    "disk_bytes", "memory", "problem", "hint",
)  # fmt: skip
Filter = Annotated[
    list[str] | None,
    typer.Option(
        "--filter",
        "-f",
        metavar="KEY=VALUE",
        help=f"Only sessions with KEY=VALUE[,KEY=VALUE] ({', '.join(complete.FILTER_KEYS)}; repeatable).",
        autocompletion=complete.filters,
    ),
]


def _ssh(r: dict[str, Any]) -> str | None:
    ssh = (r.get("ports") or {}).get("ssh")
    return None if ssh is None else f"127.0.0.1:{ssh}"


def _network(r: dict[str, Any]) -> str:
    return str(r["network"]) + ("" if r["egress"] in ("up", "off") else f" ({r['egress']})")


def _or_dash(show: Any) -> Any:
    """A cell of a damaged session, which has a name and a problem only: `-`."""
    return lambda r: "-" if r["state"] == "damaged" else show(r)


Every = Annotated[
    bool,
    typer.Option("--all", "-a", help="Every session, stopped ones too: `ls` lists them all anyway (docker's ps -a)."),
]
SESSIONS = Listing(
    fields=FIELDS,
    columns=(
        Column("name"),
        Column("state"),
        Column("age", made=lambda r: None if "age_seconds" not in r else age(r["age_seconds"])),
        Column("ssh", made=_ssh),
        Column("network", _or_dash(_network)),
        Column("unsynced", _or_dash(lambda r: "?" if r["unsynced"] is None else str(r["unsynced"]))),
        Column("mem", made=lambda r: f"{r['memory']['pss_mib']}M" if r.get("memory") else None),
        Column("host"),
        Column("project"),
    ),
    example="{{.Name}} {{.State}} {{.Ssh}}",
    keep=("state", "ssh", "project", "unsynced", "age", "network", "host", "mem"),
)


@app.command("ls")
def ls(
    as_json: AsJson = False,
    quiet: Quiet = False,
    fmt: Annotated[str | None, output.format_option(SESSIONS.example)] = None,
    wide: Output = None,
    filters: Filter = None,
    every: Every = False,
) -> None:
    """List sessions.

    It lists what it knows even when libvirt does not answer; a session whose record is damaged is a row of its
    own (`vmsandbox rm NAME --discard` removes it). A broken config is said in a line first, and the rest of it
    used. Values are whole: columns that do not fit the terminal are left out, as said below the table (`-o wide`
    shows them all; `--json` and `vmsandbox inspect NAME` give every field).
    MEM: what a running session's VM takes of this machine now (its proportional share: the pages of its
    template's memory it never wrote are shared by every session of that template, and count a share each);
    `inspect` splits it into shared and private, `vmsandbox host ls` says how many more sessions fit.

    Examples: `vmsandbox ls -q` · `vmsandbox ls --filter state=running --format '{{.Name}} {{.Ports.ssh}}'` ·
    `vmsandbox ls --format 'table {{.Name}}\\t{{.MemoryMib}}\\t{{.Project}}'` · `vmsandbox ls -o wide`"""
    from vmsandbox.core import listing

    del every  # every session is listed, running or not
    shape = SESSIONS.shape(as_json=as_json, quiet=quiet, fmt=fmt, output=wide)  # refused before anything is asked
    keys = {k: (complete.filter_values(k) if k in complete.CHECKED_FILTERS else None) for k in complete.FILTER_KEYS}
    wanted = output.filters(filters or [], keys)
    broken: list[str] = []
    rows = [r for r in listing.rows(broken) if output.matches(r, wanted)]
    for line in broken:  # a line before the table, never in its way: the listing goes on with what passes
        ui.warn(line)
    empty = (
        "No session matches; `vmsandbox ls` lists them all."
        if wanted
        else "No sessions. Start one with `vmsandbox run .` (a command, then the review) or `vmsandbox create .`"
    )
    SESSIONS.show(rows, shape, empty=empty)


@app.command()
def inspect(
    names: SessionNames = None,
    every: AllSessions = False,
    fmt: Annotated[
        str | None,
        typer.Option(
            "--format",
            "-f",
            metavar="FORMAT",
            help="json, ssh-config (a `Host vmsandbox-NAME` block for ~/.ssh/config), or a template: '{{.State}}'.",
            autocompletion=complete.formats,
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="A JSON array, an object for each (as docker inspect).")
    ] = False,
) -> None:
    """Show everything known of sessions, or their ssh config.

    Each session's state, host, image, resources, network and published ports, files, checkpoints and how to reach
    it. `--format ssh-config` prints the block VS Code's or Cursor's Remote-SSH, JetBrains Gateway and `ssh
    vmsandbox-NAME` attach with (its port, key and pinned host key).

    Examples: `vmsandbox inspect exp1` · `vmsandbox inspect exp1 --format '{{.State}}'` · `vmsandbox inspect
    --format ssh-config exp1 >> ~/.ssh/config`"""
    from vmsandbox.core import listing

    output.formats(fmt, ("ssh-config",))
    shaped = output.template(fmt, [*FIELDS, "checkpoints", "files", "user", "stopped_by"])
    if fmt == "ssh-config":
        _ssh_config(names, every)
        return
    if as_json or fmt == "json":
        if not (every or names):
            raise UsageError("`inspect` needs a session name", hint="`vmsandbox inspect NAME...`, or `--all`")
        output.print_json([listing.inspect(n) for n in (listing.names() if every else names or [])])
        return

    def one(name: str) -> None:
        row = listing.inspect(name)
        if shaped is not None:
            print(shaped.render(row))
            return
        _print_row(row)

    each_session(names, every, verb="inspect", which=listing.names, act=one)


def _print_row(row: dict[str, Any]) -> None:
    """`key: value` lines, a dict's as `key.sub: value`; when it was created as this machine's local time (`--json`
    gives the seconds since the epoch)."""
    for key, value in row.items():
        if key == "created" and isinstance(value, int | float):
            print(f"created: {datetime.fromtimestamp(value).astimezone():%Y-%m-%d %H:%M:%S %Z}")
        elif isinstance(value, dict):
            for k, v in value.items():
                print(f"{key}.{k}: {'-' if v is None else v}")
        elif isinstance(value, list):
            print(f"{key}: {', '.join(str(v) for v in value) or '-'}")
        else:
            print(f"{key}: {'-' if value is None else value}")


def _ssh_config(names: list[str] | None, every: bool) -> None:
    from vmsandbox.core import listing

    printed: list[str] = []

    def one(name: str) -> None:  # blocks apart by a blank line; a session that has none is named at the end
        block = listing.ssh_config(name)
        print(("\n" if printed else "") + block, end="", flush=True)
        printed.append(name)

    each_session(names, every, verb="inspect", which=listing.names, act=one)
