"""The options of `run`, the agent shorthands and `create`, in the panels their help shows (VM, network, into the
guest, the review, fan-out): one declaration each, shared by the commands that take it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from vmsandbox.cli import complete

VM, NETWORK, GUEST, REVIEW, FANOUT = "The VM", "Network", "Into the guest", "The review at the end", "Fan-out"
# The defaults the help names, as settings.Settings has them (a unit test holds the two together): read from there,
# every command would import the settings' models first (pydantic, yaml: 125 ms of every command's start here).
DEFAULT_CPUS, DEFAULT_MEMORY_MIB, DEFAULT_DISK_MIB = 2, 2048, 20 * 1024


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
        "--cpus", metavar="N", help=f"vCPUs \\[default: {DEFAULT_CPUS}, or your config's].", rich_help_panel=VM
    ),
]
MemoryOpt = Annotated[
    str | None,
    typer.Option(
        "--memory", metavar="SIZE", help=f"Guest memory \\[default: {_size(DEFAULT_MEMORY_MIB)}].", rich_help_panel=VM
    ),
]
DiskOpt = Annotated[
    str | None,
    typer.Option(
        "--disk", metavar="SIZE", help=f"Guest disk size \\[default: {_size(DEFAULT_DISK_MIB)}].", rich_help_panel=VM
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
        help="base, claude, codex, gemini, opencode, or your own (`vmsandbox image ls --blueprints`).",
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
RmOpt = Annotated[
    bool,
    typer.Option("--rm", help="Remove the VM at the end: the default here (docker's --rm, taken).", rich_help_panel=VM),
]
NetworkOpt = Annotated[
    str | None,
    typer.Option(
        "--network",
        metavar="MODE",
        help="allowlist: listed hosts only \\[default]; open: any public host; none: no network.",
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
