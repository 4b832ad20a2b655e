"""`vmsandbox run`, the agent shorthands (`claude`, `codex`, `gemini`, `opencode`), `shell` and `exec`."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from vmsandbox import ui
from vmsandbox.cli import complete, prompts
from vmsandbox.cli.base import (
    Invocation,
    TakesCommand,
    app,
    tail,
)

if TYPE_CHECKING:
    from vmsandbox.core.person import Person
    from vmsandbox.session.options import RunFlags

AGENTS = ("claude", "codex", "gemini", "opencode")


PathOpt = Annotated[Path, typer.Argument(help="The project directory.", metavar="PATH")]
NameOpt = Annotated[
    str | None, typer.Option("--name", metavar="NAME", help="Session name (default: from the directory).")
]
CpusOpt = Annotated[int | None, typer.Option("--cpus", metavar="N", help="vCPUs.")]
MemoryOpt = Annotated[str | None, typer.Option("--memory", metavar="SIZE", help="Guest memory, e.g. 2G.")]
DiskOpt = Annotated[str | None, typer.Option("--disk", metavar="SIZE", help="Guest disk size, e.g. 20G.")]
AccelOpt = Annotated[
    str | None, typer.Option("--accel", metavar="auto|kvm|tcg", help="auto, kvm or tcg.", autocompletion=complete.accel)
]
KeepOpt = Annotated[bool, typer.Option("--keep", help="Keep the VM after the command or shell ends.")]
TtyOpt = Annotated[
    bool | None, typer.Option("--tty/--no-tty", "-t", help="Give CMD a terminal (default: only for the shell).")
]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="At the end, apply the safe, non-conflicting changes.")]
IncludeRiskyOpt = Annotated[bool, typer.Option("--include-risky", help="With --yes, apply quarantined changes too.")]
IncludeIgnoredOpt = Annotated[
    bool, typer.Option("--include-ignored", help="With --yes, apply changes to paths the project ignores too.")
]
IncludeBinaryOpt = Annotated[bool, typer.Option("--include-binary", help="With --yes, apply binary files too.")]
IncludeMassOpt = Annotated[bool, typer.Option("--include-mass", help="With --yes, apply a mass change too.")]
ReviewOpt = Annotated[
    str,
    typer.Option(
        "--review",
        metavar="terminal|web",
        help="Where to review at the end: terminal, or web (opens `vmsandbox ui`).",
        autocompletion=complete.review,
    ),
]
SendSecretsOpt = Annotated[
    bool, typer.Option("--send-secrets", help="Copy files that look like credentials into the VM too.")
]
NetworkOpt = Annotated[
    str | None,
    typer.Option(
        "--network",
        metavar="MODE",
        help="allowlist (default): listed hosts only; open: any public host; none.",
        autocompletion=complete.networks,
    ),
]
AllowOpt = Annotated[
    list[str] | None,
    typer.Option("--allow", metavar="HOST", help="Also allow HOST, *.DOMAIN or HOST:PORT (repeatable)."),
]
BlueprintOpt = Annotated[
    str,
    typer.Option(
        "--blueprint",
        "-b",
        metavar="NAME",
        help="base, claude, codex, gemini, opencode, or your own.",
        autocompletion=complete.blueprints,
    ),
]
PublishOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--publish", "-p", metavar="PORT", help="[HOST_PORT:]GUEST_PORT: reach a guest port on 127.0.0.1 and ::1."
    ),
]
PublishAddressOpt = Annotated[
    str | None,
    typer.Option("--publish-address", metavar="ADDRESS", help="Publish on this address instead of loopback."),
]
SshAgentOpt = Annotated[
    bool, typer.Option("--ssh-agent", help="Forward your ssh-agent into the guest (it can use your keys).")
]
ColdOpt = Annotated[
    bool,
    typer.Option("--cold", help="Boot the VM from scratch instead of restoring the image's warm-start template."),
]
FanoutOpt = Annotated[
    int | None,
    typer.Option(
        "--fanout", metavar="N", help="Start N sessions from one capture, each running COMMAND; compare them after."
    ),
]
CheckOpt = Annotated[
    str | None,
    typer.Option(
        "--check", metavar="COMMAND", help="With --fanout: a shell command that tells whether a session passes."
    ),
]
HostOpt = Annotated[
    str | None,
    typer.Option(
        "--host",
        metavar="HOST",
        help="Run the VM on this libvirt host (`vmsandbox hosts`; default: this machine).",
        autocompletion=complete.hosts,
    ),
]
GitIdentityOpt = Annotated[
    bool, typer.Option("--git-identity", help="Copy your git user.name and user.email into the guest.")
]


@app.command(cls=TakesCommand)
def run(
    path: PathOpt = Path(),
    name: NameOpt = None,
    cpus: CpusOpt = None,
    memory: MemoryOpt = None,
    disk: DiskOpt = None,
    accel: AccelOpt = None,
    keep: KeepOpt = False,
    tty: TtyOpt = None,
    yes: YesOpt = False,
    include_risky: IncludeRiskyOpt = False,
    include_ignored: IncludeIgnoredOpt = False,
    include_binary: IncludeBinaryOpt = False,
    include_mass: IncludeMassOpt = False,
    send_secrets: SendSecretsOpt = False,
    review: ReviewOpt = "terminal",
    network: NetworkOpt = None,
    allow: AllowOpt = None,
    blueprint: BlueprintOpt = "base",
    publish: PublishOpt = None,
    publish_address: PublishAddressOpt = None,
    ssh_agent: SshAgentOpt = False,
    git_identity: GitIdentityOpt = False,
    cold: ColdOpt = False,
    fanout: FanoutOpt = None,
    check: CheckOpt = None,
    host: HostOpt = None,
) -> None:
    """Run COMMAND (or a shell) in a disposable VM on PATH, then review its changes.

    Boot a disposable VM for PATH and run COMMAND (after `--`) or a shell in it; exit with COMMAND's code.

    COMMAND is an argument list (quoted for the guest's shell); use `-- sh -c '...'` for shell syntax.

    Examples: `vmsandbox run . -- make test` · `vmsandbox run --keep --name exp .` (a shell; the session stays
    for `vmsandbox shell exp`) · `vmsandbox run -p 8000 . -- python3 -m http.server`
    """
    given = {k: v for k, v in locals().items() if k not in ("path", "blueprint")}  # every flag, as RunFlags
    run_session(path, blueprint, tail(required=False), flags_of(given))


def run_session(
    path: Path, blueprint_name: str, cmd: list[str] | None, flags: RunFlags, *, agent: bool = False
) -> NoReturn:
    """A run through the core (core.flow), the person at this terminal asked (or, with `--review web`, on the
    page for the review)."""
    from vmsandbox.core import flow
    from vmsandbox.session.options import take_of

    person: Person = prompts.Terminal(yes=flags.yes, take=take_of(flags))
    if flags.review == "web" and not flags.yes:
        from vmsandbox.web.person import Page

        person = Page(person)
    ran = flow.run(flow.Ask(path, blueprint_name, cmd, flags, agent=agent), person)
    if ran.kept and ran.record is not None:
        name = ran.record.name
        ui.info(
            f"Session [bold]{name}[/] keeps running: `vmsandbox shell {name}`, `vmsandbox pull {name}`, "
            f"`vmsandbox destroy {name}`"
        )
    raise typer.Exit(ran.code)


def flags_of(given: dict[str, Any]) -> RunFlags:
    """`run`'s flags from the keyword arguments of a command that takes them (like_run)."""
    from vmsandbox.session.options import RunFlags

    given["allow"] = tuple(given.get("allow") or ())
    given["publish"] = tuple(given.get("publish") or ())
    return RunFlags(**given)


def like_run(
    command: Callable[..., None], name: str, doc: str, *, leave_out: str, first: tuple[inspect.Parameter, ...] = ()
) -> Callable[..., None]:
    """`command` with `run`'s options (but `leave_out`), after the parameters `first`, for typer."""
    hints = typing.get_type_hints(run, include_extras=True)  # run's annotations are strings (PEP 563)
    params = [*first]
    params += [
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
