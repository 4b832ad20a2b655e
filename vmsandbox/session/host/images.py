"""Removing images safely: a base image or a blueprint layer is refused while a session or a layer uses it."""

from __future__ import annotations

from vmsandbox import ui
from vmsandbox.image import layers, store
from vmsandbox.session import settings
from vmsandbox.session.place import choose, pins, templates
from vmsandbox.session.record import readable


def users_of(version: str) -> list[str]:
    """The blueprint layers built on this image and the sessions booted from it."""
    users = [f"blueprint image {b.version}" for b in layers.list_layers() if b.manifest.get("base_version") == version]
    users += [f"session {r.name}" for r in readable() if r.image_version == version]
    users += [str(p) for p in pins.of_others() if p.image == version]
    return users


def remove(version: str) -> str:
    """Remove the base image or layer `version` (refused while used); what it was, for the message."""
    if any(layer.version == version for layer in layers.list_layers()):
        layers.remove_layer(version, users_of(version))
        return "blueprint image"
    store.remove(version, users_of(version))
    return "base image"


def default_template(image: store.Image) -> str:
    """The warm-start template of `image` on this machine for the VM shape the configuration gives (built unless
    it exists): where it is."""
    config = settings.load()
    with choose.host(choose.spec_for(None, config.libvirt_uri)) as host:
        host.libvirt()  # as a session's start: fails first if libvirt is down
        choice = host.admit(config.accel, config.memory_mib)
        shape = templates.Shape(choice.accel.value, config.cpus, config.memory_mib, config.disk_mib)
        found = host.images.template(image, shape, config.boot_timeout)
    ui.info(f"Warm-start template for {shape.slug}: {found}")
    return found
