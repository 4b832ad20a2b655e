"""The files people write, as pydantic v2 models: the keys each takes, their types, their defaults, what they
mean (the JSON Schema's descriptions) and the ranges the runtime holds them to. The models check a file's
shape, every problem at once (schema.check); what a value means (a size too small for a VM, a host that is not
public, a Debian package name) is checked where it is used: session.settings, image.blueprint, egress.rules.mapping,
session.place.hostspec. A test holds the schema's ranges and defaults to the runtime's."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, WithJsonSchema

MIN_MEMORY_MIB, MIN_DISK_MIB, MIN_SYNC_LIMIT_MIB = 256, 4096, 1
BOOT_TIMEOUT_RANGE = (1, 3600)
NODE_RANGE = (18, 40)
ACCELS = ("auto", "kvm", "tcg")  # vm.accel.Accel
NETWORKS = ("allowlist", "open", "none")  # egress.rules.netpolicy.Mode
SIZE_PATTERN = r"^\s*\d+\s*[KMGTkmgt]?(i?[Bb])?\s*$"
SIZE_SAID = "a size like 2G or 512M, or a number of MiB"


def _size(value: Any) -> str | int:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError(f"must be {SIZE_SAID}")  # noqa: TRY004 - pydantic makes a ValueError a validation error
    return value


def size(least_mib: int) -> Any:
    """A size: `2G`, `512M`, `1GiB`, or a plain number of MiB (at least `least_mib`, which the runtime holds)."""
    schema = {"oneOf": [{"type": "string", "pattern": SIZE_PATTERN}, {"type": "integer", "minimum": least_mib}]}
    return Annotated[str | int, PlainValidator(_size), WithJsonSchema(schema)]


if TYPE_CHECKING:
    Memory: TypeAlias = str | int
    Disk: TypeAlias = str | int
    SyncLimit: TypeAlias = str | int
    ChangeSize: TypeAlias = str | int
    KeepFree: TypeAlias = str | int
else:
    Memory, Disk, SyncLimit = size(MIN_MEMORY_MIB), size(MIN_DISK_MIB), size(MIN_SYNC_LIMIT_MIB)
    ChangeSize, KeepFree = size(1), size(0)


def ranged(low: int, high: int | None = None) -> dict[str, Any]:
    return {"minimum": low} if high is None else {"minimum": low, "maximum": high}


class File(BaseModel):
    """Unknown keys are errors; no value is converted (`cpus: "2"` is a string, not a number). A key whose
    default is None may be left out but not set to null (its type has no None: `# type: ignore` below)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class SecretEntry(File):
    secret: str = Field(description="The name of a secret kept on the host (`vmsandbox secret set NAME`).")
    host: str = Field(description="The public API host whose requests get it.")
    header: str = Field(description="The request header the egress proxy sets.")
    value: str = Field("{secret}", description="The header's value; {secret} stands for the secret.")
    env: str = Field(None, description="The guest variable that holds a placeholder for the secret.")  # type: ignore[assignment]
    required: bool = Field(True, description="A session does not start while the secret is not set.")


class HostEntry(File):
    name: str = Field(description="A short name: lower-case letters, digits and dashes (not `local`).")
    uri: str = Field(description="The host's libvirt URI, over ssh or TLS, e.g. qemu+ssh://me@big/system.")
    max_sessions: int = Field(None, description="At most this many sessions there.", json_schema_extra=ranged(1))  # type: ignore[assignment]
    keep_free: KeepFree = Field("1G", description="Memory left free there when placing a session.")
    pool_path: str = Field("/var/lib/libvirt/vmsandbox", description="Where its storage pool keeps disks.")


