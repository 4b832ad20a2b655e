"""`vmsandbox host ls|add|rm|setup|prepare`: the libvirt hosts sessions may run on (this machine, `local`, and
those under `hosts:` in your config), this machine's set-up where no service manager does it, and images sent
ahead to another host."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from vmsandbox import ui
from vmsandbox.cli import complete, output
from vmsandbox.cli.base import noun
from vmsandbox.cli.output import AsJson, Column, Listing, Output, Quiet

host = noun(
    "host",
    "The libvirt hosts sessions run on: ls, add, rm, setup, prepare.\n\n"
    "This machine (`local`) and those under `hosts:` in your config.\n\n"
    "Examples: `vmsandbox host add big qemu+ssh://me@big.example/system` · `vmsandbox run --host big .` (then)",
)
FIELDS = ("name", "uri", "reachable", "problem", "hint", "hostname", "libvirt", "qemu", "cpus", "memory_mib",
          "available_mib", "reserved_mib", "accel", "kvm_problem", "sessions", "max_sessions", "keep_free_mib",
          "images", "memory_shared", "memory_problem", "session_pss_mib", "memory_guard", "room")  # fmt: skip


def _gib(mib: int | None) -> str:
    return "-" if mib is None else f"{mib / 1024:.1f}G"


HOSTS = Listing(
    fields=FIELDS,
    columns=(
        Column("name"),
        Column("state", made=lambda r: "ok" if r["reachable"] else "unreachable"),
        Column("accel"),
        Column(
            "free", made=lambda r: f"{_gib(r['available_mib'])}/{_gib(r['memory_mib'])}" if r["reachable"] else None
        ),
        Column(
            "sessions", lambda r: f"{r['sessions']}" + ("" if r["max_sessions"] is None else f"/{r['max_sessions']}")
        ),
        Column("room"),
        Column("uri"),
    ),
    example="{{.Name}} {{.Sessions}} {{.Room}}",
    keep=("state", "free", "room", "sessions", "accel"),
)


@host.command("ls")
def ls(
    as_json: AsJson = False,
    quiet: Quiet = False,
    fmt: Annotated[str | None, output.format_option(HOSTS.example)] = None,
    wide: Output = None,
    timeout: Annotated[
        float,
        typer.Option("--timeout", metavar="SECONDS", min=1, max=3600, help="Wait this long for a host (1 to 3600)."),
    ] = 20.0,
) -> None:
    """List the libvirt hosts sessions can run on.

    Each is asked at once; one that does not answer is listed as such, the reason and its fix said after the
    table (the command still succeeds). SESSIONS: yours there, as `vmsandbox ls --filter host=NAME` lists them.
    ROOM: how many more sessions of your configured memory it admits now: each must leave its keep_free free
    even if it came to fill all its memory, and each already running counts what it takes now (this machine
    measures its sessions; another host's count whole). FREE on this machine leaves out what is reserved: the
    holes of the memory files sessions share, which a save of one of them reads in (`reserved_mib`). `--json`
    adds the images each holds and more.

    Examples: `vmsandbox host ls` · `vmsandbox host ls --json` ·
    `vmsandbox host ls --format '{{.Name}} {{.AvailableMib}}'`"""
    from vmsandbox.core import hosts
    from vmsandbox.errors import UsageError

    shape = HOSTS.shape(as_json=as_json, quiet=quiet, fmt=fmt, output=wide)
    if not 1 <= timeout <= 3600:  # (nan passes the parser's bounds)
        raise UsageError(f"--timeout {timeout:g}: give 1 to 3600 seconds")
    if quiet:  # names only: nothing is asked of the hosts
        for name in hosts.names():
            print(name)
        return
    found = hosts.listed(timeout)
    rows: list[dict[str, Any]] = [h.facts for h in found]
    HOSTS.show(rows, shape, empty="")
    if as_json or fmt:
        return
    for h in found:  # each host whose sessions load a copy of their memory: why
        if h.answered and h.facts.get("memory_problem"):
            why = ui.printable(h.facts["memory_problem"])
            ui.info(f"memory on {ui.printable(h.name)}: each session loads a copy ({why})")
    for h in found:  # each host that does not answer: why, and the fix
        if not h.answered:
            ui.err.print(f"[yellow]{ui.printable(h.name)}:[/] {ui.printable(h.problem or 'no answer')}", soft_wrap=True)
            if h.hint:
                ui.err.print(f"[dim]hint:[/] {ui.printable(h.hint)}", soft_wrap=True)


@host.command("add")
def add(
    name: Annotated[str, typer.Argument(help="A short name: lower-case letters, digits, dashes.", metavar="NAME")],
    uri: Annotated[str, typer.Argument(help="Its libvirt URI, over ssh or TLS.", metavar="URI")],
    max_sessions: Annotated[
        int | None, typer.Option("--max-sessions", metavar="N", min=1, max=10000, help="At most N sessions there.")
    ] = None,
    keep_free: Annotated[
        str | None, typer.Option("--keep-free", metavar="SIZE", help="Memory left free there \\[default: 1G].")
    ] = None,
    pool_path: Annotated[
        str | None,
        typer.Option(
            "--pool-path", metavar="DIR", help="Where its pool keeps disks \\[default: /var/lib/libvirt/vmsandbox]."
        ),
    ] = None,
) -> None:
    """Add a libvirt host to your config, for sessions to run on.

    It goes under `hosts:` of ~/.config/vmsandbox/config.yaml (the rest of the file as it was), checked as the
    config is read: a URI over ssh (`qemu+ssh://USER@HOST/system`) or TLS, its host key pinned in your
    known_hosts.

    Example: `vmsandbox host add big qemu+ssh://me@big.example/system --max-sessions 8`"""
    from vmsandbox.core import hosts

    hosts.add(name, uri, max_sessions=max_sessions, keep_free=keep_free, pool_path=pool_path)
    ui.info(f"Host {name} added to {hosts.config_file()}: `vmsandbox host ls` asks it, `--host {name}` uses it")


@host.command("rm")
def rm(
    name: Annotated[
        str, typer.Argument(help="A host of your config.", metavar="HOST", autocompletion=complete.other_hosts)
    ],
) -> None:
    """Take a host off your config.

    Sessions there, and the images and volumes it holds, are left as they are (`vmsandbox rm --stale` sweeps what
    is ours there while it is still configured).

    Example: `vmsandbox host rm big`"""
    from vmsandbox.core import hosts

    hosts.remove(name)
    ui.info(f"Host {name} taken off {hosts.config_file()}")


@host.command("setup")
def setup(
    user: Annotated[
        str | None,
        typer.Option(
            "--user",
            metavar="USER",
            help="Who joins the libvirt group and then needs no sudo \\[default: who ran sudo].",
        ),
    ] = None,
) -> None:
    """Set this machine up where no service manager does it.

    Create the guest-data account and the libvirt group, give /dev/kvm udev's group and mode, start virtlogd and
    libvirtd with the group's socket, share the image store with the group (root).

    Example: `sudo vmsandbox host setup` (you join the libvirt group: log in again, then no more sudo)"""
    from vmsandbox.core import hosts

    for line in hosts.setup(user):
        ui.info(f"[green]✓[/] {line}")


@host.command("prepare")
def prepare(
    name: Annotated[
        str,
        typer.Argument(
            help="A host of your config (`vmsandbox host ls`).", metavar="HOST", autocompletion=complete.other_hosts
        ),
    ],
    image: Annotated[
        str | None,
        typer.Option(
            "--image",
            metavar="VERSION",
            help="A base image's version \\[default: the current one].",
            autocompletion=complete.images,
        ),
    ] = None,
    blueprint: Annotated[
        str | None,
        typer.Option(
            "--blueprint",
            "-b",
            metavar="NAME",
            help="Send this blueprint's layer (and its base) instead.",
            autocompletion=complete.blueprints,
        ),
    ] = None,
) -> None:
    """Send an image to another host now.

    A session placed there would send it first; this does it ahead: through libvirt streams, holes skipped, read
    back and checked by SHA-256, once per image and host.

    Example: `vmsandbox host prepare big --blueprint claude`"""
    from vmsandbox.core import images

    ui.info(f"Host {name} holds {images.send(name, version=image, blueprint_name=blueprint)}")
