"""The words beside the grammar, and what a word that is none of it gets.

`list` and `remove` are `ls` and `rm` wherever those are, and docker's `ps` is `ls` at the top: the very same
command, hidden from help and completion. Nothing else is rewritten. A name earlier versions took or another tool
uses (`destroy`, `fork`, `checkpoints` …) is no command here, and a word that is no command, verb or synonym is a
usage error whose hint names what does it: "did you mean" by edit distance for words of two letters and up, the
verb first for a noun given a name (`checkpoint exp1`: `checkpoint ls exp1`). A hint names a command and never
runs one: a guessed or mistyped word never becomes a verb that changes state."""

from __future__ import annotations

import contextlib
import shlex
from pathlib import Path
from typing import Any

from vmsandbox.errors import UsageError

SAME = {"list": "ls", "remove": "rm"}  # under every group that has the verb
SAME_AT_TOP = {"ps": "ls"}  # docker's
# Words that are no command here, at the top, and what does their work (the names earlier versions took, and other
# tools' words for ours): said as the hint, never done.
ELSEWHERE = {
    "destroy": "`vmsandbox rm NAME` removes a session",
    "delete": "`vmsandbox rm NAME` removes a session",
    "ssh": "`vmsandbox shell NAME` opens a shell in a session; `vmsandbox inspect --format ssh-config NAME` "
    "prints ssh's own config for it",
    "checkpoints": "`vmsandbox checkpoint ls NAME` lists a session's checkpoints",
    "rollback": "`vmsandbox checkpoint restore NAME LABEL` returns a session to a checkpoint",
    "fork": "`vmsandbox create --from NAME[:LABEL] --name NEW` copies a session",
    "fanout": "`vmsandbox run --fanout N PATH -- COMMAND` starts N sessions",
    "compare": "`vmsandbox diff NAME --against OTHER --stat` compares sessions",
    "recover": "`vmsandbox pull NAME` reviews what a session changed, kept changes too",
    "gc": "`vmsandbox rm --stale` removes what crashes left",
    "clean": "`vmsandbox secret wipe NAME` wipes the credentials a session holds",
    "ssh-config": "`vmsandbox inspect --format ssh-config NAME` prints a session's ssh config",
    "allow": "`vmsandbox policy allow NAME HOST...` lets a session reach more hosts",
    "deny": "`vmsandbox policy deny NAME HOST...` takes hosts back",
    "hosts": "`vmsandbox host ls` lists the hosts",
    "images": "`vmsandbox image ls` lists the images",
    "trust": "`vmsandbox config trust add PATH` trusts a project's config",
    "blueprint": "`vmsandbox image ls --blueprints` lists the blueprints, `vmsandbox image show NAME` shows one",
    "blueprints": "`vmsandbox image ls --blueprints` lists the blueprints",
}
FIRST = ("ls", "show")  # the verbs that only read: named first when a noun is given a name
SHORTEST = 2  # a word this long and up gets "did you mean"


def same(word: str, verbs: Any, *, top: bool) -> str | None:
    """The verb `word` is another name of here (`list`: `ls`), if it is one and the verb is here."""
    verb = SAME.get(word) or (SAME_AT_TOP.get(word) if top else None)
    return verb if verb is not None and verb in verbs else None


def distance(a: str, b: str) -> int:
    """Edits from `a` to `b`: insertions, deletions, substitutions and swaps of two neighbours (`stpo`: `stop`)."""
    rows = [list(range(len(b) + 1))]
    for i, x in enumerate(a, 1):
        row = [i]
        for j, y in enumerate(b, 1):
            row.append(min(rows[-1][j] + 1, row[j - 1] + 1, rows[-1][j - 1] + (x != y)))
            if i > 1 and j > 1 and x == b[j - 2] and a[i - 2] == y:
                row[j] = min(row[j], rows[-2][j - 2] + 1)
        rows.append(row)
    return rows[-1][-1]


def nearest(word: str, known: list[str]) -> str | None:
    """The known word `word` is a typo of: one edit away (two for words of five letters and up), the first of the
    nearest."""
    if len(word) < SHORTEST:
        return None
    most = 1 if len(word) <= 4 else 2
    found = sorted((distance(word, k), i, k) for i, k in enumerate(known) if k != word)
    return found[0][2] if found and found[0][0] <= most else None


def unknown(group: Any, ctx: Any, args: list[str]) -> UsageError:
    """The error for `args[0]`, no command of `group` (at `ctx`): its hint what the person may have meant."""
    word, rest = args[0], args[1:]
    path = ctx.command_path.split(" ")
    top = ctx.parent is None
    visible = [n for n, c in group.commands.items() if not c.hidden]
    known = [*visible, *(n for n in group.commands if n not in visible), *SAME, *(SAME_AT_TOP if top else ())]
    known = [k for k in known if k in group.commands or same(k, group.commands, top=top)]
    message = f"no command {word!r}" if top else f"`{' '.join(path)}` has no verb {word!r}"
    if top and word in ELSEWHERE:
        return UsageError(message, hint=ELSEWHERE[word])
    near = nearest(word, [*known, *(ELSEWHERE if top else ())])
    if near in ELSEWHERE and near not in known:
        return UsageError(message, hint=ELSEWHERE[near])
    if near is not None:
        line = shlex.join([*path, same(near, group.commands, top=top) or near, *rest])
        return UsageError(message, hint=f"did you mean `{line if len(line) <= 80 else ' '.join([*path, near])}`?")
    hint = _named(path, word) if top else _verb_first(group, path, word)
    return UsageError(message, hint=hint or f"`{' '.join([*path, '-h'])}` lists the {'commands' if top else 'verbs'}")


def _verb_first(group: Any, path: list[str], word: str) -> str | None:
    """`vmsandbox checkpoint exp1`: the verbs that take a first argument, with `word` as it (those that only read
    first)."""
    order = sorted(group.commands, key=lambda n: FIRST.index(n) if n in FIRST else len(FIRST))
    lines = []
    for verb in order:
        command = group.commands[verb]
        taken = [p for p in command.params if p.param_type_name == "argument"]
        if command.hidden or not taken:
            continue
        more = [_shown(p) for p in taken[1:] if p.required]
        lines.append(f"`{shlex.join([*path, verb, word])}{''.join(' ' + m for m in more)}`")
    if not lines:
        return None
    return f"the verb comes first: {' or '.join(lines[:2])} (`{' '.join([*path, '-h'])}` lists the verbs)"


def _shown(param: Any) -> str:
    name = str(param.metavar or param.name.upper())
    return name if param.nargs == 1 or name.endswith("...") else f"{name}..."


def _named(path: list[str], word: str) -> str | None:
    """`vmsandbox exp1`, `vmsandbox .`: what to do with a session, or with a directory."""
    from vmsandbox.core import listing

    sessions: list[str] = []
    with contextlib.suppress(Exception):  # a hint, never a second failure
        sessions = listing.names()
    if word in sessions:
        shell, inspect = shlex.join([*path, "shell", word]), shlex.join([*path, "inspect", word])
        return f"`{shell}` opens a shell in it, `{inspect}` shows it"
    if Path(word).is_dir():
        run, agent = shlex.join([*path, "run", word]), shlex.join([*path, "claude", word])
        return f"`{run}` opens a shell in a VM on it, `{agent}` runs an agent there"
    return None


def help_of(ctx: Any, words: list[str]) -> tuple[Any, list[str]]:
    """`vmsandbox checkpoint help [VERB]`: the top's `help` and the words it is given (the noun's path first)."""
    root = ctx.find_root().command
    return root.commands["help"], [*ctx.command_path.split(" ")[1:], *words]
