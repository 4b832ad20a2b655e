"""`vmsandbox ls` (`ps`, `list`), `inspect` and `ssh-config`: what sessions there are, one session in full,
and how an editor or an ssh client reaches one."""

from __future__ import annotations

import fnmatch
import string
from typing import Annotated, Any

import typer

from vmsandbox import ui
from vmsandbox.cli.base import (
    ALIASES,
    AllSessions,
    AsJson,
    Quiet,
    SessionName,
    SessionNames,
    age,
    app,
    columns,
    each_session,
    print_json,
)
from vmsandbox.errors import UsageError, VmsandboxError

FILTER_KEYS = ("name", "state", "host", "network", "blueprint", "group", "project")
REACHABLE = ("running", "paused", "booting")  # the states in which the session's SSH port answers
Format = Annotated[
    str | None,
    typer.Option(
        "--format", metavar="FORMAT", help="Print each session with a Python format string, e.g. '{name} {state}'."
    ),
]
Filter = Annotated[
    list[str] | None,
    typer.Option(
        "--filter",
        "-f",
        metavar="KEY=VALUE",
        help=f"Only sessions with KEY=VALUE[,KEY=VALUE] ({', '.join(FILTER_KEYS)}).",
    ),
]


def parse_filters(given: list[str]) -> dict[str, set[str]]:
    """`--filter state=running,host=local` (and more --filter): each key must match one of its values."""
    wanted: dict[str, set[str]] = {}
    for part in (p for text in given for p in text.split(",") if p):
        key, eq, value = part.partition("=")
        if not eq or key not in FILTER_KEYS:
            raise UsageError(
                f"--filter {part!r}: expected KEY=VALUE with KEY one of {', '.join(FILTER_KEYS)}",
                hint="e.g. `vmsandbox ls --filter state=running,host=local` (name=exp* takes a wildcard)",
            )
        wanted.setdefault(key, set()).add(value)
    return wanted


def matches(row: dict[str, Any], wanted: dict[str, set[str]]) -> bool:
    return all(any(fnmatch.fnmatchcase(str(row.get(k) or ""), v) for v in values) for k, values in wanted.items())


def formatted(fmt: str, row: dict[str, Any]) -> str:
    """A row through the user's format string; an unknown field is a usage error naming the fields."""

    class Row(dict[str, Any]):
        def __missing__(self, key: str) -> str:
            if row.get("state") == "damaged":
                return "?"  # a damaged record has a name and a problem only
            raise UsageError(f"--format: no field {key!r}", hint=f"the fields: {', '.join(sorted(row))}")

    try:
        return string.Formatter().vformat(fmt, (), Row(row))
    except (ValueError, IndexError, AttributeError, TypeError) as exc:
        raise UsageError(f"--format {fmt!r}: {exc}", hint="e.g. --format '{name}\\t{state}\\t{ports[ssh]}'") from None


def session_rows(broken: list[VmsandboxError] | None = None) -> list[dict[str, Any]]:
    """Every session as `ls --json` gives it; a damaged one with its state `damaged` and its problem. Given
    `broken`, a config with problems is read as far as it passes and its problems added there."""
    from vmsandbox.session import settings as config
    from vmsandbox.session import state

    if broken is None:
        uri = config.load().libvirt_uri
    else:
        settings, problems = config.load_lenient()
        uri = settings.libvirt_uri
        broken += problems
    found, damaged = state.listing(uri)
    rows = [s.as_dict() for s in found]
    for r in rows:
        if r["state"] not in REACHABLE:
            r["ports"] = {**r["ports"], "ssh": None}  # an exited VM's port is another program's now
    return [*rows, *(d.as_dict() for d in damaged)]


@app.command("ls")
def ls(as_json: AsJson = False, quiet: Quiet = False, fmt: Format = None, filters: Filter = None) -> None:
    """List sessions.

    Lists what it knows even when libvirt does not answer; a session whose record is damaged is a row of its
    own (`vmsandbox destroy NAME --discard` removes it). `--json` gives every field `--format` can use.

    Examples:

    `vmsandbox ls -q`

    `vmsandbox ls --filter state=running --format '{name} {ports[ssh]}'`"""
    from vmsandbox.document import FileError

    wanted = parse_filters(filters or [])
    broken: list[VmsandboxError] = []
    rows = [r for r in session_rows(broken) if matches(r, wanted)]
    for exc in broken:  # a line before the table, never in its way: the listing goes on with what passes
        ui.warn(f"{exc.brief()}; `vmsandbox config validate` lists them" if isinstance(exc, FileError) else exc.message)
    if as_json:
        print_json(rows)
    elif quiet or fmt is not None:
        for r in rows:
            print(r["name"] if quiet else formatted(fmt or "", r))
    elif not rows:
        ui.info("No sessions." if not wanted else "No session matches.")
    else:
        columns(
            ["NAME", "STATE", "AGE", "ACCEL", "SSH", "MEMORY", "DISK", "NETWORK", "UNSYNCED", "HOST", "PROJECT"],
            [_cells(r) for r in rows],
        )


