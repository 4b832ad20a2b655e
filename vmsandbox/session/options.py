"""What a session is made from, typed: the flags of `run` (and of the agent shorthands, which share them) as
RunFlags, and the Options a session is created from (session.start.resolve builds them once from the flags, the
blueprint and the settings)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, replace
from pathlib import Path

from vmsandbox import ui
from vmsandbox.egress.ports import Publish
from vmsandbox.errors import VmsandboxError
from vmsandbox.image.blueprint import Blueprint
from vmsandbox.image.store import Image
from vmsandbox.session.place.hostspec import HostSpec
from vmsandbox.session.settings import Settings
from vmsandbox.sync.review.take import Take


@dataclass(frozen=True)
class RunFlags:
    """The command-line flags of `run` and of the agent shorthands (None: not given)."""

    name: str | None = None
    cpus: int | None = None
    memory: str | None = None
    disk: str | None = None
    accel: str | None = None
    keep: bool = False
    tty: bool | None = None
    yes: bool = False
    include_risky: bool = False
    include_ignored: bool = False
    include_binary: bool = False
    include_mass: bool = False
    send_secrets: bool = False  # files that look like credentials go into the VM too
    review: str = "terminal"  # where the review at the end happens: terminal, web
    network: str | None = None
    allow: tuple[str, ...] = ()
    publish: tuple[str, ...] = ()
    publish_address: str | None = None
    ssh_agent: bool = False
    git_identity: bool = False
    cold: bool = False
    fanout: int | None = None  # start this many sessions (a fan-out), each running the command
    check: str | None = None  # with fanout: a shell command whose exit code says whether a session's result passes
    host: str | None = None  # the libvirt host to run on (`hosts:`; None: this machine)

    def settings_data(self) -> dict[str, object]:
        """The flags that are settings, as a config layer (the last one)."""
        data: dict[str, object] = {
            k: getattr(self, k) for k in ("cpus", "memory", "disk", "accel", "network") if getattr(self, k) is not None
        }
        if self.allow:
            data["allow"] = list(self.allow)
        return data


@dataclass(frozen=True)
class Options:
    """Everything a session is created from."""

    project: Path
    name: str | None
    settings: Settings
    keep: bool = False
    blueprint: Blueprint | None = None  # None: base
    image: Image | None = None  # None: the current base image
    publish: tuple[Publish, ...] = ()
    ssh_agent: bool = False
    git_identity: bool = False
    build_disk: Path | None = None  # image builds: boot this disk read-write (no overlay), as root
    trusted_build: bool = False  # image builds: allowed names may resolve to private addresses (not loopback)
    cold: bool = False  # boot, even where a warm-start template could serve (--cold)
    group: str | None = None  # a fan-out's name, shared by its sessions
    baseline_from: Path | None = None  # copy this capture of the project (a fan-out's) instead of capturing again
    host: HostSpec | None = None  # another libvirt host to run on (None: this machine, `libvirt_uri`)
    leave_out: tuple[str, ...] = ()  # project files that stay out of the VM (credentials: sync/inbound.py)


@dataclass(frozen=True)
class Run:
    """A `run` (or an agent shorthand) resolved: what to create, what to run in it, how to end."""

    options: Options
    command: list[str] | None
    tty: bool | None
    yes: bool
    take: Take  # what --yes takes beyond the safe, reviewable changes
    web: bool = False  # the review at the end in the browser (`--review web`)


def parse_publish(spec: str, address: str | None, *, said: str = "--publish", example: str = "-p {}") -> Publish:
    """`[HOST_PORT:]GUEST_PORT`, on `address` instead of loopback when given. An error names the spec as `said`
    (the flag, or `port`) and shows `example` (with a spec in its `{}`)."""
    host_text, _, guest_text = spec.rpartition(":")
    ports = [host_text, guest_text] if host_text else [guest_text]
    if not all(p.isdigit() and 0 < int(p) < 65536 for p in ports):
        raise VmsandboxError(
            f"{said} {spec!r}: ports are numbers from 1 to 65535",
            hint=f"e.g. {example.format(3000)} or {example.format('8080:3000')}",
        )
    published = Publish(int(guest_text), int(host_text) if host_text else None)
    if address is None:
        return published
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        raise VmsandboxError(f"--publish-address {address!r} is not an IP address") from None
    if not ip.is_loopback:
        ui.warn(f"publishing on {address}: other machines on that network can reach the guest's port")
    return replace(published, addresses=(str(ip),))


def take_of(flags: RunFlags) -> Take:
    """What `--yes` takes beyond the safe, reviewable changes, as the flags say."""
    return Take(
        risky=flags.include_risky, ignored=flags.include_ignored, binary=flags.include_binary, mass=flags.include_mass
    )
