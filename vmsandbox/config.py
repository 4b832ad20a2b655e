"""Settings: defaults < user config < project `.vmsandbox.yaml` < environment < command-line flags."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from vmsandbox import paths
from vmsandbox.accel import Accel
from vmsandbox.errors import VmsandboxError
from vmsandbox.schema import check, load_yaml

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
}

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
        if "accel" in data:
            changes["accel"] = parse_accel(data["accel"], source=label("accel"))
        for key in ("libvirt_uri", "boot_timeout", "trust_host_ca"):
            if key in data:
                changes[key] = data[key]
        return replace(self, **changes)


def parse_accel(value: str, *, source: str) -> Accel:
    try:
        return Accel(value.lower())
    except ValueError:
        raise VmsandboxError(f"{source}: unknown accelerator {value!r}", hint="use auto, kvm or tcg") from None


def load(project: Path | None = None) -> Settings:
    settings = Settings()
    user_file = paths.config_dir() / USER_FILE
    if user_file.is_file():
        settings = settings.merged(load_yaml(user_file), str(user_file))
    if project is not None and (project / PROJECT_FILE).is_file():
        project_file = project / PROJECT_FILE
        settings = settings.merged(load_yaml(project_file), str(project_file))
    env_accel = os.environ.get("VMSANDBOX_ACCEL")
    if env_accel:
        settings = replace(settings, accel=parse_accel(env_accel, source="VMSANDBOX_ACCEL"))
    env_uri = os.environ.get("VMSANDBOX_LIBVIRT_URI")
    if env_uri:
        settings = replace(settings, libvirt_uri=env_uri)
    return settings
