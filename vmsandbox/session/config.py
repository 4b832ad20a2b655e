"""Settings: defaults < user config < project `.vmsandbox.yaml` < environment < command-line flags."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vmsandbox import paths, trust
from vmsandbox.egress import netpolicy
from vmsandbox.egress.mapping import SecretMapping, parse_secret_mapping
from vmsandbox.egress.netpolicy import Mode
from vmsandbox.errors import VmsandboxError
from vmsandbox.schema import Mappings, check, load_yaml, parse_yaml
from vmsandbox.vm.accel import Accel

if TYPE_CHECKING:
    from vmsandbox.image.blueprint import Blueprint

PROJECT_FILE = ".vmsandbox.yaml"
COMMAND_LINE = "command line"  # as a source: keys are shown as the flags that set them
USER_FILE = "config.yaml"

FIELDS: dict[str, type] = {
    "cpus": int,
    "memory": str,
    "disk": str,
    "accel": str,
    "libvirt_uri": str,
    "boot_timeout": int,
    "trust_host_ca": bool,
    "network": str,
    "allow": list,
    "allow_networks": list,
    "secrets": Mappings,
    "sync_limit": str,
}
# Keys that only size the VM: a project file may set them without being trusted (`vmsandbox trust`).
SIZING_KEYS = frozenset({"cpus", "memory", "disk", "boot_timeout", "accel"})


_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)
_UNIT_MIB = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


def parse_size_mib(text: str, *, what: str) -> int:
    """'2G', '2048M', '2GiB', '512' (MiB) -> MiB."""
    m = _SIZE.match(text)
    if not m:
        raise VmsandboxError(f"{what}: cannot read size {text!r}", hint="write it like 2G or 2048M")
    mib = int(int(m.group(1)) * _UNIT_MIB[m.group(2).upper()])
    if mib <= 0:
        raise VmsandboxError(f"{what}: size {text!r} is too small")
    return mib


@dataclass(frozen=True)
class Settings:
    cpus: int = 2
    memory_mib: int = 2048
    disk_mib: int = 20 * 1024
    accel: Accel = Accel.AUTO
    libvirt_uri: str = "qemu:///system"
    boot_timeout: int = 300
    trust_host_ca: bool = True
    network: Mode = Mode.ALLOWLIST
    allow: tuple[str, ...] = ()  # allowlist entries: the blueprint's, then every source adds to it
    secrets: tuple[SecretMapping, ...] = ()  # every source adds; a later mapping for the same host wins
    allow_networks: tuple[str, ...] = ()  # non-public networks allowed names may resolve to
    sync_limit_mib: int = 16 * 1024  # a pull writes at most this much, and takes no larger file

    def rules(self) -> tuple[netpolicy.Rule, ...]:
        return tuple(netpolicy.parse_rule(a, source="allowlist") for a in self.allow)

    def merged(self, data: dict[str, Any], source: str) -> Settings:
        data = check(data, FIELDS, source=source)

        def label(key: str) -> str:
            return f"--{key}" if source == COMMAND_LINE else f"{source}: `{key}`"

        changes: dict[str, Any] = {}
        if "cpus" in data:
            if not 1 <= data["cpus"] <= 64:
                raise VmsandboxError(f"{label('cpus')} must be between 1 and 64")
            changes["cpus"] = data["cpus"]
        if "memory" in data:
            changes["memory_mib"] = parse_size_mib(data["memory"], what=label("memory"))
        if "disk" in data:
            changes["disk_mib"] = parse_size_mib(data["disk"], what=label("disk"))
        if "sync_limit" in data:
            changes["sync_limit_mib"] = parse_size_mib(data["sync_limit"], what=label("sync_limit"))
        if "accel" in data:
            changes["accel"] = parse_accel(data["accel"], source=label("accel"))
        for key in ("libvirt_uri", "boot_timeout", "trust_host_ca"):
            if key in data:
                changes[key] = data[key]
        changes.update(self._network_changes(data, source, label))
        return replace(self, **changes)

    def _network_changes(self, data: dict[str, Any], source: str, label: Callable[[str], str]) -> dict[str, Any]:
        changes: dict[str, Any] = {}
        if "network" in data:
            changes["network"] = netpolicy.parse_mode(data["network"], source=label("network"))
        if "allow" in data:
            for entry in data["allow"]:
                netpolicy.parse_rule(entry, source=label("allow"))
            changes["allow"] = tuple(dict.fromkeys([*self.allow, *(a.strip().lower() for a in data["allow"])]))
        if "allow_networks" in data:
            for entry in data["allow_networks"]:
                netpolicy.parse_network(entry, source=label("allow_networks"))
            changes["allow_networks"] = tuple(dict.fromkeys([*self.allow_networks, *data["allow_networks"]]))
        if "secrets" in data:
            added = [parse_secret_mapping(m, source=f"{source}: `secrets[{i}]`") for i, m in enumerate(data["secrets"])]
            hosts = {m.host for m in added}
            changes["secrets"] = (*(m for m in self.secrets if m.host not in hosts), *added)
        return changes


def parse_accel(value: str, *, source: str) -> Accel:
    try:
        return Accel(value.lower())
    except ValueError:
        raise VmsandboxError(f"{source}: unknown accelerator {value!r}", hint="use auto, kvm or tcg") from None


def load(project: Path | None = None, *, blueprint: Blueprint | None = None) -> Settings:
    """The settings for a project; a blueprint's allowlist and secret mappings come first, then the files.

    A project's `.vmsandbox.yaml` is obeyed only as far as it is trusted (trust.py): keys that size the VM
    always, the rest only after `vmsandbox trust`. `libvirt_uri` never comes from a project."""
    settings = Settings()
    if blueprint is not None:
        settings = settings.merged(blueprint.settings_data(), blueprint.source)
    user_file = paths.config_dir() / USER_FILE
    if user_file.is_file():
        settings = settings.merged(load_yaml(user_file), str(user_file))
    if project is not None:
        found = project_file(project)
        if found is not None:
            trust.require(found.path, found.raw, widening_keys(found.data), project=project)
            settings = settings.merged(found.data, str(found.path))
    env_accel = os.environ.get("VMSANDBOX_ACCEL")
    if env_accel:
        settings = replace(settings, accel=parse_accel(env_accel, source="VMSANDBOX_ACCEL"))
    env_uri = os.environ.get("VMSANDBOX_LIBVIRT_URI")
    if env_uri:
        settings = replace(settings, libvirt_uri=env_uri)
    env_network = os.environ.get("VMSANDBOX_NETWORK")
    if env_network:
        settings = replace(settings, network=netpolicy.parse_mode(env_network, source="VMSANDBOX_NETWORK"))
    return settings


@dataclass(frozen=True)
class ProjectFile:
    path: Path
    raw: bytes  # the bytes trust is about
    data: dict[str, Any]  # parsed from exactly those bytes


def project_file(project: Path) -> ProjectFile | None:
    """A project's `.vmsandbox.yaml`, read without following links and checked (unknown keys and bad types
    are errors; `libvirt_uri` is refused: it names a program-running transport as easily as a host)."""
    path = project / PROJECT_FILE
    raw = trust.read_project_file(path)
    if raw is None:
        return None
    data = check(parse_yaml(raw, str(path)), FIELDS, source=str(path))
    if "libvirt_uri" in data:
        raise VmsandboxError(
            f"{path}: `libvirt_uri` is never taken from a project file",
            hint=f"set it in {paths.config_dir() / USER_FILE} or VMSANDBOX_LIBVIRT_URI, then remove it there",
        )
    Settings().merged(data, str(path))  # every value checked before anything asks for trust
    return ProjectFile(path, raw, data)


def widening_keys(data: dict[str, Any]) -> list[str]:
    """The keys of a project file that reach beyond sizing the VM (they need trust)."""
    return sorted(k for k in data if k not in SIZING_KEYS)


def describe_project_file(project: Path) -> trust.Candidate | None:
    """The project's `.vmsandbox.yaml` as `vmsandbox trust` shows it: each key, what it sets, and what it is
    now without the file (from the defaults and the user's config)."""
    found = project_file(project)
    if found is None:
        return None
    without = load(None)
    lines = []
    for name, value in found.data.items():
        sizing = name in SIZING_KEYS
        lines.append(
            f"{name}: {_shown(value)}" + ("   (sizes the VM: needs no trust)" if sizing else _now(without, name))
        )
        if name == "secrets":
            lines += [
                f"    your secret {m.get('secret')!s} goes to {m.get('host')!s} in header {m.get('header')!s}"
                for m in value
            ]
    return trust.Candidate(found.path, found.raw, lines)


def _shown(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _now(settings: Settings, name: str) -> str:
    current = {
        "network": settings.network.value,
        "allow": list(settings.allow),
        "allow_networks": list(settings.allow_networks),
        "trust_host_ca": settings.trust_host_ca,
        "sync_limit": f"{settings.sync_limit_mib}M",
    }.get(name)
    return f"   (now: {_shown(current)})" if current is not None else ""


def trust_candidates(path: Path) -> list[trust.Candidate]:
    """The project config files `vmsandbox trust` looks at: at path, a project directory (its .vmsandbox.yaml
    and .vmsandbox/blueprints/*.yaml) or one of those files."""
    from vmsandbox.image import blueprint

    project = path.parent if path.is_file() else path
    if project.name == "blueprints" and project.parent.name == ".vmsandbox":
        project = project.parent.parent
    candidates = [c for c in [describe_project_file(project)] if c is not None]
    candidates += blueprint.describe_project_blueprints(project)
    if path.is_file():
        candidates = [c for c in candidates if c.path.resolve() == path.resolve()]
    if not candidates:
        raise VmsandboxError(
            f"no project config in {path}", hint="`vmsandbox trust` reads .vmsandbox.yaml and .vmsandbox/blueprints/"
        )
    return candidates
