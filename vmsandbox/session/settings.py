"""Settings: defaults < user config < project `.vmsandbox.yaml` < environment < command-line flags."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vmsandbox import paths, trust
from vmsandbox.egress import addresses, netpolicy
from vmsandbox.egress.mapping import SecretMapping, parse_secret_mapping
from vmsandbox.egress.netpolicy import Mode
from vmsandbox.errors import VmsandboxError
from vmsandbox.filemodels import BOOT_TIMEOUT_RANGE, MIN_DISK_MIB, MIN_MEMORY_MIB, MIN_SYNC_LIMIT_MIB, ConfigFile, keys
from vmsandbox.schema import ShapeError, all_at_once, check, located, parse_yaml
from vmsandbox.session.place.hostspec import HostSpec, parse_hosts, parse_uri
from vmsandbox.vm.accel import Accel

if TYPE_CHECKING:
    from vmsandbox.image.blueprint import Blueprint

PROJECT_FILE = ".vmsandbox.yaml"
COMMAND_LINE = "command line"  # as a source: keys are shown as the flags that set them
USER_FILE = "config.yaml"

FIELDS = keys(ConfigFile)  # the keys a config file takes (filemodels.ConfigFile: types, defaults, descriptions)
# What a VM may be given (filemodels): below the minimums the guest does not boot (memory), its image does not
# fit (disk), or nothing useful syncs; boot_timeout in seconds.
# The size keys, and the least each takes (MiB).
LEAST_MIB = {"memory": MIN_MEMORY_MIB, "disk": MIN_DISK_MIB, "sync_limit": MIN_SYNC_LIMIT_MIB, "mass_change_size": 1}
# Keys that only size the VM: a project file may set them without being trusted (`vmsandbox trust`).
SIZING_KEYS = frozenset({"cpus", "memory", "disk", "boot_timeout", "accel"})


_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*\Z", re.IGNORECASE)
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
    mass_change_files: int = 1000  # a review of more changed paths is a mass change (sync/mass.py)
    mass_change_size_mib: int = 1024  # … or of more MiB of changed files
    hosts: tuple[HostSpec, ...] = ()  # other libvirt hosts (hostspec.py); this machine is `libvirt_uri`

    def rules(self) -> tuple[netpolicy.Rule, ...]:
        return tuple(netpolicy.parse_rule(a, source="allowlist") for a in self.allow)

    def merged(self, data: dict[str, Any], source: str) -> Settings:
        """These settings with `data` (keys as in a file) laid over them. Every key's value is checked, and
        every one refused is said at once (one alone keeps its own message and hint)."""
        shape: ShapeError | None = None
        try:
            data = check(data, ConfigFile, source=source)
        except ShapeError as exc:  # the keys of the right shape are still checked, to say everything at once
            shape = exc
            data = {k: v for k, v in data.items() if k not in {key for key, _ in exc.items}}

        def label(key: str) -> str:
            return f"--{key}" if source == COMMAND_LINE else f"{source}: `{key}`"

        changes: dict[str, Any] = {}
        problems: list[tuple[str, VmsandboxError]] = []
        for key, value in data.items():
            try:
                changes.update(self._converted(key, value, label, source))
            except VmsandboxError as exc:
                problems.append((key, exc))
        all_at_once(source, problems, shape)
        return replace(self, **changes)

    def _converted(self, key: str, value: Any, label: Callable[[str], str], source: str) -> dict[str, Any]:
        """One key of a config layer as the changes it makes to the settings (VmsandboxError if refused)."""
        sizes = {
            "memory": MIN_MEMORY_MIB,
            "disk": MIN_DISK_MIB,
            "sync_limit": MIN_SYNC_LIMIT_MIB,
            "mass_change_size": 1,
        }
        if key in sizes:
            return {f"{key}_mib": parse_size_mib(value, what=label(key), least=sizes[key])}
        if key == "cpus" and not 1 <= value <= host_cpus():
            raise VmsandboxError(
                f"{label('cpus')} must be between 1 and {host_cpus()} (the host's CPUs)",
                hint="more vCPUs than the host has only makes the guest slower",
            )
        if key == "boot_timeout" and not BOOT_TIMEOUT_RANGE[0] <= value <= BOOT_TIMEOUT_RANGE[1]:
            low, high = BOOT_TIMEOUT_RANGE
            raise VmsandboxError(f"{label('boot_timeout')} must be between {low} and {high} seconds")
        if key == "mass_change_files" and value < 1:
            raise VmsandboxError(f"{label('mass_change_files')} must be at least 1")
        if key in ("cpus", "boot_timeout", "mass_change_files", "trust_host_ca"):
            return {key: value}
        if key == "accel":
            return {"accel": parse_accel(value, source=label("accel"))}
        if key == "libvirt_uri":  # held to the rules of `hosts:` URIs (no program-running transport)
            return {"libvirt_uri": parse_uri(value, source=label("libvirt_uri"))}
        if key == "hosts":
            return {"hosts": parse_hosts(value, source=source, parse_size_mib=parse_size_mib)}
        return self._network_change(key, value, label, source)

    def _network_change(self, key: str, value: Any, label: Callable[[str], str], source: str) -> dict[str, Any]:
        if key == "network":
            return {"network": netpolicy.parse_mode(value, source=label("network"))}
        if key == "allow":
            for entry in value:
                netpolicy.parse_rule(entry, source=label("allow"))
            return {"allow": tuple(dict.fromkeys([*self.allow, *(a.strip().lower() for a in value)]))}
        if key == "allow_networks":
            for entry in value:
                addresses.parse_network(entry, source=label("allow_networks"))
            return {"allow_networks": tuple(dict.fromkeys([*self.allow_networks, *value]))}
        added = [parse_secret_mapping(m, source=f"{source}: `secrets[{i}]`") for i, m in enumerate(value)]
        hosts = {m.host for m in added}
        return {"secrets": (*(m for m in self.secrets if m.host not in hosts), *added)}


def parse_accel(value: str, *, source: str) -> Accel:
    try:
        return Accel(value.lower())
    except ValueError:
        raise VmsandboxError(f"{source}: unknown accelerator {value!r}", hint="use auto, kvm or tcg") from None


def sync_limit() -> int:
    """The sync budget in bytes, from the user's settings (never from a project file: the project may be
    what the guest just changed)."""
    return load().sync_limit_mib * 1024**2


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
        uri = parse_uri(env_uri, source="VMSANDBOX_LIBVIRT_URI")
        settings = add("VMSANDBOX_LIBVIRT_URI", replace(settings, libvirt_uri=uri), ["libvirt_uri"])
    if env_cpus := os.environ.get("VMSANDBOX_CPUS"):
        if not env_cpus.isdigit():
            raise VmsandboxError(f"VMSANDBOX_CPUS={env_cpus!r} is not a number of vCPUs", hint="e.g. VMSANDBOX_CPUS=1")
        settings = add("VMSANDBOX_CPUS", settings.merged({"cpus": int(env_cpus)}, "VMSANDBOX_CPUS"), ["cpus"])
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
        data = check(parse_yaml(raw, str(path)), ConfigFile, source=str(path))
        _refuse_machine_keys(path, data)
        Settings().merged(data, str(path))  # every value checked before anything asks for trust
    except VmsandboxError as exc:
        raise located(exc, str(path), raw) from None
    return ProjectFile(path, raw, data)


def _refuse_machine_keys(path: Path, data: dict[str, Any]) -> None:
    for key in ("libvirt_uri", "hosts"):
        if key in data:
            raise VmsandboxError(
                f"{path}: `{key}` is never taken from a project file",
                hint=f"set it in {paths.config_dir() / USER_FILE}"
                + (" or VMSANDBOX_LIBVIRT_URI" if key == "libvirt_uri" else "")
                + ", then remove it there",
            )


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
    """The keys of a project file that need trust: those that reach beyond sizing the VM, and sizing keys past
    what a cloned repository may ask of this host unasked — memory over half of it, a disk larger than the
    free space where session disks live (cpus are held to the host's CPUs for every source)."""
    keys = {k for k in data if k not in SIZING_KEYS}
    if "memory" in data and parse_size_mib(data["memory"], what="memory") > host_memory_mib() // 2:
        keys.add("memory")
    if "disk" in data and parse_size_mib(data["disk"], what="disk") > free_disk_mib():
        keys.add("disk")
    return sorted(keys)


def host_memory_mib() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 1024**2


def free_disk_mib() -> int:
    """Free space where session disks are made (the state directory, or the nearest directory above it)."""
    where = paths.state_dir()
    while not where.exists() and where != where.parent:
        where = where.parent
    return shutil.disk_usage(where).free // 1024**2
