"""`vmsandbox image build|ls|show|rm`: the base image and blueprint layers, built locally, each with its warm-start
template; and the blueprints they are built from — which there are (built in, yours, the project's: `image ls
--blueprints`) and what one makes a session of, with everything it extends merged in (`image show`). Earlier
versions had these as `vmsandbox blueprint ls|show` (aliases.py)."""

from __future__ import annotations

from typing import Annotated

import typer

from vmsandbox import ui
from vmsandbox.cli import complete, output
from vmsandbox.cli.base import noun
from vmsandbox.cli.output import AsJson, Column, Listing, Output, Quiet

image = noun(
    "image",
    "Base images, blueprints and their layers: build, ls, show, rm.\n\n"
    "A blueprint says what a session is made of: packages, the agent's command, allowed hosts, secrets and files "
    "copied in. The base image is built here from Debian packages; a blueprint's layer on it holds what the "
    "blueprint installs. Each has its warm-start template (sessions start from its saved memory in seconds).\n\n"
    "Examples: `sudo vmsandbox image build` · `vmsandbox image ls` · `vmsandbox image ls --blueprints` · "
    "`vmsandbox image show claude`",
)
IMAGES = Listing(
    fields=("version", "path", "built_at", "build_seconds", "disk_bytes", "kernel", "recipe_hash", "kind", "base"),
    columns=(
        Column("version"),
        Column("kind"),
        Column("built_at"),
        Column("size", made=lambda r: f"{(r['disk_bytes'] or 0) / 1024**2:.0f} MiB"),
        Column("kernel"),
    ),
    example="{{.Version}} {{.Kind}} {{.Size}}",
    keep=("kind", "size", "built_at"),
    key="version",
)
BLUEPRINTS = Listing(
    fields=("name", "from", "file", "description"),
    columns=(Column("name"), Column("from"), Column("description")),
    example="{{.Name}} {{.From}}",
)


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
def ls(
    blueprints: Annotated[
        bool, typer.Option("--blueprints", help="List the blueprints a session here can use instead, built or not.")
    ] = False,
    as_json: AsJson = False,
    quiet: Quiet = False,
    fmt: Annotated[str | None, output.format_option(IMAGES.example, f"--blueprints: '{BLUEPRINTS.example}'")] = None,
    wide: Output = None,
) -> None:
    """List built base images and blueprint layers (--blueprints: the blueprints).

    `-q` gives their versions, as `image rm` takes them. With --blueprints: the blueprints built in, yours
    (~/.config/vmsandbox/blueprints/) and this project's (.vmsandbox/blueprints/, used only once trusted: `vmsandbox
    config trust add`); `-q` gives their names, as `image show` and `image build -b` take them.

    Examples: `vmsandbox image ls -q` · `vmsandbox image ls --blueprints` ·
    `vmsandbox image ls --format '{{.Version}} {{.BuiltAt}}'`"""
    from vmsandbox.core import images

    if blueprints:  # each blueprint, where it comes from (built in, yours, the project's) and what it is for
        shape = BLUEPRINTS.shape(as_json=as_json, quiet=quiet, fmt=fmt, output=wide)
        BLUEPRINTS.show(images.blueprints(), shape, empty="")
        return
    shape = IMAGES.shape(as_json=as_json, quiet=quiet, fmt=fmt, output=wide)
    IMAGES.show(images.listed(), shape, empty="No images. Build the base with `sudo vmsandbox image build`.")


@image.command("show")
def show(
    name: Annotated[
        str,
        typer.Argument(
            help="A blueprint (`vmsandbox image ls --blueprints`).",
            metavar="BLUEPRINT",
            autocompletion=complete.blueprints,
        ),
    ],
    as_json: AsJson = False,
) -> None:
    """Show what a blueprint makes a session (and its image layer) of.

    Its packages, agent command, allowed hosts, secret mappings and files copied in, with what it extends merged.

    Example: `vmsandbox image show claude`"""
    import yaml

    from vmsandbox.core import images

    data = images.blueprint_shown(name)
    if as_json:
        output.json_lines([data])
        return
    shown = {k: v for k, v in data.items() if v not in (None, [], {}, "")}
    print(ui.printable(yaml.safe_dump(shown, sort_keys=False, allow_unicode=True), markup=False), end="")


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
