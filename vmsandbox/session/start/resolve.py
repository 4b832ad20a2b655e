"""Resolving a `run` (or an agent shorthand): the flags, the blueprint and the settings (defaults < user config
< trusted project config < environment < flags) become the Options a session is created from, every check
that needs no VM first, and the blueprint's image layer found (or built) last."""

from __future__ import annotations

import sys
from pathlib import Path

from vmsandbox import ui
from vmsandbox.egress import policy
from vmsandbox.errors import UsageError, VmsandboxError
from vmsandbox.image import blueprint
from vmsandbox.session import settings
from vmsandbox.session.host import hosts
from vmsandbox.session.options import Options, Run, RunFlags, parse_publish, take_of
from vmsandbox.session.place import choose, hostspec
from vmsandbox.session.place.hostspec import HostSpec
from vmsandbox.session.record import validate_name
from vmsandbox.session.start import layer
from vmsandbox.session.start.project import validate_project


def resolve(path: Path, blueprint_name: str, command: list[str] | None, flags: RunFlags, *, agent: bool) -> Run:
    """Every check that needs no VM, cheapest first (a layer build takes minutes, so it comes last)."""
    validate_project(path)  # `~` or `/` is refused before anything reads its config
    project = path
    bp = blueprint.named(blueprint_name, project)  # a name that is no blueprint: a usage error
    tty = flags.tty
    if agent:
        command = bp.agent_argv(command or [])
        tty = sys.stdin.isatty() if tty is None else tty
    loaded = settings.load(project, blueprint=bp)
    try:  # what the command line says is checked here: a value refused is a usage error (exit 2)
        config = loaded.merged(flags.settings_data(), settings.COMMAND_LINE)
        publish = tuple(parse_publish(p, flags.publish_address) for p in flags.publish)
        if flags.name is not None:
            validate_name(flags.name)
    except VmsandboxError as exc:
        raise UsageError(exc.message, hint=exc.hint) from None
    if flags.review not in ("terminal", "web"):
        raise UsageError(f"--review {flags.review!r}: unknown", hint="--review terminal (the default) or web")
    policy.check_secrets(config.network, config.secrets)
    host = _host(config, flags)
    options = Options(
        project=path,
        name=flags.name,
        settings=config,
        keep=flags.keep,
        blueprint=bp,
        image=layer.for_blueprint(bp),
        publish=publish,
        ssh_agent=flags.ssh_agent,
        git_identity=flags.git_identity,
        cold=flags.cold,
        host=host,
    )
    return Run(options, command, tty, flags.yes, take_of(flags), web=flags.review == "web")


PLACE_TIMEOUT = 5.0  # a host that does not answer this fast is not placed on (and delays a run no more)


def _host(config: settings.Settings, flags: RunFlags) -> HostSpec | None:
    """The host a session goes to: --host, or with `hosts:` configured and no --host the one the simple rule
    picks (hosts.place; a fan-out is placed by --host only); None (this machine) without either."""
    if flags.host is not None:
        try:
            spec = hostspec.named(config.libvirt_uri, config.hosts, flags.host)
        except VmsandboxError as exc:
            raise UsageError(exc.message, hint=exc.hint) from None
    elif config.hosts and not flags.fanout:
        found = hosts.probe_all(hostspec.every(config.libvirt_uri, config.hosts), PLACE_TIMEOUT)
        placed = hosts.place(found, config.memory_mib)
        ui.info(f"Placing the session on host {placed.spec.name}: {placed.reason} (--host NAME chooses)")
        spec = placed.spec
    else:
        return None
    choose.check(spec)  # e.g. another host: an ssh URI, or the error that says so
    return spec
