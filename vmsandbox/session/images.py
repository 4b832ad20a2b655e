"""Removing images safely: a base image or a blueprint layer is refused while a session or a layer uses it."""

from __future__ import annotations

from vmsandbox.errors import VmsandboxError
from vmsandbox.image import layers, store
from vmsandbox.session.record import Record, names


def users_of(version: str) -> list[str]:
    """The blueprint layers built on this image and the sessions booted from it."""
    users = [f"blueprint image {b.version}" for b in layers.list_layers() if b.manifest.get("base_version") == version]
    for name in names():
        try:
            if Record.load(name).image_version == version:
                users.append(f"session {name}")
        except VmsandboxError:
            continue
    return users


def remove(version: str) -> str:
    """Remove the base image or layer `version` (refused while used); what it was, for the message."""
    if any(layer.version == version for layer in layers.list_layers()):
        layers.remove_layer(version, users_of(version))
        return "blueprint image"
    store.remove(version, users_of(version))
    return "base image"
