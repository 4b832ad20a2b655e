"""Values as Go's text/template shows and judges them, and the functions a --format template may call.

A row is JSON-shaped data (dicts, lists, strings, numbers, booleans, None). Shown as Go shows them: `true`, `[a b]`,
`map[k:v]`, and None as `-` (the tables' dash; Go prints `<no value>`). Truthiness is Go's: false, 0, "", an empty
list or map and None are false. `printf` takes Go's verbs (%v %s %d %q %f %e %g %x %X %t %%) with flags, widths and
precisions, and says a wrong argument as Go does (`%!d(string=abc)`)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any


class Heading(str):
    """A field's name as a table's header shows it (`AVAILABLE MIB`): what a field gives while headers are made."""

    __slots__ = ()


def shown(value: Any) -> str:
    """A value as an action prints it."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, list | tuple):
        return "[" + " ".join(shown(v) for v in value) + "]"
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{shown(v)}" for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))) + "]"
    return str(value)


def _float(value: float) -> str:
    if value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    return repr(value)


def truthy(value: Any) -> bool:
    """Go's `if`: false, 0, "", an empty list or map and nil (None) are false; anything else is true."""
    return value is not None and value not in (False, 0, "", [], {})


def go_type(value: Any) -> str:
    kinds = ((bool, "bool"), (int, "int"), (float, "float64"), (str, "string"), (list, "[]interface {}"))
    return next((name for kind, name in kinds if isinstance(value, kind)), "map[string]interface {}")


def key(name: str) -> str:
    """A field's name as lookups compare it: `AvailableMib`, `available_mib` and `availablemib` are one."""
    return name.replace("_", "").lower()


def lookup(row: dict[str, Any], name: str) -> Any:
    """A dict's value under `name` (as written, else case and underscores aside); None when it has none."""
    if name in row:
        return row[name]
    return next((v for k, v in row.items() if key(str(k)) == key(name)), None)


# printf
VERB = re.compile(r"%([-+# 0]*)(\d+)?(?:\.(\d*))?(.|$)", re.DOTALL)
GO_QUOTES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v",
             "\\": "\\\\", '"': '\\"'}  # fmt: skip


def printf(fmt: Any, *args: Any) -> str:
    """Go's fmt.Sprintf, for the verbs a --format template uses."""
    if not isinstance(fmt, str):
        raise TypeError(f"printf's first argument is its format, a string: given {go_type(fmt)}")
    out: list[str] = []
    used = 0
    at = 0
    for found in VERB.finditer(fmt):
        out.append(fmt[at : found.start()])
        at = found.end()
        flags, width, precision, verb = found.groups()
        if verb == "%":
            out.append("%")
        elif verb == "":
            out.append("%!(NOVERB)")
        elif used >= len(args):
            out.append(f"%!{verb}(MISSING)")
        else:
            out.append(_verb(verb, flags, int(width or 0), None if precision is None else int(precision or 0),
                             args[used]))  # fmt: skip
            used += 1
    out.append(fmt[at:])
    if used < len(args):
        out.append("%!(EXTRA " + ", ".join(f"{go_type(a)}={shown(a)}" for a in args[used:]) + ")")
    return "".join(out)


def _verb(verb: str, flags: str, width: int, precision: int | None, arg: Any) -> str:
    if isinstance(arg, Heading):  # a header: the field's name in the width its values take
        verb, precision = "s", None
    number = isinstance(arg, int | float) and not isinstance(arg, bool)
    if verb == "v" or (verb == "s" and not number and not isinstance(arg, bool) and arg is not None):
        text = shown(arg)
        return _pad(text if precision is None else text[:precision], flags, width)
    if verb == "q" and isinstance(arg, str):
        return _pad(go_quote(arg), flags, width)
    if verb == "t" and isinstance(arg, bool):
        return _pad(shown(arg), flags, width)
    if verb in "xX" and isinstance(arg, str):
        text = arg.encode().hex()
        return _pad(text.upper() if verb == "X" else text, flags, width)
    integral = number and isinstance(arg, int)
    if (verb in "dxXobc" and integral) or (verb in "feEgG" and number):
        return _number(verb, flags, width, precision, arg)
    return f"%!{verb}(<nil>)" if arg is None else f"%!{verb}({go_type(arg)}={shown(arg)})"


def _pad(text: str, flags: str, width: int) -> str:
    return text.ljust(width) if "-" in flags else text.rjust(width, "0" if "0" in flags else " ")


