"""Settings: defaults < user config < project `.vmsandbox.yaml` < environment < command-line flags."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vmsandbox import paths, trust
from vmsandbox.document import FileError, Problem, read_bytes, refused
from vmsandbox.egress.rules import netpolicy
from vmsandbox.egress.rules.mapping import SecretMapping
from vmsandbox.egress.rules.netpolicy import Mode
from vmsandbox.errors import VmsandboxError
from vmsandbox.schema import shape_problems
from vmsandbox.session import configread
from vmsandbox.session.configread import ProjectFile, read_config, read_project
from vmsandbox.session.place.hostspec import HostSpec, parse_uri
from vmsandbox.session.settingrows import BY_KEY, SIZING_KEYS, ConfigFile, parse_accel, parse_size_mib
from vmsandbox.vm.accel import Accel

if TYPE_CHECKING:
    from vmsandbox.image.blueprint import Blueprint

COMMAND_LINE = "command line"  # as a source: keys are shown as the flags that set them
PROJECT_FILE, USER_FILE = configread.PROJECT_FILE, configread.USER_FILE


@dataclass(frozen=True)
class Settings:
    """The settings a session gets: a field for each row of settingrows.SETTINGS (a size in MiB, `memory_mib`), its
    default that row's, read (a test holds the two together)."""

    cpus: int = 2
    memory_mib: int = 2048
    disk_mib: int = 20 * 1024
    accel: Accel = Accel.AUTO
    libvirt_uri: str = "qemu:///system"
    boot_timeout: int = 300
    trust_host_ca: bool = True
    network: Mode = Mode.ALLOWLIST
    allow: tuple[str, ...] = ()  # allowlist entries: the blueprint's first
    secrets: tuple[SecretMapping, ...] = ()
    allow_networks: tuple[str, ...] = ()  # non-public networks allowed names may resolve to
    sync_limit_mib: int = 16 * 1024  # a pull writes at most this much, and takes no larger file
    mass_change_files: int = 1000  # a review of more changed paths is a mass change (sync/mass.py)
    mass_change_size_mib: int = 1024  # … or of more MiB of changed files
    hosts: tuple[HostSpec, ...] = ()  # other libvirt hosts (hostspec.py); this machine is `libvirt_uri`

    def rules(self) -> tuple[netpolicy.Rule, ...]:
        return tuple(netpolicy.parse_rule(a, source="allowlist") for a in self.allow)

    def merged(self, data: dict[str, Any], source: str) -> Settings:
        """These settings with `data` (keys as in a file) laid over them; FileError with every key refused."""
        settings, problems = self.merging(data, source)
        if len(problems) == 1 and source == COMMAND_LINE:  # `--memory: …`, as a flag's error reads
            raise VmsandboxError(problems[0].text, hint=problems[0].hint)
        if problems:
            raise FileError(source, problems)
        return settings

    def merging(self, data: dict[str, Any], source: str) -> tuple[Settings, list[Problem]]:
        """These settings with the keys of `data` that pass laid over them, and a problem for each that does
        not: its shape's, then its value's (each entry of a list on its own), all at once, each at its key."""
        problems = shape_problems(data, ConfigFile)
        bad = [p.at for p in problems]

        def label(key: str) -> str:
            return f"--{key.split('[', maxsplit=1)[0]}" if source == COMMAND_LINE else f"{source}: `{key}`"

        changes: dict[str, Any] = {}
        for key, value in data.items():
            row = BY_KEY.get(key)
            if row is None:  # unknown, or not even a string: a problem of its shape already
                continue
            if (key,) in bad or (not row.listed and any(at[:1] == (key,) for at in bad)):
                continue
            held = row.field_name
            try:
                if row.listed:
                    skip = {at[1] for at in bad if len(at) > 1 and at[0] == key and isinstance(at[1], int)}
                    taken, refused_entries = row.entries(value, source, label, skip)
                    problems += refused_entries
                else:
                    taken = row.reads(value, label(key))
            except VmsandboxError as exc:
                problems += refused(exc, source, (key,))
                continue
            changes[held] = row.merge.combine(getattr(self, held), taken)
        return replace(self, **changes), problems


def sync_limit() -> int:
    """The sync budget in bytes, from the user's settings (never from a project file: the project may be
    what the guest just changed)."""
    return load().sync_limit_mib * 1024**2


def load(project: Path | None = None, *, blueprint: Blueprint | None = None) -> Settings:
    """The settings for a project; a blueprint's allowlist and secret mappings come first, then the files.

    A project's `.vmsandbox.yaml` is obeyed only as far as it is trusted (trust.py): keys that size the VM
    always, the rest only after `vmsandbox config trust`. `libvirt_uri` never comes from a project."""
    return layers(project, blueprint=blueprint)[-1].settings


