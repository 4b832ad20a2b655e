"""What every command module of the CLI shares: the typer apps (the top and each noun's), the exit codes, the
help's panels, shared parameters, the command after `--`, several names or --all."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Annotated, Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from vmsandbox import paths, ui
from vmsandbox.cli import aliases, complete, helptext
from vmsandbox.errors import UsageError, VmsandboxError

EXIT_FAILED = 1  # vmsandbox failed
EXIT_USAGE = 2  # the command line was wrong: the parser's usage errors and the values it refused (UsageError)
EXIT_PENDING = 3  # pull/push: changes remain unsynced
EXIT_RUN_FAILED = 125  # run/exec/shell/agents: vmsandbox failed (as `docker run` does), so COMMAND's codes stay its own
EXIT_INTERRUPTED = 130

HELP = {"help_option_names": ["-h", "--help"]}  # inherited by every command and group below
if ui.plain():
    helptext.rich_utils().COLOR_SYSTEM = None  # NO_COLOR: typer's help and tracebacks too (only then imported here)

# The help's panels, in order, and their commands in the order a person meets them: the everyday verbs, then the
# nouns (each with its verbs: `vmsandbox checkpoint create|ls|rm|restore`). One table decides the order of
# `vmsandbox -h` (a test holds every command not hidden in it; `help` and `version` are hidden, their Options
# -h and --version shown instead). The words beside these (`list`, `remove`, `ps`) are in aliases.py.
AGENTS = ("claude", "codex", "gemini", "opencode")  # `vmsandbox AGENT PATH` (sessions/run.py)
PANELS: dict[str, tuple[str, ...]] = {
    "Start": ("run", "create", *AGENTS),
    "Sessions": ("ls", "inspect", "start", "stop", "shell", "exec", "cp", "logs", "rm"),
    "Review": ("diff", "pull", "push", "ui"),
    "Inside a session": ("checkpoint", "port", "policy"),
    "This machine": ("image", "host", "secret", "login", "config", "doctor"),
    "More": ("serve", "mcp", "completion"),
}
# Commands alike but for a name, shown as one row of `vmsandbox -h` (each keeps its own -h): the row's summary.
ROWS: dict[tuple[str, ...], str] = {
    AGENTS: "Run that agent in a disposable VM on PATH, then review what it changed.",
}


class Commands(TyperGroup):
    """A group that shows its help (exit 0) when given nothing, takes `list`/`remove` for `ls`/`rm` and `help
    [VERB]` under it, and refuses any other word that is none of its commands with a hint (aliases.py): a typo is
    never a different command."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if not args and self.no_args_is_help and not ctx.resilient_parsing:
            typer.echo(ctx.get_help(), color=ctx.color)
            ctx.exit(0)
        return list(super().parse_args(ctx, args))

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        word = args[0] if args else "-"
        if word not in self.commands and not word.startswith("-"):
            verb = aliases.same(word, self.commands, top=ctx.parent is None)
            if verb is not None:
                args = [verb, *args[1:]]
            elif word == "help" and not ctx.resilient_parsing:  # `vmsandbox checkpoint help [VERB]`
                command, words = aliases.help_of(ctx, args[1:])
                return "help", command, words
            elif not ctx.resilient_parsing:
                raise aliases.unknown(self, ctx, args)
        return super().resolve_command(ctx, args)

    def list_commands(self, ctx: Any) -> list[str]:
        """The top's in the order of PANELS; a noun's verbs as registered (`image`'s `ls` is not the top's)."""
        names = list(super().list_commands(ctx))
        if ctx is not None and ctx.parent is not None:
            return names
        order = {name: i for i, name in enumerate(n for names in PANELS.values() for n in names)}
        return sorted(names, key=lambda name: order.get(name, len(order)))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if isinstance(command, TyperCommand | TyperGroup):
            helptext.tidy(command)
            if ctx.parent is None:
                panel = next((p for p, names in PANELS.items() if cmd_name in names), None)
                command.rich_help_panel = panel or command.rich_help_panel
        return command

    def format_help(self, ctx: Any, formatter: Any) -> None:
        """Plain text when piped (helptext.py). At a terminal, the top's help as typer prints it, but for its
        commands: the commands of one of ROWS in one row, their names one under the other (so the names' column
        stays as narrow as the longest name), and the epilog after them. A group's help is typer's."""
        mode = self.rich_markup_mode
        if helptext.piped() or mode is None:
            formatter.write(helptext.plain(ctx, self, self.rows(ctx) if ctx.parent is None else None))
            return
        if ctx.parent is not None:
            super().format_help(ctx, formatter)
            return
        rich_utils = helptext.rich_utils()
        bare = copy.copy(self)  # the usage, the text and the options, as typer prints them
        bare.commands, bare.epilog = {}, None
        rich_utils.rich_format_help(obj=bare, ctx=ctx, markup_mode=mode)
        panels = self.rows(ctx)
        widest = max(len(line) for row in panels.values() for c in row for line in str(c.name).splitlines())
        console = rich_utils._get_rich_console()  # NO_COLOR and the width as for the rest of the help
        for panel, row in panels.items():
            rich_utils._print_commands_panel(
                name=panel, commands=row, markup_mode=mode, console=console, cmd_len=widest
            )
        if self.epilog:
            from rich.padding import Padding
            from rich.text import Text

            console.print(Padding(Text(self.epilog), 1))

    def rows(self, ctx: Any) -> dict[str, list[Any]]:
        """The rows of the top's help, panel by panel: each command not hidden, the commands of one of ROWS as one
        (its names `claude,\\ncodex,…`, its summary the row's)."""
        panels: dict[str, list[Any]] = {}
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            together = next((names for names in ROWS if name in names), (name,))
            if command is None or command.hidden or name != together[0]:
                continue
            panel = command.rich_help_panel or helptext.rich_utils().COMMANDS_PANEL_TITLE
            if len(together) > 1:
                command = TyperCommand(",\n".join(together), help=ROWS[together])
            panels.setdefault(panel, []).append(command)
        return panels


