"""Every key of a config file (`~/.config/vmsandbox/config.yaml`, a project's `.vmsandbox.yaml`) as one row, as
mkosi keeps its settings: the key, what a file may write there, its default as written, what it means, how its
value is read, how a later source meets an earlier one, and whether a project's file may set it. The file's
model (its shape, and the JSON Schema editors use) is made from the rows, a session's settings are laid from
them (settings.py), a project's file is held to them (configread.py), and the table in docs/configuration.md
is checked against them (tests/unit/test_settingrows.py). A new key is a new row, and a field of
settings.Settings that holds it."""

from __future__ import annotations

import enum
import os
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel, Field, create_model

from vmsandbox.document import Problem, did_you_mean, refused
from vmsandbox.egress.rules import addresses, netpolicy
from vmsandbox.egress.rules.mapping import parse_secret_mapping
from vmsandbox.errors import VmsandboxError
from vmsandbox.filemodels import File, HostEntry, SecretEntry, ranged, size
from vmsandbox.image import values
from vmsandbox.session.place.hostspec import parse_hosts, parse_uri
from vmsandbox.vm.accel import Accel

Read = Callable[[Any, str], Any]  # a value as written, and the words that name it (`FILE: `cpus``) -> as held
# A list's entries as written, the file, how to name one (`FILE: `hosts[1]``) and those whose shape was refused
# already -> the entries held and a problem at each refused.
ReadList = Callable[[list[Any], str, Callable[[str], str], set[int]], tuple[tuple[Any, ...], list[Problem]]]


class Merge(enum.Enum):
    """How a source's value meets what the sources before it gave (defaults < your file < the project's file <
    the environment < flags); the value is how docs/configuration.md says it."""

    REPLACES = "replaces"
    ADDS = "adds to"  # its entries, each once
    ADDS_PER_HOST = "adds to (per host)"  # a later entry for a host replaces an earlier one

    def combine(self, before: Any, given: Any) -> Any:
        if self is Merge.ADDS:
            return tuple(dict.fromkeys([*before, *given]))
        if self is Merge.ADDS_PER_HOST:
            hosts = {m.host for m in given}
            return (*(m for m in before if m.host not in hosts), *given)
        return given


class Project(enum.Enum):
    """Whether a project's `.vmsandbox.yaml` may set a key (trust.py: a project's file is obeyed only as far as you
    trusted its exact content); the value is how docs/configuration.md says it."""

    SIZES = "yes, without trust"  # it only sizes the VM (but memory and disk past what the host can give need it)
    TRUSTED = "once trusted"
    UNUSED = "unused (yours is read)"  # taken once trusted, but what reads it reads your own file only
    NEVER = "refused"  # a URI names a program as easily as a host