def load_lenient(project: Path | None = None) -> tuple[Settings, list[VmsandboxError]]:
    """The settings as far as the files pass, and what is wrong with them: what a diagnostic (`ls`, `doctor`,
    `config show`) goes on with, saying what is broken. An untrusted project file is left out, its
    UntrustedError among them."""
    broken: list[VmsandboxError] = []
    return layers(project, broken=broken)[-1].settings, broken


@dataclass(frozen=True)
class Layer:
    source: str  # "default", a file, an environment variable
    settings: Settings  # the settings after it
    keys: frozenset[str]  # the keys it set


def layers(
    project: Path | None = None, *, blueprint: Blueprint | None = None, broken: list[VmsandboxError] | None = None
) -> list[Layer]:
    """The settings after each source that set something, in order (defaults first): `config show` tells
    from them where each effective setting came from. Given `broken`, a source with problems adds what of it
    passes and its problems to `broken` (what a diagnostic shows; an untrusted project file adds nothing
    but its UntrustedError); without it, its problems are raised."""
    found = [Layer("default", Settings(), frozenset())]

    def add(source: str, settings: Settings, keys: Iterable[str]) -> Settings:
        found.append(Layer(source, settings, frozenset(keys)))
        return settings

    def said(exc: VmsandboxError) -> None:
        if broken is None:
            raise exc
        broken.append(exc)

    settings = found[0].settings
    if blueprint is not None:
        data = blueprint.settings_data()
        settings = add(blueprint.source, settings.merged(data, blueprint.source), data)
    user_file = paths.config_dir() / USER_FILE
    if user_file.is_file():
        try:
            user = read_config(read_bytes(user_file), str(user_file), settings)
        except VmsandboxError as exc:  # cannot be read at all
            said(exc)
        else:
            if user.problems is not None:
                said(user.problems)
            settings = add(str(user_file), user.settings, user.data)
    if project is not None:
        try:
            settings = _project_layer(project, settings, add, said)
        except VmsandboxError as exc:  # untrusted too: the settings go on without the project's file
            said(exc)
    for name, change in _ENVIRONMENT.items():
        if value := os.environ.get(name):
            try:
                settings = add(name, *change(settings, value, name))
            except VmsandboxError as exc:
                said(exc)
    return found


def _project_layer(
    project: Path,
    settings: Settings,
    add: Callable[[str, Settings, Iterable[str]], Settings],
    said: Callable[[VmsandboxError], None],
) -> Settings:
    found = read_project(project, Settings())
    if found is None:
        return settings
    if found.problems is not None:
        said(found.problems)
    trust.require(found.path, found.raw, widening_keys(found.data), project=project)
    source = str(found.path)
    return add(source, settings.merged(found.data, source), found.data)


def _cpus(settings: Settings, value: str, name: str) -> tuple[Settings, list[str]]:
    if not value.isdigit():
        raise VmsandboxError(f"{name}={value!r} is not a number of vCPUs", hint=f"e.g. {name}=1")
    return settings.merged({"cpus": int(value)}, name), ["cpus"]


# The environment variables that set something, in order, and what each changes (after the files).
_ENVIRONMENT: dict[str, Callable[[Settings, str, str], tuple[Settings, list[str]]]] = {
    "VMSANDBOX_ACCEL": lambda s, v, name: (replace(s, accel=parse_accel(v, source=name)), ["accel"]),
    "VMSANDBOX_LIBVIRT_URI": lambda s, v, name: (replace(s, libvirt_uri=parse_uri(v, source=name)), ["libvirt_uri"]),
    "VMSANDBOX_CPUS": _cpus,
    "VMSANDBOX_NETWORK": lambda s, v, name: (replace(s, network=netpolicy.parse_mode(v, source=name)), ["network"]),
}


def project_file(project: Path) -> ProjectFile | None:
    """A project's `.vmsandbox.yaml`, read without following links and checked: every value before anything
    asks for trust (FileError with every problem, each at its line)."""
    found = read_project(project, Settings())
    if found is not None and found.problems is not None:
        raise found.problems
    return found


def read_file(path: Path, settings: Settings, *, project: bool = False) -> tuple[Settings, list[str]]:
    """`settings` with a config file's keys laid over them, and the keys it set; FileError with every
    problem of it, each at its line (a project's file: `libvirt_uri` and `hosts` refused too)."""
    read = read_config(read_bytes(path), str(path), settings, project=project)
    if read.problems is not None:
        raise read.problems
    return read.settings, list(read.data)


def read_config_text(text: str, source: str) -> Settings:
    """The settings a user config file's text gives (FileError with every problem of it, each at its line)."""
    read = read_config(text.encode(), source, Settings())
    if read.problems is not None:
        raise read.problems
    return read.settings


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