def _cells(r: dict[str, Any]) -> list[str]:
    if r["state"] == "damaged":
        return [r["name"], "damaged", *["-"] * 8, r["problem"]]
    ssh = r["ports"]["ssh"]
    return [
        r["name"],
        r["state"],
        age(r["age_seconds"]),
        r["accel"],
        "-" if ssh is None else f"127.0.0.1:{ssh}",
        f"{r['memory_mib']} MiB",
        f"{r['disk_bytes'] / 1024**2:.0f} MiB",
        r["network"] + ("" if r["egress"] in ("up", "off") else f" ({r['egress']})"),
        "?" if r["unsynced"] is None else str(r["unsynced"]),
        r["host"],
        r["project"],
    ]


for _alias in ("ps", "list"):
    app.command(_alias, help="Same as `ls`.", rich_help_panel=ALIASES)(ls)


@app.command()
def inspect(name: SessionName, as_json: AsJson = False) -> None:
    """Show everything known of one session.

    Its state, host, image, resources, network and published ports, files, checkpoints and how to reach it.

    Examples:

    `vmsandbox inspect exp1`

    `vmsandbox inspect exp1 --json`"""
    from vmsandbox.session.place import checkpoints
    from vmsandbox.session.record import Record

    record = Record.load(name)  # a missing or damaged session: its error, with its hint
    row = next((r for r in session_rows() if r["name"] == name), None)
    if row is None:
        raise VmsandboxError(f"no session named {name!r}", hint="list sessions with `vmsandbox ls`")
    files = record.files
    row = {
        **row,
        "checkpoints": [c.label for c in checkpoints.listed(files)],
        "files": {"directory": str(files.root), "console_log": str(files.console_log), "ssh_config": None},
        "user": record.user,
    }
    if row["state"] in REACHABLE:
        row["files"]["ssh_config"] = str(files.ssh_config)
    if as_json:
        print_json(row)
        return
    for key, value in row.items():
        if isinstance(value, dict):
            for k, v in value.items():
                print(f"{key}.{k}: {'-' if v is None else v}")
        elif isinstance(value, list):
            print(f"{key}: {', '.join(str(v) for v in value) or '-'}")
        else:
            print(f"{key}: {'-' if value is None else value}")


EDITOR_OPTIONS = (  # of the session's own ssh options, what an editor's client needs (not our control socket)
    "HostName", "Port", "User", "IdentityFile", "IdentitiesOnly", "UserKnownHostsFile", "GlobalKnownHostsFile",
    "StrictHostKeyChecking", "HostKeyAlgorithms", "CheckHostIP", "PasswordAuthentication",
    "KbdInteractiveAuthentication", "ForwardAgent", "ForwardX11", "ServerAliveInterval", "ServerAliveCountMax",
)  # fmt: skip


def ssh_block(name: str) -> str:
    from vmsandbox.guest import ssh
    from vmsandbox.session.record import Record

    endpoint = Record.load(name).endpoint()
    options = endpoint.ssh_options()
    lines = [f"Host {ssh.host_alias(name)}", *(f"    {k} {options[k]}" for k in EDITOR_OPTIONS)]
    return "\n".join(lines) + "\n"


@app.command("ssh-config")
def ssh_config(names: SessionNames = None, every: AllSessions = False) -> None:
    """Print the ssh config of sessions, for an editor or ssh.

    A `Host vmsandbox-NAME` block with the session's port, key and pinned host key; append it to
    ~/.ssh/config and VS Code's or Cursor's Remote-SSH, JetBrains Gateway or `ssh vmsandbox-NAME` attach to it.

    Examples:

    `vmsandbox ssh-config exp1 >> ~/.ssh/config`

    `vmsandbox ssh-config --all`"""
    from vmsandbox.session.record import names as all_names

    printed: list[str] = []

    def one(name: str) -> None:  # blocks apart by a blank line; a session that has none is named at the end
        block = ssh_block(name)
        print(("\n" if printed else "") + block, end="", flush=True)
        printed.append(name)

    each_session(names, every, verb="ssh-config", which=all_names, act=one)