@dataclass(frozen=True, kw_only=True)
class Setting:
    """One key of a config file. A size (`least_mib` set) is held in MiB as `KEY_mib`; an integer with `low` (and
    `high`) is held to that range; a list's entries are read one by one, each refused on its own."""

    key: str
    type: Any  # what a file may write there, as the model's annotation
    default: Any  # as a file writes it
    help: str  # one line: the JSON Schema's description, and the docs table's
    read: Read | None = None  # None: a size, a range or a value as written, by the fields below
    merge: Merge = Merge.REPLACES
    project: Project = Project.TRUSTED
    least_mib: int | None = None
    low: int | None = None
    high: int | None = None
    unit: str = ""  # said after a range: " seconds"
    choices: type[enum.Enum] | None = None
    read_list: ReadList | None = None  # a list read whole (the default: each entry by `read`)

    @property
    def field_name(self) -> str:
        """The field of settings.Settings that holds it."""
        return self.key if self.least_mib is None else f"{self.key}_mib"

    @property
    def listed(self) -> bool:
        return typing.get_origin(self.type) is list

    def reads(self, value: Any, where: str) -> Any:
        """A value (a list's entry) as written, read to what the settings hold; VmsandboxError naming `where`."""
        if self.read is not None:
            return self.read(value, where)
        if self.least_mib is not None:
            return parse_size_mib(value, what=where, least=self.least_mib)
        if self.low is not None and not (self.low <= value and (self.high is None or value <= self.high)):
            if self.high is None:
                raise VmsandboxError(f"{where} must be at least {self.low}")
            raise VmsandboxError(f"{where} must be between {self.low} and {self.high}{self.unit}")
        return value

    def entries(
        self, given: list[Any], source: str, where: Callable[[str], str], skip: set[int]
    ) -> tuple[tuple[Any, ...], list[Problem]]:
        """A list's entries that pass, as held, and a problem at each refused (`skip`: refused already)."""
        if self.read_list is not None:
            return self.read_list(given, source, where, skip)
        taken: list[Any] = []
        problems: list[Problem] = []
        for i, entry in enumerate(given):
            if i in skip:
                continue
            try:
                taken.append(self.reads(entry, where(f"{self.key}[{i}]")))
            except VmsandboxError as exc:
                problems += refused(exc, source, (self.key, i))
        return tuple(taken), problems

    def model_field(self) -> tuple[Any, Any]:
        """Its field of the file's model: the annotation, and the default, description and schema."""
        extra: dict[str, Any] = {}
        if self.low is not None:
            extra.update(ranged(self.low, self.high))
        if self.choices is not None:
            extra["enum"] = [c.value for c in self.choices]
        default: dict[str, Any] = {"default_factory": list} if self.listed else {"default": self.default}
        annotation = size(self.least_mib) if self.least_mib is not None else self.type
        return annotation, Field(**default, description=self.help, json_schema_extra=extra or None)


_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*\Z", re.IGNORECASE)
_UNIT_MIB = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


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


def host_cpus() -> int:
    """The most vCPUs a session may have: the host's CPUs."""
    return os.cpu_count() or 1


def _cpus(value: int, where: str) -> int:
    if not 1 <= value <= host_cpus():
        raise VmsandboxError(
            f"{where} must be between 1 and {host_cpus()} (the host's CPUs)",
            hint="more vCPUs than the host has only makes the guest slower",
        )
    return value


def parse_accel(value: str, *, source: str) -> Accel:
    try:
        return Accel(value.lower())
    except ValueError:
        near = did_you_mean(value.lower(), [a.value for a in Accel])
        raise VmsandboxError(f"{source}: unknown accelerator {value!r}{near}", hint="use auto, kvm or tcg") from None


def _allowed(entry: str, where: str) -> str:
    values.allow_entry(entry, where)  # the check a blueprint's `allow` gets, in the same words
    return entry.strip().lower()


def _network(entry: str, where: str) -> str:
    addresses.parse_network(entry, source=where)
    return entry


def _hosts(
    given: list[Any], source: str, where: Callable[[str], str], skip: set[int]
) -> tuple[tuple[Any, ...], list[Problem]]:
    """The `hosts:` entries that pass, each checked on its own (hostspec.py), and a problem for each refused: a
    name given twice too."""
    taken: dict[str, int] = {}
    problems: list[Problem] = []
    for i, entry in enumerate(given):
        if i in skip:
            continue
        try:
            parse_hosts([entry], source=source, parse_size_mib=parse_size_mib)
        except VmsandboxError as exc:  # said of `hosts[0]`, the one entry it was given: of `hosts[i]` here
            one = refused(exc, source, ("hosts", i))
            problems += [replace(p, text=p.text.replace("`hosts[0]`", f"`hosts[{i}]`", 1)) for p in one]
            continue
        if entry["name"] in taken:
            first = taken[entry["name"]]
            twice = f"`hosts[{i}]`: the host name {entry['name']!r} is given twice (first in `hosts[{first}]`)"
            problems.append(Problem(twice, ("hosts", i, "name"), hint="give each host a name of its own"))
            continue
        taken[entry["name"]] = i
    kept = [given[i] for i in taken.values()]
    return parse_hosts(kept, source=source, parse_size_mib=parse_size_mib), problems


