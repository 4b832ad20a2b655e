"""The command line: the only place that turns VmsandboxError into a red line, a hint and an exit code."""

from __future__ import annotations

import inspect
import itertools
import json
import logging
import logging.handlers
import os
import signal
import sys
import time
import typing
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.table import Table

from vmsandbox import __version__, paths, ui
from vmsandbox.errors import VmsandboxError
from vmsandbox.session import config

if TYPE_CHECKING:  # the session module pulls in libvirt: imported lazily by the commands that need it
    from vmsandbox import trust
    from vmsandbox.session.core import Publish, Record

EXIT_ERROR = 125  # vmsandbox itself failed (as `docker run` does), so a command's own codes stay distinct
EXIT_INTERRUPTED = 130
EXIT_PENDING = 3  # pull/recover: changes remain unsynced

app = typer.Typer(
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=False,
    help="Run AI coding agents in disposable VMs and review what they changed.",
)
image_app = typer.Typer(no_args_is_help=True, help="Build, list and remove base images.")
host_app = typer.Typer(no_args_is_help=True, help="Host set-up where no service manager does it.")
secret_app = typer.Typer(no_args_is_help=True, help="Secrets kept on the host and injected by the egress proxy.")
app.add_typer(image_app, name="image")
app.add_typer(host_app, name="host")
app.add_typer(secret_app, name="secret")


# Parameters several commands share.
SessionName = Annotated[str, typer.Argument(help="Session name.")]
ApplySafe = Annotated[bool, typer.Option("--yes", "-y", help="Apply the safe, non-conflicting changes.")]
IncludeRisky = Annotated[bool, typer.Option("--include-risky", help="Apply quarantined changes too.")]


class _Invocation:
    """Everything after the first `--` on the command line: the command to run in the guest.

    It is split off before typer parses the rest, so `vmsandbox run -- ls /` never takes `ls` as PATH.
    """

    command: list[str] | None = None


def _tail(required: bool) -> list[str] | None:
    if required and not _Invocation.command:
        raise VmsandboxError("no command given", hint="put the command after `--`, e.g. `-- make test`")
    return _Invocation.command or None


def _sync_limit() -> int:
    """The sync budget in bytes, from the user's settings (never from a project file: the project may be
    what the guest just changed)."""
    return config.load().sync_limit_mib * 1024**2


def _print_json(data: Any) -> None:
    ui.out.print_json(json.dumps(data), indent=2) if sys.stdout.isatty() else print(json.dumps(data, indent=2))


def _age(seconds: float) -> str:
    s = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"


# ---------------------------------------------------------------- image


@image_app.command("build")
def image_build(
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if this recipe is already built.")] = False,
    no_host_ca: Annotated[
        bool, typer.Option("--no-host-ca", help="Do not trust the host's locally added CA certificates in the image.")
    ] = False,
    blueprint_name: Annotated[
        str | None,
        typer.Option("--blueprint", "-b", help="Build this blueprint's layer on the base instead (claude, codex, …)."),
    ] = None,
) -> None:
    """Build the base image locally from Debian packages, or a blueprint's thin layer on it (needs root)."""
    from vmsandbox.image import store as image

    if blueprint_name is not None:
        _build_blueprint(blueprint_name, force=force)
        return
    settings = config.load()
    trust = settings.trust_host_ca and not no_host_ca
    recipe = image.load_recipe(trust_host_ca=trust)
    ui.info(
        f"Base image {recipe.version}"
        + (f" (trusting {len(recipe.ca_certs)} host CA certificate(s))" if recipe.ca_certs else "")
    )
    start = time.monotonic()
    built, did_build = image.build(force=force, recipe=recipe)
    if did_build:
        ui.info(f"[green]Built[/] {built.version} in {time.monotonic() - start:.0f}s → {built.path}")
    else:
        ui.info(f"{built.version} is already built for this recipe; nothing to do (use --force to rebuild)")


def _build_blueprint(name: str, *, force: bool) -> None:
    from vmsandbox.image import blueprint
    from vmsandbox.image import layers as bpimage

    bp = blueprint.load(name, Path.cwd())
    start = time.monotonic()
    built, did_build = bpimage.build_layer(bp, force=force)
    if did_build:
        ui.info(f"[green]Built[/] {built.version} in {time.monotonic() - start:.0f}s → {built.path}")
        for package, version in sorted(built.manifest.get("installed", {}).items()):
            ui.info(ui.printable(f"  {package} {version}"))
    else:
        ui.info(f"{built.version} is already built for this blueprint and base; nothing to do (--force rebuilds)")