def _number(verb: str, flags: str, width: int, precision: int | None, arg: int | float) -> str:
    if verb == "c":
        return _pad(chr(arg), flags, width)  # type: ignore[arg-type]
    sign = "+" if "+" in flags else " " if " " in flags else ""
    spec = ("<" if "-" in flags else "") + sign + ("#" if "#" in flags else "")
    spec += ("0" if "0" in flags and "-" not in flags else "") + (str(width) if width else "")
    if verb in "feEgG" and precision is not None:
        spec += f".{precision}"
    return format(arg, spec + verb)


def go_quote(text: str) -> str:
    """A string as Go's %q (strconv.Quote) writes it."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch in GO_QUOTES:
            out.append(GO_QUOTES[ch])
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(f"\\x{code:02x}" if code < 0x80 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return '"' + "".join(out) + '"'


# the functions
def to_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def join(items: Any, separator: Any) -> str:
    """`{{join .List ","}}` (and `{{.List | join ","}}`, where the list comes last)."""
    if isinstance(items, str) and not isinstance(separator, str):
        items, separator = separator, items
    if not isinstance(separator, str):
        raise TypeError(f"join's separator is a string: given {go_type(separator)}")
    if isinstance(items, str):
        return items
    if items is None:
        return ""
    if not isinstance(items, list | tuple):
        raise TypeError(f"join takes a list: given {go_type(items)}")
    return separator.join(shown(v) for v in items)


def length(value: Any) -> int:
    if value is None:
        return 0
    if not isinstance(value, str | list | tuple | dict):
        raise TypeError(f"len of {go_type(value)}")
    return len(value)


def index(value: Any, *keys: Any) -> Any:
    """`{{index .Ports "ssh"}}`, `{{index .Files 0}}`: a map's value by key, a list's by position."""
    for k in keys:
        if isinstance(value, dict):
            value = lookup(value, str(k))
        elif isinstance(value, list | tuple) and isinstance(k, int) and not isinstance(k, bool):
            if not -1 < k < len(value):
                raise ValueError(f"index {k} out of range: the list has {len(value)}")
            value = value[k]
        elif value is None:
            return None
        else:
            raise ValueError(f"can't index {go_type(value)} with {go_type(k)}")
    return value


def _and(*args: Any) -> Any:
    return next((a for a in args if not truthy(a)), args[-1])


def _or(*args: Any) -> Any:
    return next((a for a in args if truthy(a)), args[-1])


def _text(value: Any) -> str:
    return value if isinstance(value, str) else shown(value)


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "json": to_json,
    "upper": lambda v: _text(v).upper(),
    "lower": lambda v: _text(v).lower(),
    "join": join,
    "printf": printf,
    "len": length,
    "index": index,
    "eq": lambda a, *others: any(a == b for b in others),
    "ne": lambda a, b: a != b,
    "not": lambda v: not truthy(v),
    "and": _and,
    "or": _or,
}
# How many arguments each takes (a piped value counts: the last), and how it is written.
ARITY: dict[str, tuple[int, int | None, str]] = {
    "json": (1, 1, "{{json .}}, {{json .Ports}}"),
    "upper": (1, 1, "{{upper .Name}}, {{.Name | upper}}"),
    "lower": (1, 1, "{{lower .Name}}, {{.Name | lower}}"),
    "join": (2, 2, '{{join .Files ","}}'),
    "printf": (1, None, '{{printf "%-12s %d" .Name .Cpus}}'),
    "len": (1, 1, "{{len .Files}}"),
    "index": (2, None, '{{index .Ports "ssh"}}'),
    "eq": (2, None, '{{if eq .State "running"}}…{{end}}'),
    "ne": (2, 2, '{{if ne .State "running"}}…{{end}}'),
    "not": (1, 1, "{{if not .Keep}}…{{end}}"),
    "and": (1, None, "{{if and .Keep .Group}}…{{end}}"),
    "or": (1, None, "{{or .Group .Name}}"),
}
HEADED = ("upper", "lower", "printf")  # what they make of a header is the header's text; the others give it back


def call(name: str, args: list[Any]) -> Any:
    """The function `name` on `args` (ValueError: a wrong argument). Given a header (a table's first line), the
    header shaped by upper, lower or printf, or passed through the others."""
    heading = next((a for a in args if isinstance(a, Heading)), None)
    if heading is not None and name not in HEADED:
        return heading
    return FUNCTIONS[name](*args)
