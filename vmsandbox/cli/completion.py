"""`vmsandbox completion SHELL`: the script that makes a shell complete vmsandbox's command lines."""

from __future__ import annotations

from typing import Annotated

import typer
from typer._completion_classes import completion_init
from typer._completion_shared import get_completion_script  # typer's scripts, kept with the typer they call

from vmsandbox.cli import complete
from vmsandbox.cli.base import app
from vmsandbox.errors import UsageError

COMPLETE_VAR = "_VMSANDBOX_COMPLETE"  # what the scripts set to ask vmsandbox for the words (click's convention)
completion_init()  # typer's answer for each shell (its --install-completion, which we leave out, would do it)


def script(shell: str) -> str:
    if shell not in complete.SHELLS:
        raise UsageError(f"no completion for {shell!r}", hint=f"one of: {', '.join(complete.SHELLS)}")
    return get_completion_script(prog_name="vmsandbox", complete_var=COMPLETE_VAR, shell=shell)


@app.command()
def completion(
    shell: Annotated[str, typer.Argument(help="bash, zsh or fish.", metavar="SHELL", autocompletion=complete.shells)],
) -> None:
    """Print the shell's completion script.

    It completes commands and options, session names, checkpoint labels, blueprints, hosts and the values of
    --accel, --network and --review.

    Examples:

    `vmsandbox completion bash > ~/.local/share/bash-completion/completions/vmsandbox`

    `echo 'eval "$(vmsandbox completion zsh)"' >> ~/.zshrc`

    `vmsandbox completion fish > ~/.config/fish/completions/vmsandbox.fish`"""
    print(script(shell))