@image_app.command("ls")
def image_ls(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """List built base images."""
    from vmsandbox.image import layers as bpimage
    from vmsandbox.image import store as image

    images = [i.summary() | {"kind": "base"} for i in image.list_images()]
    images += [
        i.summary() | {"kind": f"blueprint {i.manifest.get('blueprint')}", "base": i.manifest.get("base_version")}
        for i in bpimage.list_layers()
    ]
    if as_json:
        _print_json(images)
        return
    if not images:
        ui.info("No base images. Build one with `sudo vmsandbox image build`.")
        return
    table = Table("VERSION", "KIND", "BUILT", "SIZE", "KERNEL", box=None)
    for i in images:
        size = f"{(i['disk_bytes'] or 0) / 1024**2:.0f} MiB"
        table.add_row(i["version"], i["kind"], str(i["built_at"]), size, i["kernel"])
    ui.out.print(table)


@image_app.command("rm")
def image_rm(version: Annotated[str, typer.Argument(help="The version shown by `image ls`.")]) -> None:
    """Remove a base image or a blueprint layer (refused while a session or a layer uses it)."""
    from vmsandbox.image import layers as bpimage
    from vmsandbox.image import store as image
    from vmsandbox.session import core as session

    def in_use(v: str) -> list[str]:
        users = [f"blueprint image {b.version}" for b in bpimage.list_layers() if b.manifest.get("base_version") == v]
        for name in session.names():
            try:
                if session.Record.load(name).image_version == v:
                    users.append(f"session {name}")
            except VmsandboxError:
                continue
        return users

    if any(layer.version == version for layer in bpimage.list_layers()):
        bpimage.remove_layer(version, in_use=in_use)
        ui.info(f"Removed blueprint image {version}")
        return
    image.remove(version, in_use=in_use)
    ui.info(f"Removed base image {version}")


# ---------------------------------------------------------------- host


@host_app.command("setup")
def host_setup() -> None:
    """Give /dev/kvm udev's group and mode and start virtlogd and libvirtd (needs root)."""
    from vmsandbox.vm import hostsetup

    for line in hostsetup.setup(config.load().libvirt_uri):
        ui.info(f"[green]✓[/] {line}")


@app.command("trust")
def trust_command(
    path: Annotated[
        Path, typer.Argument(help="A project directory (or its .vmsandbox.yaml / a blueprint file in it).")
    ] = Path(),
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Trust without asking (after showing).")] = False,
    revoke: Annotated[bool, typer.Option("--revoke", help="Stop trusting these files.")] = False,
    list_all: Annotated[bool, typer.Option("--list", help="List every trusted file and whether it changed.")] = False,
) -> None:
    """Trust a project's .vmsandbox.yaml and .vmsandbox/blueprints/*.yaml, after showing what they change.

    A project file that widens what a session may do (network, allowlist, secrets, blueprints) is used only
    once you trusted its exact content; a changed file must be trusted again. Trust is kept outside every
    project, in your config directory.
    """
    from vmsandbox import trust

    if list_all:
        _list_trusted()
        return
    candidates = _trust_candidates(path)
    if revoke:
        for c in candidates:
            if trust.revoke(c.path):
                ui.info(f"No longer trusted: {ui.printable(str(c.path))}")
        return
    for c in candidates:
        st = c.state
        label = "trusted" if st.trusted else "changed since you trusted it" if st.changed else "not trusted"
        ui.err.print(f"[bold]{ui.printable(str(c.path))}[/] ({label}, sha256 {trust.digest(c.raw)[:12]})")
        for line in c.lines:
            ui.err.print(f"  {ui.printable(line)}")
    todo = [c for c in candidates if not c.state.trusted]
    if not todo:
        ui.info("Everything shown is trusted already.")
        return
    if not yes:
        if not ui.is_interactive():
            raise VmsandboxError("nothing trusted: no terminal to ask on", hint="rerun with --yes after reading it")
        answer = ui.err.input(f"Trust {len(todo)} file(s) with exactly this content? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            ui.info("Nothing trusted.")
            raise typer.Exit(1)
    for c in todo:
        trust.trust(c.path, c.raw)
        ui.info(f"[green]Trusted[/] {ui.printable(str(c.path))}")


def _trust_candidates(path: Path) -> list[trust.Candidate]:
    """The project config files at path (a project directory, or one of its files)."""
    from vmsandbox.image import blueprint

    project = path.parent if path.is_file() else path
    if project.name == "blueprints" and project.parent.name == ".vmsandbox":
        project = project.parent.parent
    candidates = [c for c in [config.describe_project_file(project)] if c is not None]
    candidates += blueprint.describe_project_blueprints(project)
    if path.is_file():
        candidates = [c for c in candidates if c.path.resolve() == path.resolve()]
    if not candidates:
        raise VmsandboxError(
            f"no project config in {path}", hint="`vmsandbox trust` reads .vmsandbox.yaml and .vmsandbox/blueprints/"
        )
    return candidates


def _list_trusted() -> None:
    from vmsandbox import trust

    for name, entry in sorted(trust.records().items()):
        path = Path(name)
        try:
            raw = trust.read_project_file(path)
        except VmsandboxError:
            raw = None
        state = "missing" if raw is None else "trusted" if trust.state(path, raw).trusted else "changed (untrusted)"
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(entry.get("trusted_at", 0))))
        print(f"{state:20} {when}  {ui.printable(name, markup=False)}")  # the path last: never cut


