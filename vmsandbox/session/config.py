"""Settings: defaults < user config < project `.vmsandbox.yaml` < environment < command-line flags."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vmsandbox import paths, trust
from vmsandbox.egress import netpolicy
from vmsandbox.egress.mapping import SecretMapping, parse_secret_mapping
from vmsandbox.egress.netpolicy import Mode
from vmsandbox.errors import VmsandboxError
from vmsandbox.schema import Mappings, Size, check, located, parse_yaml
from vmsandbox.session.hostspec import HostSpec, parse_hosts
from vmsandbox.vm.accel import Accel

if TYPE_CHECKING:
    from vmsandbox.image.blueprint import Blueprint

PROJECT_FILE = ".vmsandbox.yaml"
COMMAND_LINE = "command line"  # as a source: keys are shown as the flags that set them
USER_FILE = "config.yaml"

FIELDS: dict[str, type] = {
    "cpus": int,
    "memory": Size,
    "disk": Size,
    "accel": str,
    "libvirt_uri": str,
    "boot_timeout": int,
    "trust_host_ca": bool,
    "network": str,
    "allow": list,
    "allow_networks": list,
    "secrets": Mappings,
    "sync_limit": Size,
    "hosts": Mappings,
}
# What a VM may be given: below these minimums the guest does not boot (memory), its image does not fit (disk),
# or nothing useful syncs; boot_timeout in seconds.
MIN_MEMORY_MIB, MIN_DISK_MIB, MIN_SYNC_LIMIT_MIB = 256, 4096, 1
BOOT_TIMEOUT_RANGE = (1, 3600)
# Keys that only size the VM: a project file may set them without being trusted (`vmsandbox trust`).
SIZING_KEYS = frozenset({"cpus", "memory", "disk", "boot_timeout", "accel"})


_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)
_UNIT_MIB = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


def host_cpus() -> int:
    """The most vCPUs a session may have: the host's CPUs."""
    return os.cpu_count() or 1


def parse_size_mib(text: str | int, *, what: str, least: int = 1) -> int:
    """'2G', '2048M', '2GiB', '512' or 512 (MiB) -> MiB, at least `least` MiB."""
    m = _SIZE.match(str(text))
    if not m:
        raise VmsandboxError(f"{what}: cannot read size {text!r}", hint="write it like 2G or 2048M")
    mib = int(int(m.group(1)) * _UNIT_MIB[m.group(2).upper()])
    if mib < least:
        shown = f"{least // 1024}G" if least % 1024 == 0 else f"{least}M"
        raise VmsandboxError(f"{what}: {text!r} is too small", hint=f"give at least {shown} (a plain number is MiB)")
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
    hosts: tuple[HostSpec, ...] = ()  # other libvirt hosts (hostspec.py); this machine is `libvirt_uri`

    def rules(self) -> tuple[netpolicy.Rule, ...]:
        return tuple(netpolicy.parse_rule(a, source="allowlist") for a in self.allow)

    def merged(self, data: dict[str, Any], source: str) -> Settings:
        data = check(data, FIELDS, source=source)

        def label(key: str) -> str:
            return f"--{key}" if source == COMMAND_LINE else f"{source}: `{key}`"

        changes: dict[str, Any] = {}
        if "cpus" in data:
            most = host_cpus()
            if not 1 <= data["cpus"] <= most:
                raise VmsandboxError(
                    f"{label('cpus')} must be between 1 and {most} (the host's CPUs)",
                    hint="more vCPUs than the host has only makes the guest slower",
                )
            changes["cpus"] = data["cpus"]
        if "memory" in data:
            changes["memory_mib"] = parse_size_mib(data["memory"], what=label("memory"), least=MIN_MEMORY_MIB)
        if "disk" in data:
            changes["disk_mib"] = parse_size_mib(data["disk"], what=label("disk"), least=MIN_DISK_MIB)
        if "sync_limit" in data:
            changes["sync_limit_mib"] = parse_size_mib(
                data["sync_limit"], what=label("sync_limit"), least=MIN_SYNC_LIMIT_MIB
            )
        if "boot_timeout" in data and not BOOT_TIMEOUT_RANGE[0] <= data["boot_timeout"] <= BOOT_TIMEOUT_RANGE[1]:
            low, high = BOOT_TIMEOUT_RANGE
            raise VmsandboxError(f"{label('boot_timeout')} must be between {low} and {high} seconds")
        if "accel" in data:
            changes["accel"] = parse_accel(data["accel"], source=label("accel"))
        for key in ("libvirt_uri", "boot_timeout", "trust_host_ca"):
            if key in data:
                changes[key] = data[key]
        if "hosts" in data:
            changes["hosts"] = parse_hosts(data["hosts"], source=source, parse_size_mib=parse_size_mib)
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
    return layers(project, blueprint=blueprint)[-1].settings


