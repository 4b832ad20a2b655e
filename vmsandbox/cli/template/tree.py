"""Tokens as a tree: text, actions (a pipeline of commands), `if`/`else if`/`else` and `range`/`else`, each
closed by its `{{end}}`. Checked as it is built: syntax, what lies outside the subset (named as Go's), each
function's arguments. `fields()` gives the fields a tree names of the row itself (not of a `range`'s elements)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Union

from vmsandbox.cli.template.functions import ARITY
from vmsandbox.cli.template.lexer import Kind, TemplateError, Token, outside

GO_KEYWORDS = ("with", "define", "template", "block", "break", "continue")
GO_FUNCTIONS = ("print", "println", "html", "js", "urlquery", "call", "slice", "lt", "le", "gt", "ge")
DOCKER_FUNCTIONS = ("title", "split", "pad", "truncate")
FUNCTION_HINT = f"the functions: {', '.join(ARITY)}"


@dataclass(frozen=True)
class Field:
    """`.A.B`: the names after each dot."""

    names: tuple[str, ...]
    pos: int


@dataclass(frozen=True)
class Dot:
    pos: int


@dataclass(frozen=True)
class Literal:
    value: Any
    pos: int


@dataclass(frozen=True)
class Call:
    """A function and the arguments written after it (a piped value comes last, when run)."""

    name: str
    args: tuple[Operand, ...]
    pos: int


@dataclass(frozen=True)
class Pipe:
    """Commands joined by `|`: each after the first a function, given the value before it last."""

    commands: tuple[Operand, ...]
    pos: int


Operand = Union[Field, Dot, Literal, Call, Pipe]  # noqa: UP007 - (a forward reference: Call and Pipe hold operands)


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Action:
    pipe: Pipe


@dataclass(frozen=True)
class If:
    pipe: Pipe
    then: tuple[Node, ...]
    otherwise: tuple[Node, ...]


@dataclass(frozen=True)
class Range:
    """`{{range .List}}…{{else}}…{{end}}`: the body once for each element (`.` the element), else the other."""

    pipe: Pipe
    body: tuple[Node, ...]
    otherwise: tuple[Node, ...]


Node = Union[Text, Action, If, Range]  # noqa: UP007


def parse(tokens: list[Token]) -> tuple[Node, ...]:
    nodes, _ended = _Parser(tokens).nodes(None)
    return tuple(nodes)


def fields(nodes: tuple[Node, ...]) -> Iterator[Field]:
    """Every field the tree names of the row (inside a `range`, `.` is an element: its fields are not the row's)."""
    for node in nodes:
        if isinstance(node, Action):
            yield from _operand_fields(node.pipe)
        elif isinstance(node, If):
            yield from _operand_fields(node.pipe)
            yield from fields(node.then)
            yield from fields(node.otherwise)
        elif isinstance(node, Range):
            yield from _operand_fields(node.pipe)
            yield from fields(node.otherwise)


def _operand_fields(operand: Operand) -> Iterator[Field]:
    if isinstance(operand, Field):
        yield operand
    elif isinstance(operand, Call):
        for arg in operand.args:
            yield from _operand_fields(arg)
    elif isinstance(operand, Pipe):
        for command in operand.commands:
            yield from _operand_fields(command)


class _Parser:
    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.at = 0

    def peek(self) -> Token:
        return self.tokens[self.at]

    def next(self) -> Token:
        token = self.tokens[self.at]
        self.at += 1
        return token

    def nodes(self, block: Token | None) -> tuple[list[Node], Token | None]:
        """Nodes up to the `{{else}}` or `{{end}}` of `block` (which is returned, its action still open), or to
        the end of the template when `block` is None."""
        out: list[Node] = []
        while True:
            token = self.next()
            if token.kind is Kind.END:
                if block is not None:
                    raise TemplateError(f"{{{{{block.text}}}}} has no {{{{end}}}}", block.pos, "close it: {{end}}")
                return out, None
            if token.kind is Kind.TEXT:
                out.append(Text(token.value))
                continue
            word = self.peek()
            if word.kind is Kind.COMMENT:
                self.next()
                self.close()
                continue
            if word.kind is Kind.NAME and word.text in ("else", "end"):
                if block is None:
                    raise TemplateError(f"{{{{{word.text}}}}} with no {{{{if}}}} or {{{{range}}}} before it", word.pos,
                                        "e.g. '{{if .Keep}}kept{{else}}-{{end}}'")  # fmt: skip
                self.next()
                return out, word
            if word.kind is Kind.NAME and word.text in ("if", "range"):
                self.next()
                out.append(self.block(word))
                continue
            out.append(Action(self.pipeline(word)))
            self.close()

    def block(self, word: Token) -> If | Range:
        pipe = self.pipeline(self.peek())
        self.close()
        body, ended = self.nodes(word)
        otherwise: list[Node] = []
        if ended is not None and ended.text == "else":
            after = self.peek()
            if after.kind is Kind.NAME and after.text == "if" and word.text == "if":
                self.next()
                return If(pipe, tuple(body), (self.block(after),))  # else if: the one {{end}} closes both
            self.close()
            otherwise, ended = self.nodes(word)
            if ended is not None and ended.text == "else":
                raise TemplateError(f"a second {{{{else}}}} in one {{{{{word.text}}}}}", ended.pos)
        self.close()
        kind = If if word.text == "if" else Range
        return kind(pipe, tuple(body), tuple(otherwise))

    def close(self) -> None:
        token = self.next()
        if token.kind is not Kind.CLOSE:
            raise TemplateError(f"unexpected {token.text or token.kind.value!r} in an action: expected }}}}", token.pos)

    def pipeline(self, first: Token) -> Pipe:
        commands = [self.command()]
        while self.peek().kind is Kind.PIPE:
            self.next()
            command = self.command()
            if not isinstance(command, Call):
                raise TemplateError("only a function takes a piped value", _pos(command), FUNCTION_HINT)
            commands.append(command)
        for n, command in enumerate(commands):
            if isinstance(command, Call):
                _arity(command, piped=n > 0)
        return Pipe(tuple(commands), first.pos)

    def command(self) -> Operand:
        start = self.peek()
        operands: list[Operand | Token] = []
        while self.peek().kind not in (Kind.CLOSE, Kind.PIPE, Kind.RIGHT, Kind.END):
            operands.append(self.operand())
        if not operands:
            raise TemplateError(f"a value is missing before {start.text or start.kind.value!r}", start.pos,
                                "e.g. '{{.Name}}'")  # fmt: skip
        first, *rest = operands
        args = tuple(_called(a) for a in rest)
        if isinstance(first, Token):
            return Call(first.text, args, first.pos)
        if args:
            raise TemplateError("only a function takes arguments", _pos(args[0]), FUNCTION_HINT)
        return first

    def operand(self) -> Operand | Token:
        """A value, or a function's name (a Token: the command it starts takes what follows)."""
        token = self.next()
        values = {"true": True, "false": False, "nil": None}
        if token.kind is Kind.FIELD:
            return Field(token.value, token.pos)
        if token.kind is Kind.DOT:
            return Dot(token.pos)
        if token.kind in (Kind.STRING, Kind.NUMBER):
            return Literal(token.value, token.pos)
        if token.kind is Kind.LEFT:
            inner = self.pipeline(self.peek())
            if self.next().kind is not Kind.RIGHT:
                raise TemplateError("unclosed parenthesis", token.pos, "close it: )")
            return inner
        if token.kind is not Kind.NAME:
            raise TemplateError(f"unexpected {token.text or token.kind.value!r}", token.pos)
        if token.text in values:
            return Literal(values[token.text], token.pos)
        if token.text in ARITY:
            return token
        raise _unknown(token)


def _unknown(token: Token) -> TemplateError:
    name = token.text
    if name in GO_KEYWORDS or name in GO_FUNCTIONS:
        return outside(f"{{{{{name}}}}}", token.pos)
    if name in ("if", "range", "else", "end"):
        return TemplateError(f"{{{{{name}}}}} starts an action of its own", token.pos, "e.g. '{{if .Keep}}kept{{end}}'")
    if name in DOCKER_FUNCTIONS:
        return TemplateError(name, token.pos, FUNCTION_HINT, then=" is docker's template function, which vmsandbox's "
                             "--format does not take")  # fmt: skip
    return TemplateError(f"no function {name!r}", token.pos, f"a field starts with a dot: '{{{{.{name}}}}}'; "
                         f"{FUNCTION_HINT}")  # fmt: skip


def _called(operand: Operand | Token) -> Operand:
    """A function named as an argument: called with no arguments (as Go does)."""
    if isinstance(operand, Token):
        call = Call(operand.text, (), operand.pos)
        _arity(call, piped=False)
        return call
    return operand


def _arity(call: Call, *, piped: bool) -> None:
    least, most, usage = ARITY[call.name]
    given = len(call.args) + piped
    if given < least or (most is not None and given > most):
        wanted = f"{least}" if least == most else f"{least} or more" if most is None else f"{least} to {most}"
        plural = "" if wanted == "1" else "s"
        raise TemplateError(f"{call.name} takes {wanted} argument{plural}, given {given}", call.pos, f"e.g. {usage}")


def _pos(operand: Operand) -> int:
    return operand.pos