app = typer.Typer(
    cls=Commands,
    add_completion=False,  # `vmsandbox completion SHELL` prints the script (the shell's words come from main())
    suggest_commands=False,
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    context_settings=HELP,
    help="Run AI coding agents in disposable VMs and review what they changed.\n\n"
    "Examples: `vmsandbox claude .` (an agent on this directory, then the review) · `vmsandbox run . -- make test` · "
    "`vmsandbox create --name exp .` (a session that stays: `vmsandbox shell exp`, `vmsandbox pull exp`, "
    "`vmsandbox rm exp`)",
    epilog="`vmsandbox help COMMAND` (or `vmsandbox COMMAND -h`) shows a command's help.",
)


def noun(name: str, text: str, *, under: typer.Typer = app) -> typer.Typer:
    """A noun under `vmsandbox NAME` (or under another noun: `vmsandbox config trust`) whose verbs act on one kind
    of thing, with the settings every group shares (its help when given nothing, typos)."""
    group = typer.Typer(cls=Commands, suggest_commands=False, no_args_is_help=True, context_settings=HELP, help=text)
    under.add_typer(group, name=name)
    return group


def _flag_shown_as_flag(self: TyperOption, ctx: Any) -> str | None:
    """typer shows `<bool>` beside a boolean flag, as if it took a value, and click's type (`<int range>`) beside
    an option without a metavar: a flag shows nothing, an option its metavar (or its name, upper-cased)."""
    if self.is_flag:
        return None
    if self.metavar is not None:
        return str(self.metavar)
    longest = max(self.opts, key=len).lstrip("-").upper().replace("-", "_")
    return longest + ("..." if self.nargs != 1 else "")


def _argument_shown_by_name(self: TyperArgument, ctx: Any) -> str | None:
    """and `<list[str]>` beside `NAME...`: an argument's metavar says it."""
    return None


def _usage_name(self: TyperArgument) -> str:
    """An argument in the usage line as people write them: `NAME`, `[NAME]`, `NAME...` (typer's `{NAME}...`)."""
    name = str(self.display_name_raw)
    name += "" if self.nargs == 1 or name.endswith("...") else "..."
    return name if self.required else f"[{name}]"


TyperArgument._usage_display_name = _usage_name  # type: ignore[method-assign]
TyperOption.display_type_rich = _flag_shown_as_flag  # type: ignore[method-assign]
TyperOption._get_number_range_help_str = lambda self: None  # type: ignore[method-assign]  # (`[x>=0]`: the help says)
TyperArgument.display_type_rich = _argument_shown_by_name  # type: ignore[method-assign,assignment]
_panels = TyperCommand.format_help


def _format_help(self: TyperCommand, ctx: Any, formatter: Any) -> None:
    """A command's help: plain text when piped (helptext.py), typer's panels at a terminal."""
    helptext.tidy(self)
    if helptext.piped():
        formatter.write(helptext.plain(ctx, self))
    else:
        _panels(self, ctx, formatter)


TyperCommand.format_help = _format_help  # type: ignore[method-assign]


class TakesCommand(TyperCommand):
    """A command that takes a command line after `--`: its usage line says so."""

    tail = "[-- COMMAND...]"

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [*super().collect_usage_pieces(ctx), self.tail]


class NeedsCommand(TakesCommand):
    tail = "-- COMMAND..."


