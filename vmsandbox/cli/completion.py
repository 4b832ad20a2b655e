"""`vmsandbox completion SHELL`: the script that makes a shell complete vmsandbox's command lines, and bash's side
of the protocol: bash splits a word at `=` and `:` (COMP_WORDBREAKS: `--filter state=ru`, `cp f exp1:`), so the
words are joined again before they are read, and each answer is cut to the part bash replaces."""

from __future__ import annotations

from typing import Annotated

import typer
from typer._click.shell_completion import add_completion_class
from typer._completion_classes import BashComplete, completion_init
from typer._completion_shared import get_completion_script  # typer's scripts, kept with the typer they call

from vmsandbox.cli import complete
from vmsandbox.cli.base import app
from vmsandbox.errors import UsageError

COMPLETE_VAR = "_VMSANDBOX_COMPLETE"  # what the scripts set to ask vmsandbox for the words (click's convention)
BREAKS = "=:"  # of bash's COMP_WORDBREAKS, the characters our words hold
BASH = """
_vmsandbox_completion() {
    local IFS=$'\\n'
    COMPREPLY=( $( env COMP_WORDS="${COMP_WORDS[*]}" COMP_CWORD=$COMP_CWORD %(var)s=complete_bash $1 ) )
    if [[ ${#COMPREPLY[@]} -eq 1 && ${COMPREPLY[0]} == *[=:] ]]; then
        compopt -o nospace  # `state=`, `exp1:`: the word goes on
    fi
    return 0
}

complete -o default -F _vmsandbox_completion vmsandbox
"""


class Bash(BashComplete):
    """bash's words with the pieces it split at `=` and `:` joined again; each answer cut to what replaces the
    word bash has (`state=ru`: bash replaces `ru`, so `running` is answered for `state=running`)."""

    said = ""  # the current word as bash has it (what an answer replaces)

    def get_completion_args(self) -> tuple[list[str], str]:
        args, incomplete = super().get_completion_args()
        joined: list[str] = []
        glue = False
        for word in [*args, incomplete]:
            apart = word != "" and word.strip(BREAKS) == ""  # `=`, `:` as a word of its own: bash split there
            if joined and (apart or (glue and word != "")):
                joined[-1] += word
            else:
                joined.append(word)
            glue = apart
        self.said = incomplete
        return joined[:-1], joined[-1]

    def complete(self) -> str:
        args, typed = self.get_completion_args()
        asked = typed.partition("=")[2] if typed.startswith("-") and "=" in typed else typed  # `--opt=VALUE`
        found = [item.value for item in self.get_completions(args, typed)]
        return "\n".join(self.said + value[len(asked) :] for value in found if value.startswith(asked))


completion_init()  # typer's answer for each shell (its --install-completion, which we leave out, would do it)
add_completion_class(Bash, "bash")


def script(shell: str) -> str:
    if shell not in complete.SHELLS:
        raise UsageError(f"no completion for {shell!r}", hint=f"one of: {', '.join(complete.SHELLS)}")
    if shell == "bash":
        return BASH % {"var": COMPLETE_VAR}
    return get_completion_script(prog_name="vmsandbox", complete_var=COMPLETE_VAR, shell=shell)


@app.command()
def completion(
    shell: Annotated[str, typer.Argument(help="bash, zsh or fish.", metavar="SHELL", autocompletion=complete.shells)],
) -> None:
    """Print the shell's completion script.

    It completes commands, options and every value with a known set: session names, fan-outs, checkpoint labels,
    published ports, allowlist entries, blueprints, agents, hosts, images, secrets, `--filter` keys and values, and
    the choices of --accel, --network, --review and --format. It reads files only, never libvirt or a VM.

    Examples:

    `vmsandbox completion bash > ~/.local/share/bash-completion/completions/vmsandbox`

    `echo 'eval "$(vmsandbox completion zsh)"' >> ~/.zshrc`

    `vmsandbox completion fish > ~/.config/fish/completions/vmsandbox.fish`"""
    print(script(shell))
