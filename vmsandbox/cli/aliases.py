"""The names earlier versions took, kept working for a while: a command line that uses one is rewritten into the
one grammar before it is parsed, and its new form is said on stderr (one line), then done. They are no commands
of their own (hidden from `vmsandbox -h` and from completion): `vmsandbox rollback -h` shows `checkpoint
restore`'s help.

    old                              new
    destroy, ps, list, ssh           rm, ls, ls, shell
    checkpoint NAME [LABEL]          checkpoint create NAME [LABEL]
    checkpoints NAME / rollback      checkpoint ls NAME / checkpoint restore
    fork NAME NEW [--from LABEL]     create --from NAME[:LABEL] --name NEW
    fanout N …                       run --fanout N …
    compare A B C                    diff A --against B --against C --stat
    recover                          pull
    gc                               rm --stale
    clean NAME                       secret wipe NAME
    ssh-config NAME                  inspect --format ssh-config NAME
    allow / deny NAME HOST…          policy allow / policy deny NAME HOST…
    logs NAME proxy                  policy log NAME
    port NAME [publish|unpublish P]  port ls NAME / port publish NAME P / port rm NAME P
    hosts                            host ls
    login AGENT [--forget]           login add AGENT / login rm AGENT
    trust add|ls|rm …                config trust add|ls|rm …
    trust PATH / --list / --revoke   config trust add PATH / config trust ls / config trust rm PATH
    blueprint ls / show NAME         image ls --blueprints / image show NAME
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import Any

from vmsandbox import ui

Rewrite = Callable[[list[str]], list[str]]  # the words after the old name → the new command line's words

# An old name that is now another name (and the words after it are the same).
TOP: dict[str, tuple[str, ...]] = {
    "destroy": ("rm",),
    "ps": ("ls",),
    "list": ("ls",),
    "ssh": ("shell",),
    "checkpoints": ("checkpoint", "ls"),
    "rollback": ("checkpoint", "restore"),
    "recover": ("pull",),
    "gc": ("rm", "--stale"),
    "clean": ("secret", "wipe"),
    "ssh-config": ("inspect", "--format", "ssh-config"),
    "allow": ("policy", "allow"),
    "deny": ("policy", "deny"),
    "hosts": ("host", "ls"),
    "fork": ("create", "--from"),
    "fanout": ("run", "--fanout"),
    "compare": ("diff",),
}
HELP = ("-h", "--help")


class Root:
    """The command tree the line is read against (the top group, made when first asked for)."""

    made: Callable[[], Any] = staticmethod(lambda: None)


def _valued(path: tuple[str, ...]) -> set[str]:
    """The options of the command at `path` that take a value (so a word after one is no argument)."""
    command = Root.made()
    for word in path:
        command = command.commands[word]
    return {name for p in command.params if not getattr(p, "is_flag", True) for name in p.opts}


def _split(words: list[str], valued: set[str]) -> tuple[list[int], int]:
    """The indexes of the arguments among `words` (not options, nor their values), and where `--` is."""
    found: list[int] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            return found, i
        if word.startswith("-") and word != "-":
            i += 2 if word in valued else 1
            continue
        found.append(i)
        i += 1
    return found, len(words)


def _fork(rest: list[str]) -> list[str]:
    args, _ = _split(rest, {"--from"})
    if len(args) < 2 or any(w in HELP for w in rest):
        return ["create", *rest] if any(w in HELP for w in rest) else ["create", "--from", *rest]
    name, new = rest[args[0]], rest[args[1]]
    others = [w for i, w in enumerate(rest) if i not in args[:2]]
    label = others[others.index("--from") + 1] if "--from" in others[:-1] else None
    others = [w for i, w in enumerate(others) if w != "--from" and (i == 0 or others[i - 1] != "--from")]
    return ["create", "--from", f"{name}:{label}" if label else name, "--name", new, *others]


def _fanout(rest: list[str]) -> list[str]:
    if any(w in HELP for w in rest[: _split(rest, set())[1]]):
        return ["run", "-h"]
    args, _ = _split(rest, _valued(("run",)))
    if not args:
        return ["run", "--fanout", *rest]
    n = args[0]
    return ["run", "--fanout", rest[n], *rest[:n], *rest[n + 1 :]]


def _compare(rest: list[str]) -> list[str]:
    args, _ = _split(rest, set())
    names = [rest[i] for i in args]
    others = [w for i, w in enumerate(rest) if i not in args]
    if not names:
        return ["diff", *others]
    against = [w for n in names[1:] for w in ("--against", n)]
    return ["diff", names[0], *against, "--stat", *others]


def _checkpoint(rest: list[str]) -> list[str] | None:
    if not rest or rest[0].startswith("-") or rest[0] in ("create", "ls", "rm", "restore"):
        return None
    return ["checkpoint", "create", *rest]


def _port(rest: list[str]) -> list[str] | None:
    if not rest or rest[0].startswith("-") or rest[0] in ("ls", "publish", "rm"):
        return None
    name, after = rest[0], rest[1:]
    if after[:1] == ["publish"]:
        return ["port", "publish", name, *after[1:]]
    if after[:1] == ["unpublish"]:
        return ["port", "rm", name, *after[1:]]
    return ["port", "ls", name, *after]


def _logs(rest: list[str]) -> list[str] | None:
    args, _ = _split(rest, _valued(("logs",)))
    if len(args) < 2 or rest[args[1]] not in ("proxy", "console"):
        return None
    which, others = rest[args[1]], [w for i, w in enumerate(rest) if i != args[1]]
    return ["policy", "log", *others] if which == "proxy" else ["logs", *others]


def _login(rest: list[str]) -> list[str] | None:
    if not rest or rest[0].startswith("-") or rest[0] in ("add", "ls", "rm"):
        return None
    if "--forget" in rest:
        return ["login", "rm", *(w for w in rest if w != "--forget")]
    return ["login", "add", *rest]


def _trust(rest: list[str]) -> list[str]:
    if not rest or rest[0] in ("add", "ls", "rm", *HELP):
        return ["config", "trust", *rest]
    if "--list" in rest:
        return ["config", "trust", "ls", *(w for w in rest if w != "--list")]
    if "--revoke" in rest:
        return ["config", "trust", "rm", *(w for w in rest if w != "--revoke")]
    return ["config", "trust", "add", *rest]


def _blueprint(rest: list[str]) -> list[str]:
    verb = next(iter(_split(rest, set())[0]), None)
    if verb is not None and rest[verb] == "ls":
        return ["image", *rest[: verb + 1], "--blueprints", *rest[verb + 1 :]]
    return ["image", *rest]  # `show NAME` as it was; the noun alone: image's help


# An old name that is also a new one, in an old shape (None: the words are the new shape already).
SHAPES: dict[str, Callable[[list[str]], list[str] | None]] = {
    "checkpoint": _checkpoint,
    "port": _port,
    "logs": _logs,
    "login": _login,
}
MOVED: dict[str, Rewrite] = {
    "fork": _fork,
    "fanout": _fanout,
    "compare": _compare,
    "trust": _trust,
    "blueprint": _blueprint,
}
# A noun now under another (MOVED rewrites its shapes): where it went, for "did you mean" (as TOP's names).
FOLDED: dict[str, tuple[str, ...]] = {"trust": ("config", "trust"), "blueprint": ("image",)}


def modern(args: list[str], at: int, root: Callable[[], Any]) -> list[str]:
    """`args` in the one grammar (the command word is `args[at]`; `root()` the command tree), its new form said on
    stderr when it was not."""
    Root.made = root
    word, rest = args[at], args[at + 1 :]
    tail = rest[_split(rest, set())[1] :]  # after `--`: the guest's command, never rewritten
    rest = rest[: len(rest) - len(tail)]
    new: list[str] | None
    if word in MOVED:
        new = MOVED[word](rest)
    elif word in TOP:
        new = [*TOP[word], *rest]
    elif word in SHAPES:
        new = SHAPES[word](rest)
    else:
        new = None
    if new is None:
        return args
    now = [*args[:at], *new, *tail]
    old = shlex.join(["vmsandbox", *args[at : len(args) - len(tail)]])
    ui.err.print(
        f"note: `{ui.printable(old)}` is now `{ui.printable(shlex.join(['vmsandbox', *new]))}`", soft_wrap=True
    )
    return now
