"""`vmsandbox hosts` and `vmsandbox host prepare`: the libvirt hosts sessions may run on, and their images."""

from __future__ import annotations

from typing import Annotated

import typer

from vmsandbox import ui
from vmsandbox.cli import complete
from vmsandbox.cli.base import AsJson, Quiet, app, columns, host_app, print_json


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 1024:.1f}G"


@app.command("hosts")
def hosts_command(
    as_json: AsJson = False,
    quiet: Quiet = False,
    timeout: Annotated[
        float, typer.Option("--timeout", min=1, help="Seconds to wait for a host before listing it unreachable.")
    ] = 20.0,
) -> None:
    """List the libvirt hosts sessions can run on.

    List the libvirt hosts: this machine (`local`) and those under `hosts:` in your config. Each is asked at
    once; one that does not answer is listed with the reason (the command still succeeds).

    Example: `vmsandbox hosts --json`"""
    from vmsandbox.session import settings as config
    from vmsandbox.session.host import hosts
    from vmsandbox.session.place import hostspec

    settings = config.load()
    if quiet:  # names only: nothing is asked of the hosts
        for spec in hostspec.every(settings.libvirt_uri, settings.hosts):
            print(spec.name)
        return
    found = hosts.probe_all(hostspec.every(settings.libvirt_uri, settings.hosts), timeout)
    if as_json:
        print_json([s.as_dict() for s in found])
        return
    rows = []
    for s in found:
        n = s.node
        if n is None:
            rows.append([s.spec.name, "unreachable", "-", "-", "-", "-", "-", s.spec.uri, s.problem or ""])
            continue
        most = "" if s.spec.max_sessions is None else f"/{s.spec.max_sessions}"
        rows.append(
            [
                s.spec.name,
                "ok",
                f"libvirt {n.libvirt}, QEMU {n.qemu}",
                s.accel,
                f"{_mib(n.available_mib)} of {_mib(n.memory_mib)}",
                f"{s.sessions}{most}",
                str(len(s.images)),
                s.spec.uri,
                "",
            ]
        )
    columns(["HOST", "STATE", "VERSIONS", "ACCEL", "MEMORY FREE", "SESSIONS", "IMAGES", "URI", "PROBLEM"], rows)
    for s in found:  # each host that does not answer: the fix for what it said
        if s.node is None and s.hint:
            ui.err.print(f"[dim]hint:[/] {ui.printable(s.spec.name)}: {ui.printable(s.hint)}", soft_wrap=True)


@host_app.command("prepare")
def host_prepare(
    name: Annotated[
        str,
        typer.Argument(
            help="A host under `hosts:` in your config (`vmsandbox hosts`).",
            metavar="HOST",
            autocompletion=complete.hosts,
        ),
    ],
    image: Annotated[
        str | None, typer.Option("--image", help="A base image's version (default: the current one).")
    ] = None,
    blueprint: Annotated[
        str | None, typer.Option("--blueprint", "-b", help="Send this blueprint's layer (and its base) instead.")
    ] = None,
) -> None:
    """Send an image to another host now.

    Send an image to another host's storage pool now (a session placed there would send it first):
    through libvirt streams, holes skipped, read back and checked by SHA-256, once per image and host.

    Example: `vmsandbox host prepare big --blueprint claude`"""
    from vmsandbox.errors import VmsandboxError
    from vmsandbox.image import blueprint as blueprints
    from vmsandbox.image import layers, store
    from vmsandbox.session import settings as config
    from vmsandbox.session.host import hosts

    settings = config.load()
    spec = hosts.named(settings, name)
    hosts.check_holds_images(spec)
    found = store.get_image(image) if image else store.current_image()
    if blueprint is not None:
        bp = blueprints.load(blueprint)
        layer = layers.find(bp, found)
        if layer is None:
            raise VmsandboxError(
                f"blueprint {blueprint} has no image built on {found.version} yet",
                hint=f"build it here first: `vmsandbox image build --blueprint {blueprint}`",
            )
        found = layer
    ui.info(f"Image {found.path.name} on host {name}: {hosts.hold_image(spec, found)}")
