"""`vmsandbox image build|ls|rm`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from vmsandbox import ui
from vmsandbox.cli.base import AsJson, Quiet, columns, image_app, print_json

if TYPE_CHECKING:
    from vmsandbox.image.store import Image


@image_app.command("build")
def image_build(
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if this recipe is already built.")] = False,
    no_host_ca: Annotated[
        bool, typer.Option("--no-host-ca", help="Do not trust the host's locally added CA certificates in the image.")
    ] = False,
    blueprint_name: Annotated[
        str | None,
        typer.Option("--blueprint", "-b", help="Build this blueprint's layer on the base instead (claude, codex, …)."),
    ] = None,
    no_template: Annotated[
        bool, typer.Option("--no-template", help="Skip the warm-start template (the first session builds it).")
    ] = False,
) -> None:
    """Build the base image, or a blueprint's layer on it.

    Build the base image locally from Debian packages, or a blueprint's thin layer on it (needs root), and its
    warm-start template (a booted VM's saved memory that sessions start from in seconds).

    Example: `sudo vmsandbox image build -b claude`
    """
    from vmsandbox.image import build, recipe
    from vmsandbox.session import settings as config
    from vmsandbox.session.host import images

    if blueprint_name is not None:
        layer = _build_blueprint(blueprint_name, force=force)
        if not no_template:
            images.default_template(layer)
        return
    trust = config.load().trust_host_ca and not no_host_ca
    wanted = recipe.load_recipe(trust_host_ca=trust)
    certs = f" (trusting {len(wanted.ca_certs)} host CA certificate(s))" if wanted.ca_certs else ""
    ui.info(f"Base image {wanted.version}{certs}")
    start = time.monotonic()
    built, did_build = build.build(force=force, recipe=wanted, in_use=images.users_of)
    if did_build:
        ui.info(f"[green]Built[/] {built.version} in {time.monotonic() - start:.0f}s → {built.path}")
    else:
        ui.info(f"{built.version} is already built for this recipe; nothing to do (use --force to rebuild)")
    if not no_template:
        images.default_template(built)


def _build_blueprint(name: str, *, force: bool) -> Image:
    from vmsandbox.image import blueprint
    from vmsandbox.session.start import layer as layerbuild

    bp = blueprint.load(name, Path.cwd())
    start = time.monotonic()
    built, did_build = layerbuild.build_layer(bp, force=force)
    if did_build:
        ui.info(f"[green]Built[/] {built.version} in {time.monotonic() - start:.0f}s → {built.path}")
        for package, version in sorted(built.manifest.get("installed", {}).items()):
            ui.info(ui.printable(f"  {package} {version}"))
    else:
        ui.info(f"{built.version} is already built for this blueprint and base; nothing to do (--force rebuilds)")
    return built


@image_app.command("ls")
def image_ls(as_json: AsJson = False, quiet: Quiet = False) -> None:
    """List built base images and blueprint layers.

    List built base images and blueprint layers (`-q`: versions only, as `image rm` takes them).

    Example: `vmsandbox image ls -q`"""
    from vmsandbox.image import layers, store

    images = [i.summary() | {"kind": "base"} for i in store.list_images()]
    images += [
        i.summary() | {"kind": f"blueprint {i.manifest.get('blueprint')}", "base": i.manifest.get("base_version")}
        for i in layers.list_layers()
    ]
    if as_json:
        print_json(images)
        return
    if quiet:
        for i in images:
            print(i["version"])
        return
    if not images:
        ui.info("No base images. Build one with `sudo vmsandbox image build`.")
        return
    rows = [
        [i["version"], i["kind"], str(i["built_at"]), f"{(i['disk_bytes'] or 0) / 1024**2:.0f} MiB", i["kernel"]]
        for i in images
    ]
    columns(["VERSION", "KIND", "BUILT", "SIZE", "KERNEL"], rows)


@image_app.command("rm")
def image_rm(
    version: Annotated[str, typer.Argument(help="The version shown by `image ls`.", metavar="VERSION")],
) -> None:
    """Remove a base image or a blueprint layer.

    Remove a base image or a blueprint layer (refused while a session or a layer uses it).

    Example: `vmsandbox image rm bookworm-12408c8c268d`"""
    from vmsandbox.session.host import images

    what = images.remove(version)
    ui.info(f"Removed {what} {version}")