@app.command()
def doctor(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Check everything a session needs; print the fix for each failure."""
    from vmsandbox import trust
    from vmsandbox.session import doctor as doctor_mod

    try:
        settings = config.load(Path.cwd())
    except trust.UntrustedError as exc:
        ui.warn(f"{exc.message} — checking with your own settings only")
        settings = config.load()
    checks = doctor_mod.run_checks(settings)
    if as_json:
        _print_json([{"name": c.name, "level": c.level, "detail": c.detail, "fix": c.fix} for c in checks])
    else:
        marks = {"ok": "[green]✓[/]", "warn": "[yellow]![/]", "fail": "[red]✗[/]"}
        for c in checks:
            ui.err.print(f"{marks[c.level]} {c.name}: {c.detail}")
            if c.fix and not c.ok:
                ui.err.print(f"    fix: {c.fix}")
    failed = [c for c in checks if c.level == "fail"]
    if failed:
        if not as_json:
            ui.err.print(f"[red]A session cannot start here:[/] {len(failed)} check(s) failed.")
        raise typer.Exit(1)


# ---------------------------------------------------------------- sessions


@app.command(context_settings={"help_option_names": ["-h", "--help"]})
def run(
    path: Annotated[Path, typer.Argument(help="The project directory.")] = Path(),
    name: Annotated[str | None, typer.Option("--name", help="Session name (default: from the directory).")] = None,
    cpus: Annotated[int | None, typer.Option("--cpus", help="vCPUs.")] = None,
    memory: Annotated[str | None, typer.Option("--memory", help="Guest memory, e.g. 2G.")] = None,
    disk: Annotated[str | None, typer.Option("--disk", help="Guest disk size, e.g. 20G.")] = None,
    accel: Annotated[str | None, typer.Option("--accel", help="auto, kvm or tcg.")] = None,
    keep: Annotated[bool, typer.Option("--keep", help="Keep the VM after the command or shell ends.")] = False,
    tty: Annotated[
        bool | None, typer.Option("--tty/--no-tty", "-t", help="Give CMD a terminal (default: only for the shell).")
    ] = None,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="At the end, apply the safe, non-conflicting changes.")
    ] = False,
    include_risky: Annotated[
        bool, typer.Option("--include-risky", help="With --yes, apply quarantined changes too.")
    ] = False,
    network: Annotated[
        str | None,
        typer.Option("--network", help="allowlist (default): listed hosts only; open: any public host; none."),
    ] = None,
    allow: Annotated[
        list[str] | None,
        typer.Option("--allow", help="Also allow HOST, *.DOMAIN or HOST:PORT (repeatable)."),
    ] = None,
    blueprint: Annotated[
        str, typer.Option("--blueprint", "-b", help="base, claude, codex, gemini, opencode, or your own.")
    ] = "base",
    publish: Annotated[
        list[str] | None,
        typer.Option("--publish", "-p", help="[HOST_PORT:]GUEST_PORT: reach a guest port on 127.0.0.1 and ::1."),
    ] = None,
    publish_address: Annotated[
        str | None, typer.Option("--publish-address", help="Publish on this address instead of loopback.")
    ] = None,
    ssh_agent: Annotated[
        bool, typer.Option("--ssh-agent", help="Forward your ssh-agent into the guest (it can use your keys).")
    ] = False,
    git_identity: Annotated[
        bool, typer.Option("--git-identity", help="Copy your git user.name and user.email into the guest.")
    ] = False,
) -> None:
    """Boot a disposable VM for PATH and run CMD (after `--`) or a shell in it; exit with CMD's code.

    CMD is an argument list (quoted for the guest's shell); use `-- sh -c '...'` for shell syntax.
    """
    _run_session(
        path,
        blueprint,
        _tail(required=False),
        {
            "name": name,
            "cpus": cpus,
            "memory": memory,
            "disk": disk,
            "accel": accel,
            "keep": keep,
            "tty": tty,
            "yes": yes,
            "include_risky": include_risky,
            "network": network,
            "allow": allow,
            "publish": publish,
            "publish_address": publish_address,
            "ssh_agent": ssh_agent,
            "git_identity": git_identity,
        },
    )


def _run_session(
    path: Path, blueprint_name: str, cmd: list[str] | None, o: dict[str, Any], *, agent: bool = False
) -> NoReturn:
    from vmsandbox.egress import policy as egress
    from vmsandbox.guest import commands as guest
    from vmsandbox.image import blueprint
    from vmsandbox.image import layers as bpimage
    from vmsandbox.session import core as session

    project = path if path.is_dir() else None
    bp = blueprint.load(blueprint_name, project)
    if agent:
        cmd = bp.agent_argv(cmd or [])
        if o["tty"] is None:
            o["tty"] = sys.stdin.isatty()
    flags = {k: o[k] for k in ("cpus", "memory", "disk", "accel", "network", "allow")}
    settings = config.load(project, blueprint=bp).merged(
        {k: v for k, v in flags.items() if v is not None}, config.COMMAND_LINE
    )
    publish = tuple(_parse_publish(p, o["publish_address"]) for p in o["publish"] or [])
    session.validate_project(path)  # the cheap checks first: a layer build takes minutes
    egress.check_secrets(settings)
    keep, tty = bool(o["keep"]), o["tty"]
    options = session.Options(
        project=path,
        name=o["name"],
        settings=settings,
        keep=keep,
        blueprint=bp,
        image=bpimage.for_blueprint(bp),
        publish=publish,
        ssh_agent=bool(o["ssh_agent"]),
        git_identity=bool(o["git_identity"]),
    )
    record = session.create(options)
    code = EXIT_ERROR
    try:
        code = guest.attach(record, cmd, tty=tty)
        if code == guest.SSH_FAILED and session.stops_within(record, seconds=15):
            ui.warn(f"the VM shut down while the command ran; its console log: `vmsandbox logs {record.name}`")
    finally:
        if keep:
            ui.info(
                f"Session [bold]{record.name}[/] keeps running: `vmsandbox shell {record.name}`, "
                f"`vmsandbox pull {record.name}`, `vmsandbox destroy {record.name}`"
            )
        else:
            _finish(record, yes=bool(o["yes"]), include_risky=bool(o["include_risky"]))
    raise typer.Exit(code)


def _parse_publish(spec: str, address: str | None) -> Publish:
    import ipaddress
    from dataclasses import replace

    from vmsandbox.session import core as session

    host_text, _, guest_text = spec.rpartition(":")
    ports = [host_text, guest_text] if host_text else [guest_text]
    if not all(p.isdigit() and 0 < int(p) < 65536 for p in ports):
        raise VmsandboxError(
            f"--publish {spec!r}: ports are numbers from 1 to 65535", hint="e.g. -p 3000 or -p 8080:3000"
        )
    published = session.Publish(int(guest_text), int(host_text) if host_text else None)
    if address is None:
        return published
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        raise VmsandboxError(f"--publish-address {address!r} is not an IP address") from None
    if not ip.is_loopback:
        ui.warn(f"publishing on {address}: other machines on that network can reach the guest's port")
    return replace(published, addresses=(str(ip),))


AGENTS = ("claude", "codex", "gemini", "opencode")


def _agent_command(agent: str) -> Callable[..., None]:
    """`vmsandbox AGENT [PATH] [-- ARGS]`: `run --blueprint AGENT PATH -- <its command> <skip flag> ARGS`,
    with `run`'s options (but --blueprint), ending with the review."""

    def command(**options: Any) -> None:
        path = options.pop("path")
        _run_session(path, agent, _Invocation.command or [], options, agent=True)

    hints = typing.get_type_hints(run, include_extras=True)  # run's annotations are strings (PEP 563)
    params = [
        p.replace(annotation=hints[p.name]) for p in inspect.signature(run).parameters.values() if p.name != "blueprint"
    ]
    command.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__doc__ = (
        f"Run {agent} in a disposable VM on PATH — with its permission prompts off, the VM is the sandbox — "
        f"then review what it changed. ARGS after `--` go to {agent}."
    )
    command.__name__ = agent
    return command


for _agent in AGENTS:
    app.command(_agent, context_settings={"help_option_names": ["-h", "--help"]})(_agent_command(_agent))


def _finish(record: Record, *, yes: bool, include_risky: bool) -> None:
    """End of `run`: review the guest's changes, then destroy the VM. Whatever was not synced is exported to
    the session's outbox first, so nothing is lost: `vmsandbox recover NAME` takes it from there."""
    from vmsandbox.session import core as session
    from vmsandbox.sync import syncback

    g = syncback.gather(record, limit=_sync_limit())
    out = syncback.review(g, yes=yes, include_risky=include_risky, dry_run=False, interactive=ui.is_interactive())
    syncback.report(g, out)
    if syncback.pending(g):
        box = syncback.export(g)
        with ui.step(f"Destroying {record.domain} (unsynced changes kept in {box})"):
            session.retire(record)
        ui.warn(f"{record.unsynced} change(s) were not synced back; review them with `vmsandbox recover {record.name}`")
    else:
        with ui.step(f"Destroying {record.domain}"):
            session.remove(record)


@app.command()
def shell(name: SessionName) -> None:
    """Open an interactive shell in a session, in the project directory."""
    from vmsandbox.guest import commands as guest
    from vmsandbox.session import core as session

    record = _ready(session.Record.load(name))
    raise typer.Exit(guest.attach(record, None))


@app.command("exec")
def exec_(
    name: SessionName,
    tty: Annotated[bool, typer.Option("--tty", "-t", help="Give CMD a terminal.")] = False,
) -> None:
    """Run CMD (after `--`) in a session's project directory; exit with its code."""
    from vmsandbox.guest import commands as guest
    from vmsandbox.session import core as session

    cmd = _tail(required=True)
    record = _ready(session.Record.load(name))
    raise typer.Exit(guest.attach(record, cmd, tty=tty))


def _ready(record: Record) -> Record:
    from vmsandbox.egress import policy as egress
    from vmsandbox.session import core as session
    from vmsandbox.vm.virt import Hypervisor

    with Hypervisor(record.libvirt_uri) as hv:
        state = session.status(record, hv).state
    if state == "exported":
        raise VmsandboxError(
            f"session {record.name} has no VM any more; its unsynced changes wait in its outbox",
            hint=f"review them with `vmsandbox recover {record.name}`",
        )
    if state in ("stopped", "booting"):
        raise VmsandboxError(
            f"session {record.name} is {state}",
            hint=f"see `vmsandbox logs {record.name}`; `vmsandbox recover {record.name}` reviews its changes, "
            f"`vmsandbox destroy {record.name}` removes it",
        )
    if egress.status(record.files, wanted=record.wants_daemon) == "stopped":
        ui.warn(f"the egress proxy of session {record.name} had stopped, so the guest had no network; restarting it")
        with ui.step("Restarting the egress proxy"):
            egress.start(record.name, record.files)
    return record


@app.command()
def port(
    name: SessionName,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show a session's published ports (`run --publish`)."""
    from vmsandbox.session import core as session

    record = session.Record.load(name)
    if as_json:
        _print_json(record.publish)
        return
    if not record.publish:
        ui.info(f"Session {name} publishes no ports (use `run --publish [HOST_PORT:]GUEST_PORT`).")
        return
    for p in record.publish:
        for where in session.published_at(p):
            print(f"{p['guest']}/tcp -> {where}")


@app.command("ls")
def ls(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """List sessions."""
    from vmsandbox.session import core as session

    rows = [s.as_dict() for s in session.all_status(config.load().libvirt_uri)]
    if as_json:
        _print_json(rows)
        return
    if not rows:
        ui.info("No sessions.")
        return
    table = Table("NAME", "STATE", "AGE", "ACCEL", "SSH", "MEMORY", "NETWORK", "UNSYNCED", "PROJECT", box=None)
    for r in rows:
        table.add_row(
            r["name"],
            r["state"],
            _age(r["age_seconds"]),
            r["accel"],
            f"127.0.0.1:{r['ports']['ssh']}",
            f"{r['memory_mib']} MiB",
            r["network"] + ("" if r["egress"] in ("up", "off") else f" ({r['egress']})"),
            "?" if r["unsynced"] is None else str(r["unsynced"]),
            r["project"],
        )
    ui.out.print(table)


@app.command()
def destroy(
    name: SessionName,
    force: Annotated[
        bool, typer.Option("--force", help="Destroy even with unsynced changes (they are exported to the outbox).")
    ] = False,
    discard: Annotated[bool, typer.Option("--discard", help="Destroy and throw unsynced changes away.")] = False,
) -> None:
    """Destroy a session's VM and remove its files — never silently losing unsynced changes."""
    from vmsandbox.session import core as session
    from vmsandbox.sync import syncback

    try:
        record = session.Record.load(name)
    except VmsandboxError:
        files = paths.session_paths(session.validate_name(name))
        if (force or discard) and files.root.is_dir():
            import shutil

            shutil.rmtree(files.root)
            ui.info(f"Removed the damaged session directory {files.root}")
            return
        raise
    if record.owner_alive() and not (force or discard):
        raise VmsandboxError(
            f"session {name} is in use by `vmsandbox run` (pid {record.owner_pid})",
            hint=f"end that command, or `vmsandbox destroy {name} --force`",
        )
    if not discard and record.files.baseline_manifest.exists():
        g = syncback.gather(record, limit=_sync_limit())
        left = syncback.pending(g)
        record.unsynced = len(left)
        record.save()
        if left and not force:
            listing = ", ".join(c.path for c in left[:5]) + (" …" if len(left) > 5 else "")
            raise VmsandboxError(
                f"session {name} holds {len(left)} unsynced change(s): {listing}",
                hint=f"review them with `vmsandbox pull {name}`; `destroy --force` exports them to the session's "
                "outbox first, `destroy --discard` throws them away",
            )
        if left:
            box = syncback.export(g)
            with ui.step(f"Destroying {record.domain} (unsynced changes exported to {box})"):
                session.retire(record)
            ui.info(f"Review them later with `vmsandbox recover {name}`; drop them with `destroy {name} --discard`.")
            return
    with ui.step(f"Destroying {record.domain}"):
        session.remove(record)


def _review_command(name: str, *, yes: bool, dry_run: bool, include_risky: bool, only: list[str]) -> None:
    from vmsandbox.session import core as session
    from vmsandbox.sync import syncback

    record = session.Record.load(name)
    g = syncback.gather(record, limit=_sync_limit())
    out = syncback.review(
        g, yes=yes, include_risky=include_risky, dry_run=dry_run, interactive=ui.is_interactive(), only=only
    )
    if dry_run:
        return
    syncback.report(g, out)
    left = syncback.pending(g)
    if record.exported and not left:
        session.remove(record)
        ui.info(f"Every change of session {name} is dealt with; the session is removed.")
    if left:
        raise typer.Exit(EXIT_PENDING)


@app.command()
def pull(
    name: SessionName,
    only: Annotated[list[str] | None, typer.Argument(help="Only these paths (files or directories).")] = None,
    yes: ApplySafe = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what would happen; write nothing.")] = False,
    include_risky: IncludeRisky = False,
) -> None:
    """Review the guest's changes and sync the accepted ones into the project (three-way).

    Exit code 0 when everything is synced, 3 when changes remain (quarantined, skipped, or unapplied).
    """
    _review_command(name, yes=yes, dry_run=dry_run, include_risky=include_risky, only=only or [])


@app.command()
def recover(
    name: SessionName,
    yes: ApplySafe = False,
    include_risky: IncludeRisky = False,
) -> None:
    """Review and apply a session's unsynced changes after its VM is gone (from its outbox or its disk)."""
    _review_command(name, yes=yes, dry_run=False, include_risky=include_risky, only=[])


@app.command()
def push(name: SessionName) -> None:
    """Send host edits made during the session into the guest, never over a change the guest made."""
    from vmsandbox.session import core as session
    from vmsandbox.sync import syncback

    pushed, conflicts = syncback.push(session.Record.load(name), limit=_sync_limit())
    for path in pushed:
        ui.err.print(f"  [green]pushed[/] {ui.printable(path)}")
    for path in conflicts:
        ui.err.print(f"  [red]conflict[/] {ui.printable(path)}: changed in the guest too; left as it is on both sides")
    ui.info(f"Push: {len(pushed)} sent, {len(conflicts)} conflict(s).")
    if conflicts:
        raise typer.Exit(EXIT_PENDING)


@app.command()
def diff(
    name: SessionName,
    only: Annotated[list[str] | None, typer.Argument(help="Only these paths.")] = None,
    stat: Annotated[bool, typer.Option("--stat", help="One line per changed path.")] = False,
) -> None:
    """What the guest changed against the session's baseline: text diffs, binaries summarised."""
    from vmsandbox.session import core as session
    from vmsandbox.sync import syncback

    record = session.Record.load(name)
    g = syncback.gather(record, limit=_sync_limit())
    changes = syncback.select_paths(g.changes, g.project, only or [])
    tty = sys.stdout.isatty()  # guest content never reaches a terminal with its escape sequences

    def show(text: str) -> str:
        return ui.printable(text, markup=False) if tty else text

    for c in changes:
        if stat:
            print(show(f"{c.kind:13} {c.path}  {syncback.describe(c)}".rstrip()))
        else:
            sys.stdout.write(show(syncback.diff_text(g, c)))


@app.command()
def logs(
    name: SessionName,
    which: Annotated[
        str, typer.Argument(help="console: the VM's serial console; proxy: every egress decision.")
    ] = "console",
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new entries.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="proxy: print the JSON lines as they are.")] = False,
    raw: Annotated[
        bool, typer.Option("--raw", help="console: the guest's bytes as they are (escape sequences included).")
    ] = False,
) -> None:
    """Show a session's logs. The console is the guest's own output: control characters are shown escaped
    (\\x1b …), so it cannot drive your terminal, unless you ask for --raw."""
    from vmsandbox.egress import log as proxylog
    from vmsandbox.egress import proxy
    from vmsandbox.session import core as session

    record = session.Record.load(name)
    if which not in ("console", "proxy"):
        raise VmsandboxError(f"unknown log {which!r}", hint="available: console, proxy")
    path = record.files.console_log if which == "console" else record.files.proxy_log
    if not follow and not path.exists():
        if which == "proxy":
            ui.info(f"Session {name} has made no requests through its egress proxy yet.")
            return
        raise VmsandboxError(f"session {name} has no console log yet")

    def gone() -> bool:
        return not record.files.record.exists()

    if which == "console":
        for line in proxylog.read(path, follow=follow, stopped=gone):
            text = line if raw else ui.printable(line.rstrip("\r"), markup=False)
            sys.stdout.write(text + "\n")
            if follow:
                sys.stdout.flush()
        return
    older = proxy.rotated(path)
    lines = proxylog.read(older, follow=False) if older.exists() and not follow else iter(())
    for line in itertools.chain(lines, proxylog.read(path, follow=follow, stopped=gone)):
        if as_json:
            print(line, flush=follow)
            continue
        event = proxylog.parse(line)
        if event is not None:
            ui.out.print(proxylog.describe(event), soft_wrap=True)
            if follow:
                sys.stdout.flush()


@app.command()
def clean(name: SessionName) -> None:
    """Wipe volatile credentials in a running session (agent auth files, git credentials, the placeholders
    the proxy swaps for secrets, which it stops honouring); the workspace is not touched."""
    from vmsandbox.egress import policy as egress
    from vmsandbox.guest import commands as guest
    from vmsandbox.session import core as session

    record = _ready(session.Record.load(name))
    if record.files.egress_config.exists():
        egress.revoke(record.files)
    result = guest.run_as_root(
        record,
        egress.clean_script(record.user, tuple(record.credentials)),
        hint=f"is the VM up? `vmsandbox logs {name}`",
    )
    removed = result.stdout.split()
    for path in removed:
        ui.err.print(f"  [red]removed[/] {ui.printable(path)}")
    ui.info(f"Session {name}: {len(removed)} credential file(s) removed, placeholders revoked; workspace untouched.")


# ---------------------------------------------------------------- secrets


@secret_app.command("set")
def secret_set(name: Annotated[str, typer.Argument(help="Secret name, e.g. anthropic-api-key.")]) -> None:
    """Store a secret on the host (read from stdin, or typed without echo). It never enters a VM."""
    import getpass

    from vmsandbox.egress import secrets as secretstore

    secretstore.validate_name(name)
    value = getpass.getpass(f"Value for {name}: ", stream=sys.stderr) if sys.stdin.isatty() else sys.stdin.read()
    secretstore.put(name, value)
    ui.info(f"Secret {name} stored in {secretstore.directory()} (0600)")


@secret_app.command("ls")
def secret_ls(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """List stored secrets (names only, never values)."""
    from vmsandbox.egress import secrets as secretstore

    stored = secretstore.list_all()
    if as_json:
        _print_json([{"name": s.name, "set_at": s.set_at, "bytes": s.length} for s in stored])
        return
    if not stored:
        ui.info("No secrets. Store one with `vmsandbox secret set NAME`.")
        return
    table = Table("NAME", "SET", box=None)
    for s in stored:
        table.add_row(s.name, time.strftime("%Y-%m-%d %H:%M", time.localtime(s.set_at)))
    ui.out.print(table)


@secret_app.command("rm")
def secret_rm(name: Annotated[str, typer.Argument(help="Secret name.")]) -> None:
    """Remove a stored secret (running sessions stop getting it at once)."""
    from vmsandbox.egress import secrets as secretstore

    if not secretstore.remove(name):
        raise VmsandboxError(f"no secret named {name!r}", hint="list them with `vmsandbox secret ls`")
    ui.info(f"Secret {name} removed")


@app.command()
def gc() -> None:
    """Remove sessions whose VM is gone or whose `vmsandbox run` died, and orphaned vmsandbox domains.

    Sessions holding unsynced changes are kept (a stopped VM's changes are exported to its outbox)."""
    from vmsandbox.session import core as session
    from vmsandbox.sync import syncback

    def guard(record: session.Record, state: str) -> str | None:
        if not record.files.baseline_manifest.exists():
            return None
        g = syncback.gather(record, limit=_sync_limit())
        left = syncback.pending(g)
        if not left:
            return None
        if state == "stopped":
            syncback.export(g)
            session.retire(record)
        record.unsynced = len(left)
        record.save()
        return f"{len(left)} unsynced change(s); `vmsandbox pull {record.name}` or `vmsandbox recover {record.name}`"

    done = list(session.gc(config.load().libvirt_uri, guard))
    for line in done:
        ui.info(line)
    if not done:
        ui.info("Nothing to clean up.")


@app.callback(invoke_without_command=True)
def _root(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log every step and command to stderr.")] = False,
    version: Annotated[bool, typer.Option("--version", help="Print the version.")] = False,
) -> None:
    if version:
        print(__version__)
        raise typer.Exit(0)
    _setup_logging(verbose)


def _setup_logging(verbose: bool) -> None:
    """A verbose log file in the state directory always; stderr gets the log only with --verbose."""
    root = logging.getLogger()
    root.setLevel(logging.DEBUG)
    fmt = logging.Formatter("%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s")
    try:
        from vmsandbox import confine

        confine.state_dirs()
        handler: logging.Handler = logging.handlers.RotatingFileHandler(
            paths.state_dir() / paths.SESSION_LOG, maxBytes=2 * 1024**2, backupCount=2
        )
        (paths.state_dir() / paths.SESSION_LOG).chmod(0o600)
        handler.setFormatter(fmt)
        root.addHandler(handler)
    except OSError:
        pass  # a read-only state dir must not stop `--help` or `doctor`
    if verbose:
        stream = logging.StreamHandler(sys.stderr)
        stream.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(stream)


def _terminate(signum: int, _frame: object) -> NoReturn:
    raise SystemExit(128 + signum)  # unwinds through every cleanup handler, like Ctrl-C


def main(argv: list[str] | None = None) -> NoReturn:
    args = list(sys.argv[1:] if argv is None else argv)
    _Invocation.command = None
    if "--" in args:
        cut = args.index("--")
        args, _Invocation.command = args[:cut], args[cut + 1 :]
    os.umask(0o077)  # whatever vmsandbox writes is private unless it says otherwise (images do)
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)
    try:
        code = app(args=args, prog_name="vmsandbox", standalone_mode=False)
    except VmsandboxError as exc:  # plain text that may quote a guest (stderr of ssh, rsync, git): escaped
        ui.err.print(f"[red]error:[/] {ui.printable(exc.message)}", soft_wrap=True)
        if exc.hint:
            ui.err.print(f"[dim]hint:[/] {ui.printable(exc.hint)}", soft_wrap=True)
        sys.exit(EXIT_ERROR)
    except KeyboardInterrupt:
        ui.err.print("[red]interrupted[/]")
        sys.exit(EXIT_INTERRUPTED)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        ui.err.print("[red]aborted[/]")
        sys.exit(EXIT_INTERRUPTED)
    except Exception as exc:  # usage errors from the parser
        show = getattr(exc, "show", None)
        if callable(show):
            show()
            sys.exit(int(getattr(exc, "exit_code", 2)))
        raise
    sys.exit(code if isinstance(code, int) else 0)