@dataclass(frozen=True)
class Layer:
    source: str  # "default", a file, an environment variable
    settings: Settings  # the settings after it
    keys: frozenset[str]  # the keys it set


def layers(project: Path | None = None, *, blueprint: Blueprint | None = None) -> list[Layer]:
    """The settings after each source that set something, in order (defaults first): `config show` tells
    from them where each effective setting came from."""
    found = [Layer("default", Settings(), frozenset())]

    def add(source: str, settings: Settings, keys: Iterable[str]) -> Settings:
        found.append(Layer(source, settings, frozenset(keys)))
        return settings

    settings = found[0].settings
    if blueprint is not None:
        data = blueprint.settings_data()
        settings = add(blueprint.source, settings.merged(data, blueprint.source), data)
    user_file = paths.config_dir() / USER_FILE
    if user_file.is_file():
        settings, keys = read_file(user_file, settings)
        add(str(user_file), settings, keys)
    if project is not None:
        project_found = project_file(project)
        if project_found is not None:
            trust.require(project_found.path, project_found.raw, widening_keys(project_found.data), project=project)
            source = str(project_found.path)
            settings = add(source, settings.merged(project_found.data, source), project_found.data)
    if env_accel := os.environ.get("VMSANDBOX_ACCEL"):
        accel = parse_accel(env_accel, source="VMSANDBOX_ACCEL")
        settings = add("VMSANDBOX_ACCEL", replace(settings, accel=accel), ["accel"])
    if env_uri := os.environ.get("VMSANDBOX_LIBVIRT_URI"):
        settings = add("VMSANDBOX_LIBVIRT_URI", replace(settings, libvirt_uri=env_uri), ["libvirt_uri"])
    if env_network := os.environ.get("VMSANDBOX_NETWORK"):
        network = netpolicy.parse_mode(env_network, source="VMSANDBOX_NETWORK")
        settings = add("VMSANDBOX_NETWORK", replace(settings, network=network), ["network"])
    return found


@dataclass(frozen=True)
class ProjectFile:
    path: Path
    raw: bytes  # the bytes trust is about
    data: dict[str, Any]  # parsed from exactly those bytes


def project_file(project: Path) -> ProjectFile | None:
    """A project's `.vmsandbox.yaml`, read without following links and checked (unknown keys and bad types
    are errors; `libvirt_uri` is refused: it names a program-running transport as easily as a host)."""
    path = project / PROJECT_FILE
    raw = trust.read_project_file(path, project)
    if raw is None:
        return None
    try:
        data = check(parse_yaml(raw, str(path)), FIELDS, source=str(path))
        Settings().merged(data, str(path))  # every value checked before anything asks for trust
    except VmsandboxError as exc:
        raise located(exc, str(path), raw) from None
    for key in ("libvirt_uri", "hosts"):
        if key not in data:
            continue
        raise VmsandboxError(
            f"{path}: `{key}` is never taken from a project file",
            hint=f"set it in {paths.config_dir() / USER_FILE}"
            + (" or VMSANDBOX_LIBVIRT_URI" if key == "libvirt_uri" else "")
            + ", then remove it there",
        )
    return ProjectFile(path, raw, data)


def read_file(path: Path, settings: Settings) -> tuple[Settings, list[str]]:
    """`settings` with a config file's keys laid over them, and the keys it set; an error names the file, the
    line and the key."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise VmsandboxError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        data = parse_yaml(raw, str(path))
        merged = settings.merged(data, str(path))
    except VmsandboxError as exc:
        raise located(exc, str(path), raw) from None
    return merged, list(data)


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