class ConfigFile(File):
    """~/.config/vmsandbox/config.yaml and a project's .vmsandbox.yaml."""

    cpus: int = Field(2, description="vCPUs of each VM (1 to the host's CPUs).", json_schema_extra=ranged(1))
    memory: Memory = Field("2G", description="Guest memory, e.g. 2G (at least 256M).")
    disk: Disk = Field("20G", description="Guest disk size, e.g. 20G (at least 4G).")
    accel: str = Field(
        "auto", description="auto (KVM when usable), kvm or tcg.", json_schema_extra={"enum": list(ACCELS)}
    )
    libvirt_uri: str = Field("qemu:///system", description="This machine's libvirt (your own config only).")
    boot_timeout: int = Field(
        300, description="Seconds a boot may take.", json_schema_extra=ranged(*BOOT_TIMEOUT_RANGE)
    )
    trust_host_ca: bool = Field(True, description="Give guests this host's local CA certificates.")
    network: str = Field(
        "allowlist",
        description="allowlist: listed hosts only; open: any public host; none: no egress.",
        json_schema_extra={"enum": list(NETWORKS)},
    )
    allow: list[str] = Field(default_factory=list, description="More hosts: HOST, *.DOMAIN or HOST:PORT.")
    allow_networks: list[str] = Field(
        default_factory=list, description="Non-public networks (CIDR) allowed host names may resolve to."
    )
    secrets: list[SecretEntry] = Field(
        default_factory=list, description="Host secrets the proxy puts into requests (never into the VM)."
    )
    sync_limit: SyncLimit = Field("16G", description="A pull writes at most this much (your own config only).")
    mass_change_files: int = Field(
        1000, description="A review of more changed paths is a mass change.", json_schema_extra=ranged(1)
    )
    mass_change_size: ChangeSize = Field("1G", description="… or of more changed bytes.")
    hosts: list[HostEntry] = Field(default_factory=list, description="Other libvirt hosts (your own config only).")


class LoginEntry(File):
    files: list[str] = Field(description="Home-relative files the agent's sign-in writes (kept by `vmsandbox login`).")
    command: list[str] = Field(
        default_factory=list, description="What signs in (default: the agent's command, interactive)."
    )


class BlueprintFile(File):
    """A blueprint: what a session of an agent (or your own kind) is made of."""

    extends: str = Field(None, description="The blueprint this one starts from.")  # type: ignore[assignment]
    description: str = Field(None, description="One line for `vmsandbox image ls --blueprints`.")  # type: ignore[assignment]
    apt: list[str] = Field(default_factory=list, description="Debian packages for the image layer.")
    npm: list[str] = Field(default_factory=list, description="Global npm packages for the image layer.")
    node: int = Field(  # type: ignore[assignment]
        None, description="Node.js major version (when npm is used).", json_schema_extra=ranged(*NODE_RANGE)
    )
    command: list[str] = Field(default_factory=list, description="The agent's command.")
    skip_permissions: list[str] = Field(
        default_factory=list, description="Its flags that skip permission prompts (the VM is the sandbox)."
    )
    allow: list[str] = Field(default_factory=list, description="Egress allowlist entries.")
    secrets: list[SecretEntry] = Field(default_factory=list, description="Secret mappings, as in the config.")
    copy_: list[str] = Field(
        default_factory=list, alias="copy", description="Files under ~ copied into the guest's home (never back)."
    )
    credentials: list[str] = Field(
        default_factory=list, description="Home-relative files `vmsandbox secret wipe` wipes."
    )
    env: dict[str, str] = Field(default_factory=dict, description="The environment of every login in the guest.")
    login: LoginEntry = Field(None, description="How the agent signs in, for logins kept across sessions.")  # type: ignore[assignment]


class RecipeFile(File):
    """An image recipe (images/*.yaml): every key is required."""

    suite: str
    mirror: str
    variant: str
    packages: list[str]
    kernel_cmdline: str
    filesystem_mib: int
    chroot_commands: list[str]
    enable: list[str]
    disable: list[str]
    mask: list[str]
    remove: list[str]


def keys(model: type[BaseModel]) -> tuple[str, ...]:
    """The keys a file (or an entry) of `model` takes, as written in it."""
    return tuple(f.alias or name for name, f in model.model_fields.items())