# Parameters several commands share.
def session_names(value: Any) -> Any:
    """A session's name (or each of several) checked as the line is read: one that cannot be a session's is a
    usage error (exit 2) before anything is done, in every command."""
    for name in value if isinstance(value, list | tuple) else [value]:
        if name is not None and not paths.is_session_name(name):
            raise UsageError(f"invalid session name {name!r}", hint=paths.NAME_HINT)
    return value


SessionName = Annotated[
    str,
    typer.Argument(help="Session name.", metavar="NAME", autocompletion=complete.sessions, callback=session_names),
]
SessionNames = Annotated[
    list[str] | None,
    typer.Argument(help="Session names.", metavar="NAME...", autocompletion=complete.sessions, callback=session_names),
]
AllSessions = Annotated[bool, typer.Option("--all", "-a", help="Every session (instead of names).")]
ApplySafe = Annotated[bool, typer.Option("--yes", "-y", help="Apply the safe, non-conflicting changes.")]
IncludeRisky = Annotated[bool, typer.Option("--include-risky", help="Apply quarantined changes too.")]
IncludeIgnored = Annotated[
    bool, typer.Option("--include-ignored", help="Apply changes to paths the project ignores (.gitignore) too.")
]
IncludeBinary = Annotated[bool, typer.Option("--include-binary", help="Apply binary files too (never by --yes alone).")]
IncludeMass = Annotated[
    bool, typer.Option("--include-mass", help="With --yes, apply a mass change too (mass_change_files/_size).")
]
Label = Annotated[str, typer.Argument(help="A checkpoint's label.", metavar="LABEL", autocompletion=complete.labels)]
Workdir = Annotated[
    str | None,
    typer.Option("--workdir", "-w", metavar="DIR", help="Run in DIR (relative: to the project directory)."),
]
Env = Annotated[
    list[str] | None,
    typer.Option("--env", "-e", metavar="KEY=VALUE", help="Set an environment variable (repeatable)."),
]


# The commands that run a command in the guest: everything after their first `--` is that command, split off
# before typer parses the rest (so `vmsandbox run -- ls /` never takes `ls` as PATH). Any other command gets
# `--` as the parser's end of options, and words it does not take are a usage error.
TAKE_A_COMMAND = frozenset({"run", "exec", *AGENTS})
# The commands that exit with the guest command's code: their own failures exit EXIT_RUN_FAILED.
PASS_THE_CODE = TAKE_A_COMMAND | {"shell"}
GLOBAL_FLAGS = ("-v", "--verbose")  # taken anywhere on the line (before `--`, and before `shell NAME`'s command)


class Invocation:
    """What main() found on the command line before typer parsed it."""

    command: list[str] | None = None  # after `--`, for a command of TAKE_A_COMMAND
    failed: int = EXIT_FAILED  # the exit code of a failure of vmsandbox in this command


def command_word(args: list[str]) -> str | None:
    """The command named on a command line (the global options before it take no values)."""
    for arg in args:
        if arg == "--":
            return None
        if not arg.startswith("-"):
            return arg
    return None


def tail(*, required: bool) -> list[str] | None:
    if required and not Invocation.command:
        raise UsageError("no command given", hint="put the command after `--`, e.g. `-- make test`")
    return Invocation.command or None


def each_session(
    names: list[str] | None, every: bool, *, verb: str, which: Callable[[], list[str]], act: Callable[[str], None]
) -> None:
    """`act(name)` for every session named (or with --all every one `which()` gives), one after the other: a
    failure is said and the others go on; the command fails at the end naming what failed."""
    if every and names:
        raise UsageError(f"`{verb}` takes session names or --all, not both", hint=f"e.g. `vmsandbox {verb} --all`")
    if not every and not names:
        raise UsageError(f"`{verb}` needs a session name", hint=f"`vmsandbox {verb} NAME...`, or `--all`")
    targets = list(which()) if every else list(dict.fromkeys(names or ()))
    if every and not targets:
        ui.info(f"No session to {verb.split(maxsplit=1)[0]}.")
        return
    if len(targets) == 1 and not every:
        act(targets[0])  # one name: its error is the command's, with its hint
        return
    failed = []
    for name in targets:
        try:
            act(name)
        except VmsandboxError as exc:
            failed.append(name)
            said(exc)
    if failed:
        raise VmsandboxError(f"could not {verb} {len(failed)} of {len(targets)} sessions: {', '.join(failed)}")


def said(exc: VmsandboxError, label: str = "error", colour: str = "red") -> None:
    """An error (and its hint) on stderr, as the end of the command says it."""
    ui.err.print(f"[{colour}]{label}:[/] {ui.printable(exc.message)}", soft_wrap=True)
    if exc.hint:
        ui.err.print(f"[dim]hint:[/] {ui.printable(exc.hint)}", soft_wrap=True)


def age(seconds: float) -> str:
    s = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"