SETTINGS = (
    Setting(
        key="cpus", type=int, default=2, read=_cpus, low=1, project=Project.SIZES,
        help="vCPUs of each VM (1 to the host's CPUs).",
    ),
    Setting(
        key="memory", type=str | int, default="2G", least_mib=256, project=Project.SIZES,
        help="Guest memory, e.g. 2G (at least 256M).",
    ),
    Setting(
        key="disk", type=str | int, default="20G", least_mib=4096, project=Project.SIZES,
        help="Guest disk size, e.g. 20G (at least 4G).",
    ),
    Setting(
        key="accel", type=str, default="auto", read=lambda v, where: parse_accel(v, source=where), choices=Accel,
        project=Project.SIZES,
        help="auto (KVM when usable), kvm or tcg.",
    ),
    Setting(
        key="libvirt_uri", type=str, default="qemu:///system", read=lambda v, where: parse_uri(v, source=where),
        project=Project.NEVER,
        help="This machine's libvirt (your own config only).",
    ),
    Setting(
        key="boot_timeout", type=int, default=300, low=1, high=3600, unit=" seconds", project=Project.SIZES,
        help="Seconds a boot may take.",
    ),
    Setting(
        key="trust_host_ca", type=bool, default=True,
        help="Give guests this host's local CA certificates.",
    ),
    Setting(
        key="network", type=str, default="allowlist", read=lambda v, where: netpolicy.parse_mode(v, source=where),
        choices=netpolicy.Mode,
        help="allowlist: listed hosts only; open: any public host; none: no egress.",
    ),
    Setting(
        key="allow", type=list[str], default=[], read=_allowed, merge=Merge.ADDS,
        help="More hosts: HOST, *.DOMAIN or HOST:PORT.",
    ),
    Setting(
        key="allow_networks", type=list[str], default=[], read=_network, merge=Merge.ADDS,
        help="Non-public networks (CIDR) allowed host names may resolve to.",
    ),
    Setting(
        key="secrets", type=list[SecretEntry], default=[],
        read=lambda entry, where: parse_secret_mapping(entry, source=where), merge=Merge.ADDS_PER_HOST,
        help="Host secrets the proxy puts into requests (never into the VM).",
    ),
    Setting(
        key="sync_limit", type=str | int, default="16G", least_mib=1, project=Project.UNUSED,
        help="A pull writes at most this much (your own config only).",
    ),
    Setting(
        key="mass_change_files", type=int, default=1000, low=1, project=Project.UNUSED,
        help="A review of more changed paths is a mass change.",
    ),
    Setting(
        key="mass_change_size", type=str | int, default="1G", least_mib=1, project=Project.UNUSED,
        help="… or of more changed bytes.",
    ),
    Setting(
        key="hosts", type=list[HostEntry], default=[], read_list=_hosts, project=Project.NEVER,
        help="Other libvirt hosts (your own config only).",
    ),
)  # fmt: skip
BY_KEY = {s.key: s for s in SETTINGS}
FIELDS = tuple(BY_KEY)  # the keys a config file takes
SIZING_KEYS = frozenset(s.key for s in SETTINGS if s.project is Project.SIZES)  # a project sets them untrusted
MACHINE_KEYS = tuple(s.key for s in SETTINGS if s.project is Project.NEVER)  # never from a project's file


def key_of(field: str) -> str:
    """The key that sets a field of the settings, as a file writes it (`memory_mib` is set by `memory`)."""
    return next((s.key for s in SETTINGS if s.field_name == field), field)


ConfigFile: type[BaseModel] = create_model(  # type: ignore[call-overload]
    "ConfigFile",
    __base__=File,
    __doc__="~/.config/vmsandbox/config.yaml and a project's .vmsandbox.yaml.",
    **{s.key: s.model_field() for s in SETTINGS},
)
