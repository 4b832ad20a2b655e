"""Images and blueprints, for every front end: the base image and blueprint layers built, listed and removed
(each with its warm-start template), an image sent to another host, and the blueprints there are with what one
makes a session of."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmsandbox import paths, ui
from vmsandbox.errors import UsageError, VmsandboxError
from vmsandbox.image import blueprint, build, layers, recipe, store
from vmsandbox.session import settings
from vmsandbox.session.host import hosts, images
from vmsandbox.session.start import layer


def is_blueprint_name(text: str) -> bool:
    """Whether `text` may name a blueprint (what such a name is made of; whether one exists is another question)."""
    return blueprint.NAME_RE.match(text) is not None


@dataclass(frozen=True)
class Built:
    """An image as a build left it: its version, where it is, whether it was built now (False: it was there),
    how long that took, what a layer installed."""

    version: str
    path: Path
    built: bool
    seconds: float
    installed: dict[str, str]
    image: store.Image


def warm(built: Built) -> None:
    """The warm-start template of a built image, for the VM shape the configuration gives (built unless it
    exists): a booted VM's saved memory that sessions start from in seconds."""
    images.default_template(built.image)


def build_base(*, force: bool, host_ca: bool) -> Built:
    """The base image of the current recipe built from Debian packages (needs root), trusting the host's locally
    added CA certificates unless `host_ca` is False."""
    wanted = recipe.load_recipe(trust_host_ca=settings.load().trust_host_ca and host_ca)
    certs = f" (trusting {len(wanted.ca_certs)} host CA certificate(s))" if wanted.ca_certs else ""
    ui.info(f"Base image {wanted.version}{certs}")
    started = time.monotonic()
    image, did = build.build(force=force, recipe=wanted, in_use=images.users_of)
    return Built(image.version, image.path, did, time.monotonic() - started, {}, image)


def build_layer(name: str, *, force: bool) -> Built:
    """A blueprint's thin layer on the current base image."""
    bp = blueprint.named(name, Path.cwd())
    started = time.monotonic()
    image, did = layer.build_layer(bp, force=force)
    installed = {str(k): str(v) for k, v in image.manifest.get("installed", {}).items()}
    return Built(image.version, image.path, did, time.monotonic() - started, installed, image)


def listed() -> list[dict[str, Any]]:
    """Every built image: base images and blueprint layers, newest first, each with its kind."""
    found = [i.summary() | {"kind": "base"} for i in store.list_images()]
    found += [
        i.summary() | {"kind": f"blueprint {i.manifest.get('blueprint')}", "base": i.manifest.get("base_version")}
        for i in layers.list_layers()
    ]
    return found


def versions() -> list[str]:
    """The versions `image rm` takes (read from the image store's files)."""
    return [i.version for i in [*store.list_images(), *layers.list_layers()]]


def remove(version: str) -> str:
    """A base image or a blueprint layer removed (refused while a session or a layer uses it); what it was."""
    return images.remove(version)


def send(host: str, *, version: str | None, blueprint_name: str | None) -> str:
    """An image sent to another host's storage pool now (a session placed there would send it first): the
    base image `version` (default: the current one), or a blueprint's layer on it. What the host holds now."""
    loaded = settings.load()
    try:
        spec = hosts.named(loaded, host)
    except VmsandboxError as exc:
        raise UsageError(exc.message, hint=exc.hint) from None
    hosts.check_holds_images(spec)
    found = store.get_image(version) if version else store.current_image()
    if blueprint_name is not None:
        built = layers.find(blueprint.named(blueprint_name), found)
        if built is None:
            raise VmsandboxError(
                f"blueprint {blueprint_name} has no image built on {found.version} yet",
                hint=f"build it here first: `vmsandbox image build --blueprint {blueprint_name}`",
            )
        found = built
    return f"{found.path.name}: {hosts.hold_image(spec, found)}"


def blueprint_names(project: Path | None = None) -> list[str]:
    """The blueprints a session here can use (built in, yours, the project's), by name."""
    return sorted(blueprint.available(project if project is not None else Path.cwd()))


def with_login() -> list[str]:
    """The blueprints that name login files (`login add` keeps their sign-in)."""
    found = []
    for name in blueprint_names():
        try:
            if blueprint.load(name, Path.cwd()).login_files:
                found.append(name)
        except VmsandboxError:
            continue
    return found


def blueprints() -> list[dict[str, Any]]:
    """Every blueprint here: its name, where it comes from (built in, yours, the project's), its file and what
    it is for (or why it cannot be used)."""
    rows: list[dict[str, Any]] = []
    for name, path in sorted(blueprint.available(Path.cwd()).items()):
        try:
            description = blueprint.load(name, Path.cwd()).description
        except VmsandboxError as exc:
            description = f"(not usable: {exc.message})"
        rows.append({"name": name, "from": _where(path), "file": str(path), "description": description})
    return rows


def _where(path: Path) -> str:
    if path.parent == blueprint.BUILTIN_DIR:
        return "built in"
    if path.parent == paths.config_dir() / "blueprints":
        return "yours"
    return "project"


def blueprint_shown(name: str) -> dict[str, Any]:
    """A blueprint as a session gets it, with what it extends merged in."""
    bp = blueprint.named(name, Path.cwd())
    return {
        "name": bp.name,
        "description": bp.description,
        "files": list(bp.chain) or [bp.source],
        "apt": list(bp.apt),
        "npm": list(bp.npm),
        "node": bp.node,
        "command": list(bp.command),
        "skip_permissions": list(bp.skip_permissions),
        "allow": list(bp.allow),
        "secrets": [dict(s) for s in bp.secrets],
        "copy": list(bp.copy),
        "credentials": list(bp.credentials),
        "env": dict(bp.env),
    }
