"""`vmsandbox image build|ls|rm`: the base image and blueprint layers, built locally, each with its warm-start
template."""

from __future__ import annotations

from typing import Annotated

import typer

from vmsandbox import ui
from vmsandbox.cli import complete, output
from vmsandbox.cli.base import noun
from vmsandbox.cli.output import AsJson, Column, Format, Quiet

image = noun(
    "image",
    "Base images and blueprint layers: build, ls, rm.\n\n"
    "The base is built here from Debian packages; a blueprint's layer on it holds what the blueprint installs. Each "
    "has its warm-start template (sessions start from its saved memory in seconds).\n\n"
    "Example: `sudo vmsandbox image build`, then `vmsandbox image ls`",
)
FIELDS = ("version", "path", "built_at", "build_seconds", "disk_bytes", "kernel", "recipe_hash", "kind", "base")


@image.command("build")
def build(
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if this recipe is built already.")] = False,
    no_host_ca: Annotated[
        bool, typer.Option("--no-host-ca", help="Do not trust the host's locally added CA certificates in it.")
    ] = False,
    blueprint_name: Annotated[
        str | None,
        typer.Option(
            "--blueprint",
            "-b",
            metavar="NAME",
            help="Build this blueprint's layer on the base instead (claude, codex, …).",
            autocompletion=complete.blueprints,
        ),
    ] = None,
    no_template: Annotated[
        bool, typer.Option("--no-template", help="Skip the warm-start template (the first session builds it).")
    ] = False,
) -> None:
    """Build the base image, or a blueprint's layer on it.

    The base is built from Debian packages (needs root); a layer holds what a blueprint installs. Then its
    warm-start template: a booted VM's saved memory that sessions start from in seconds.

    Examples: `sudo vmsandbox image build` · `sudo vmsandbox image build -b claude`"""
    from vmsandbox.core import images

    if blueprint_name is not None:
        built = images.build_layer(blueprint_name, force=force)
    else:
        built = images.build_base(force=force, host_ca=not no_host_ca)
    if built.built:
        ui.info(f"[green]Built[/] {built.version} in {built.seconds:.0f}s → {built.path}")
        for package, version in sorted(built.installed.items()):
            ui.info(ui.printable(f"  {package} {version}"))
    else:
        ui.info(f"{built.version} is built already for this recipe; nothing to do (--force rebuilds)")
    if not no_template:
        images.warm(built)


@image.command("ls")
def ls(as_json: AsJson = False, quiet: Quiet = False, fmt: Format = None) -> None:
    """List built base images and blueprint layers.

    `-q` gives their versions, as `image rm` takes them.

    Example: `vmsandbox image ls -q`"""
    from vmsandbox.core import images

    output.formats(fmt)
    output.template(fmt, FIELDS)
    table = (
        Column("VERSION", lambda r: r["version"]),
        Column("KIND", lambda r: r["kind"]),
        Column("BUILT", lambda r: str(r["built_at"])),
        Column("SIZE", lambda r: f"{(r['disk_bytes'] or 0) / 1024**2:.0f} MiB"),
        Column("KERNEL", lambda r: str(r["kernel"])),
    )
    output.listing(images.listed(), table, as_json=as_json, quiet=quiet, fmt=fmt, key="version",
                   empty="No images. Build the base with `sudo vmsandbox image build`.", fields=FIELDS)  # fmt: skip


@image.command("rm")
def rm(
    version: Annotated[
        str, typer.Argument(help="A version `image ls` shows.", metavar="VERSION", autocompletion=complete.images)
    ],
) -> None:
    """Remove a base image or a blueprint layer.

    It is refused while a session or a layer uses it.

    Example: `vmsandbox image rm bookworm-12408c8c268d`"""
    from vmsandbox.core import images

    ui.info(f"Removed {images.remove(version)} {version}")
