"""`vmsandbox run`, the agent shorthands (`claude`, `codex`, `gemini`, `opencode`) and `create`: a session made on
a project, a command or an agent run in it, the review at the end — or, with `create`, a session made and left
running, nothing run in it (`docker create`, `limactl create`)."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from vmsandbox import ui
from vmsandbox.cli import complete
from vmsandbox.cli.base import Invocation, TakesCommand, app, tail
from vmsandbox.cli.review import prompts
from vmsandbox.core.settings import DEFAULTS
from vmsandbox.errors import UsageError

if TYPE_CHECKING:
    from vmsandbox.core.person import Person
    from vmsandbox.core.sessions import RunFlags

AGENTS = ("claude", "codex", "gemini", "opencode")
VM, NETWORK, GUEST, REVIEW, FANOUT = "The VM", "Network", "Into the guest", "The review at the end", "Fan-out"


def _size(mib: int) -> str:
    return f"{mib // 1024}G" if mib % 1024 == 0 else f"{mib}M"


PathArg = Annotated[Path, typer.Argument(help="The project directory.", metavar="PATH")]
NameOpt = Annotated[
    str | None,
    typer.Option("--name", metavar="NAME", help="Session name \\[default: from the directory].", rich_help_panel=VM),
]
CpusOpt = Annotated[
    int | None,
    typer.Option(
        "--cpus", metavar="N", help=f"vCPUs \\[default: {DEFAULTS.cpus}, or your config's].", rich_help_panel=VM
    ),
]
MemoryOpt = Annotated[
    str | None,
    typer.Option(
        "--memory", metavar="SIZE", help=f"Guest memory \\[default: {_size(DEFAULTS.memory_mib)}].", rich_help_panel=VM
    ),
]
DiskOpt = Annotated[
    str | None,
    typer.Option(
        "--disk", metavar="SIZE", help=f"Guest disk size \\[default: {_size(DEFAULTS.disk_mib)}].", rich_help_panel=VM
    ),
]
AccelOpt = Annotated[
    str | None,
    typer.Option(
        "--accel",
        metavar="auto|kvm|tcg",
        help="KVM or TCG (software) \\[default: auto: KVM where it works].",
        autocompletion=complete.accel,
        rich_help_panel=VM,
    ),
]
BlueprintOpt = Annotated[
    str,
    typer.Option(
        "--blueprint",
        "-b",
        metavar="NAME",
        help="base, claude, codex, gemini, opencode, or your own (`vmsandbox blueprint ls`).",
        autocompletion=complete.blueprints,
        rich_help_panel=VM,
    ),
]
HostOpt = Annotated[
    str | None,
    typer.Option(
        "--host",
        metavar="HOST",
        help="Run the VM on this libvirt host (`vmsandbox host ls`) \\[default: this machine].",
        autocompletion=complete.hosts,
        rich_help_panel=VM,
    ),
]
ColdOpt = Annotated[
    bool,
    typer.Option("--cold", help="Boot from scratch, not from the image's warm-start template.", rich_help_panel=VM),
]
KeepOpt = Annotated[
    bool, typer.Option("--keep", help="Keep the VM after the command or shell ends.", rich_help_panel=VM)
]
NetworkOpt = Annotated[
    str | None,
    typer.Option(
        "--network",
        metavar="MODE",
        help="allowlist: listed hosts only [default]; open: any public host; none.",
        autocompletion=complete.networks,
        rich_help_panel=NETWORK,
    ),
]
AllowOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--allow", metavar="HOST", help="Also allow HOST, *.DOMAIN or HOST:PORT (repeatable).", rich_help_panel=NETWORK
    ),
]
PublishOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--publish",
        "-p",
        metavar="PORT",
        help="[HOST_PORT:]GUEST_PORT: reach a guest port on 127.0.0.1 and ::1 (repeatable).",
        rich_help_panel=NETWORK,
    ),
]
PublishAddressOpt = Annotated[
    str | None,
    typer.Option(
        "--publish-address", metavar="ADDRESS", help="Publish on this address, not loopback.", rich_help_panel=NETWORK
    ),
]
SshAgentOpt = Annotated[
    bool,
    typer.Option(
        "--ssh-agent", help="Forward your ssh-agent into the guest (it can use your keys).", rich_help_panel=GUEST
    ),
]
GitIdentityOpt = Annotated[
    bool,
    typer.Option("--git-identity", help="Copy your git user.name and user.email in.", rich_help_panel=GUEST),
]
SendSecretsOpt = Annotated[
    bool,
    typer.Option(
        "--send-secrets", help="Copy files that look like credentials in too (else left out).", rich_help_panel=GUEST
    ),
]
TtyOpt = Annotated[
    bool | None,
    typer.Option(
        "--tty/--no-tty", "-t", help="Give COMMAND a terminal \\[default: only a shell has one].", rich_help_panel=GUEST
    ),
]
YesOpt = Annotated[
    bool, typer.Option("--yes", "-y", help="Apply the safe, non-conflicting changes unasked.", rich_help_panel=REVIEW)
]
IncludeRiskyOpt = Annotated[
    bool, typer.Option("--include-risky", help="With --yes, quarantined changes too.", rich_help_panel=REVIEW)
]
IncludeIgnoredOpt = Annotated[
    bool,
    typer.Option("--include-ignored", help="With --yes, paths the project ignores too.", rich_help_panel=REVIEW),
]
IncludeBinaryOpt = Annotated[
    bool, typer.Option("--include-binary", help="With --yes, binary files too.", rich_help_panel=REVIEW)
]
IncludeMassOpt = Annotated[
    bool, typer.Option("--include-mass", help="With --yes, a mass change too.", rich_help_panel=REVIEW)
]
ReviewOpt = Annotated[
    str,
    typer.Option(
        "--review",
        metavar="terminal|web",
        help="Review at the terminal, or in the browser (as `vmsandbox ui`).",
        autocompletion=complete.review,
        rich_help_panel=REVIEW,
    ),
]
FanoutOpt = Annotated[
    int | None,
    typer.Option(
        "--fanout",
        metavar="N",
        help="Start N sessions from one capture, each running COMMAND with VMSANDBOX_INDEX=1..N; all are kept, "
        "none reviewed (not with the review's options, --keep or --tty).",
        rich_help_panel=FANOUT,
    ),
]
CheckOpt = Annotated[
    str | None,
    typer.Option(
        "--check",
        metavar="COMMAND",
        help="With --fanout: a shell command that says whether a session passes.",
        rich_help_panel=FANOUT,
    ),
]


@app.command(cls=TakesCommand)
def run(
    path: PathArg = Path(),
    name: NameOpt = None,
    blueprint: BlueprintOpt = "base",
    cpus: CpusOpt = None,
    memory: MemoryOpt = None,
    disk: DiskOpt = None,
    accel: AccelOpt = None,
    host: HostOpt = None,
    cold: ColdOpt = False,
    keep: KeepOpt = False,
    network: NetworkOpt = None,
    allow: AllowOpt = None,
    publish: PublishOpt = None,
    publish_address: PublishAddressOpt = None,
    ssh_agent: SshAgentOpt = False,
    git_identity: GitIdentityOpt = False,
    send_secrets: SendSecretsOpt = False,
    tty: TtyOpt = None,
    yes: YesOpt = False,
    include_risky: IncludeRiskyOpt = False,
    include_ignored: IncludeIgnoredOpt = False,
    include_binary: IncludeBinaryOpt = False,
    include_mass: IncludeMassOpt = False,
    review: ReviewOpt = "terminal",
    fanout: FanoutOpt = None,
    check: CheckOpt = None,
) -> None:
    """Run COMMAND (or a shell) in a disposable VM on PATH, then review its changes.

    The VM boots on a copy of PATH; COMMAND (after `--`, an argument list quoted for the guest's shell: `-- sh -c
    '...'` for shell syntax) runs in the project directory, and `run` exits with its code. Then the review, and
    the VM goes (unless --keep).

    Examples: `vmsandbox run . -- make test` · `vmsandbox run --keep --name exp .` (a shell; the session stays
    for `vmsandbox shell exp`) · `vmsandbox run -p 8000 . -- python3 -m http.server` · `vmsandbox run --fanout 3
    --check 'make test' . -- ./try.sh`
    """
    given = {k: v for k, v in locals().items() if k not in ("path", "blueprint")}  # every flag, as RunFlags
    run_session(path, blueprint, tail(required=False), flags_of(given))


def run_session(
    path: Path, blueprint_name: str, cmd: list[str] | None, flags: RunFlags, *, agent: bool = False
) -> NoReturn:
    """A run through the core (core.flow), the person at this terminal asked (or, with `--review web`, on the
    page for the review)."""
    from vmsandbox.core import flow

    person: Person = prompts.Terminal(yes=flags.yes, take=flow.take_of(flags))
    if flags.review == "web" and not flags.yes:
        from vmsandbox.web.person import Page

        person = Page(person)
    ran = flow.run(flow.Ask(path, blueprint_name, cmd, flags, agent=agent), person)
    if ran.kept and ran.record is not None:
        kept(ran.record.name)
    raise typer.Exit(ran.code)


def kept(name: str) -> None:
    ui.info(
        f"Session [bold]{name}[/] keeps running: `vmsandbox shell {name}`, `vmsandbox pull {name}`, "
        f"`vmsandbox rm {name}`"
    )


def flags_of(given: dict[str, Any]) -> RunFlags:
    """`run`'s flags from the keyword arguments of a command that takes them (like_run)."""
    from vmsandbox.core.sessions import RunFlags

    given["allow"] = tuple(given.get("allow") or ())
    given["publish"] = tuple(given.get("publish") or ())
    return RunFlags(**given)


def like_run(command: Callable[..., None], name: str, doc: str, *, leave_out: str) -> Callable[..., None]:
    """`command` with `run`'s options (but `leave_out`), for typer."""
    hints = typing.get_type_hints(run, include_extras=True)  # run's annotations are strings (PEP 563)
    params = [
        p.replace(annotation=hints[p.name]) for p in inspect.signature(run).parameters.values() if p.name != leave_out
    ]
    command.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__doc__ = doc
    command.__name__ = name
    return command


def _agent_command(agent: str) -> Callable[..., None]:
    """`vmsandbox AGENT [PATH] [-- ARGS]`: `run --blueprint AGENT PATH -- <its command> <skip flag> ARGS`,
    with `run`'s options (but --blueprint), ending with the review."""

    def command(**given: Any) -> None:
        path = given.pop("path")
        run_session(path, agent, Invocation.command or [], flags_of(given), agent=True)

    doc = (
        f"Run {agent} in a disposable VM on PATH, then review what it changed.\n\n"
        f"Its permission prompts are off: the VM is the sandbox. Arguments after `--` go to {agent}.\n\n"
        f"Examples:\n\n`vmsandbox {agent} .`\n\n`vmsandbox {agent} --keep . -- --help`"
    )
    return like_run(command, agent, doc, leave_out="blueprint")


for _agent in AGENTS:
    app.command(_agent, cls=TakesCommand)(_agent_command(_agent))


FromOpt = Annotated[
    str | None,
    typer.Option(
        "--from",
        metavar="NAME[:LABEL]",
        help="Copy session NAME (its state now, or its checkpoint LABEL) instead: no PATH, no VM options.",
        autocompletion=complete.sessions,
        rich_help_panel=VM,
    ),
]


@app.command()
def create(
    path: Annotated[Path | None, typer.Argument(help="The project directory \\[default: .].", metavar="PATH")] = None,
    name: NameOpt = None,
    source: FromOpt = None,
    blueprint: BlueprintOpt = "base",
    cpus: CpusOpt = None,
    memory: MemoryOpt = None,
    disk: DiskOpt = None,
    accel: AccelOpt = None,
    host: HostOpt = None,
    cold: ColdOpt = False,
    network: NetworkOpt = None,
    allow: AllowOpt = None,
    publish: PublishOpt = None,
    publish_address: PublishAddressOpt = None,
    ssh_agent: SshAgentOpt = False,
    git_identity: GitIdentityOpt = False,
    send_secrets: SendSecretsOpt = False,
) -> None:
    """Make a session on PATH and leave it running, nothing run in it.

    As `docker create` and `limactl create` do: then `vmsandbox shell NAME`, `exec`, `pull`, `stop`, `start`,
    `rm`. With --from, the new session is a copy of another (files, disks and running processes, with its own
    identity, keys and egress; the same baseline for its review).

    Examples: `vmsandbox create --name exp .` · `vmsandbox create --from exp --name exp-b` · `vmsandbox create
    --from exp:before --name exp-c` (a checkpoint)"""
    from vmsandbox.core import sessions

    if source is not None:
        given = {k: v for k, v in locals().items() if k not in ("source", "name", "sessions")}
        _copy(source, name, given)
        return
    flags = flags_of({k: v for k, v in locals().items() if k not in ("path", "blueprint", "source", "sessions")})
    terminal = prompts.Terminal(ask=True)
    made = sessions.create(path or Path(), blueprint, flags, terminal)
    kept(made.name)


def _copy(source: str, name: str | None, given: dict[str, Any]) -> None:
    """`create --from NAME[:LABEL] --name NEW`: a copy of a session, nothing else given."""
    from vmsandbox.core import sessions

    defaults = {"path": None, "blueprint": "base", "allow": None, "publish": None}
    other = [k for k, v in given.items() if v != defaults.get(k) and v not in (None, False)]
    if other:
        flag = "PATH" if other[0] == "path" else "--" + other[0].replace("_", "-")
        raise UsageError(f"{flag} does not go with --from: a copy is made of the session as it is")
    if name is None:
        raise UsageError(
            "--from needs --name: the copy's name", hint=f"e.g. `vmsandbox create --from {source} --name NEW`"
        )
    what, _, label = source.partition(":")
    ui.info(f"Copying session {what}{f' at checkpoint {label}' if label else ''} into {name}")
    made = sessions.copy_of(what, name, label=label or None)
    ui.info(f"[green]✓[/] Session [bold]{made.name}[/] is a copy of {made.forked_from}: `vmsandbox shell {made.name}`")
