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
from vmsandbox.cli.base import AGENTS, Invocation, TakesCommand, app, tail
from vmsandbox.cli.review import prompts
from vmsandbox.cli.sessions.runoptions import (
    AccelOpt,
    AllowOpt,
    BlueprintOpt,
    CheckOpt,
    ColdOpt,
    CpusOpt,
    DiskOpt,
    FanoutOpt,
    FromOpt,
    GitIdentityOpt,
    HostOpt,
    IncludeBinaryOpt,
    IncludeIgnoredOpt,
    IncludeMassOpt,
    IncludeRiskyOpt,
    KeepOpt,
    MemoryOpt,
    NameOpt,
    NetworkOpt,
    PathArg,
    PublishAddressOpt,
    PublishOpt,
    ReviewOpt,
    RmOpt,
    SendSecretsOpt,
    SshAgentOpt,
    TtyOpt,
    YesOpt,
)
from vmsandbox.errors import UsageError

if TYPE_CHECKING:
    from vmsandbox.core.person import Person
    from vmsandbox.core.sessions import RunFlags


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
    rm: RmOpt = False,
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
    the VM goes (unless --keep: removal is the default, docker's --rm is taken as it is).

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

    if given.pop("rm", False):
        _removal_is_the_default(given)
    given["allow"] = tuple(given.get("allow") or ())
    given["publish"] = tuple(given.get("publish") or ())
    return RunFlags(**given)


def _removal_is_the_default(given: dict[str, Any]) -> None:
    """`--rm`, as docker's: what happens anyway, said in a line; refused beside a flag that keeps the VM."""
    for keeps, why in (("keep", "--keep keeps the VM"), ("fanout", "a fan-out keeps its sessions")):
        if given.get(keeps):
            raise UsageError(f"--rm does not go with --{keeps}: {why}", hint="leave --rm out")
    ui.info("note: --rm is the default here: the VM goes at the end unless --keep")


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

    Unlike `docker create`, it starts the VM (as `limactl start` does): then `vmsandbox shell NAME`, `exec`,
    `pull`, `stop`, `start`, `rm`. With --from, the new session is a copy of another (files, disks and running
    processes, with its own identity, keys and egress; the same baseline for its review).

    Examples: `vmsandbox create --name exp .` · `vmsandbox create --from exp --name exp-b` · `vmsandbox create
    --from exp:before --name exp-c` (from its checkpoint `before`)"""
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
