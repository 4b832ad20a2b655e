"""People read stderr: terse steps with a spinner and elapsed time. stdout is kept for data."""

from __future__ import annotations

import functools
import io
import logging
import os
import sys
import threading
import time
import unicodedata
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from rich.console import Console


def plain() -> bool:
    """NO_COLOR (no-color.org: set and not empty): no colour and no style, not even the dimmed "hint:"."""
    return bool(os.environ.get("NO_COLOR"))


def console(*, stderr: bool) -> Console:
    """A console that honours NO_COLOR (rich alone keeps bold and dim under it); soft_wrap: a hint split
    mid-command helps nobody."""
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True, color_system=None if plain() else "auto")


class _AtFirstUse:
    """`err` and `out`: a console made when first used. A process that never prints through one never imports
    rich — every session's egress daemon, which only logs (rich is ~2 MiB of its own memory in each)."""

    def __init__(self, *, stderr: bool) -> None:
        object.__setattr__(self, "_stderr", stderr)
        object.__setattr__(self, "_made", None)

    _making = threading.Lock()  # a fan-out's threads print at once: one console each, never two

    def _console(self) -> Console:
        made: Console | None = object.__getattribute__(self, "_made")
        if made is None:
            with self._making:
                made = object.__getattribute__(self, "_made")
                if made is None:
                    made = console(stderr=object.__getattribute__(self, "_stderr"))
                    object.__setattr__(self, "_made", made)
        return made

    def __getattr__(self, name: str) -> Any:
        return getattr(self._console(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._console(), name, value)


err: Console = _AtFirstUse(stderr=True)  # type: ignore[assignment]
out: Console = _AtFirstUse(stderr=False)  # type: ignore[assignment]
log = logging.getLogger("vmsandbox")


_thread = threading.local()  # `quiet`: a fan-out's worker threads show no steps (one live display at a time)


@contextmanager
def quiet(prefix: str) -> Iterator[None]:
    """In this thread: steps and notes go to the log only; warnings are printed, prefixed (`[exp-2] ...`)."""
    _thread.prefix = prefix
    try:
        yield
    finally:
        _thread.prefix = None


def _quiet() -> str | None:
    prefix: str | None = getattr(_thread, "prefix", None)
    return prefix


SHOWN = {"shown": True}  # a log record a person was shown already (`-v` does not say it twice on stderr)


def info(message: str) -> None:
    if _quiet() is None:
        err.print(message)
        log.info(message, extra=SHOWN)
    else:
        log.info(message)


_warned: set[str] = set()  # warnings quiet threads printed already: N sessions say "using TCG" once


def warn(message: str) -> None:
    """A warning: plain text (never markup), control characters shown escaped."""
    prefix = _quiet()
    if prefix is not None:
        if message in _warned:
            log.warning(message)
            return
        _warned.add(message)
    err.print(f"{printable(f'[{prefix}] ') if prefix else ''}[yellow]warning:[/] {printable(message)}")
    log.warning(message, extra=SHOWN)


Detail = Callable[[str], None]


@contextmanager
def step(title: str) -> Iterator[Detail]:
    """A timed step: a live spinner on a terminal, one line when it is done (or failed). It yields a function
    that shows how far the step got beside the spinner (`with ui.step(...) as detail: detail("kernel")`)."""
    start = time.monotonic()
    log.info("step: %s", title)
    if _quiet() is not None:
        yield lambda text: log.info("step: %s: %s", title, text)
        return
    try:
        if err.is_terminal:
            with err.status(f"{title}…", spinner="dots") as status:
                yield lambda text: status.update(f"{title}… [dim]{printable(text)}[/]")
        else:
            yield lambda text: log.info("step: %s: %s", title, text)
    except BaseException:
        err.print(f"[red]✗[/] {title} [dim]({time.monotonic() - start:.1f}s)[/]")
        raise
    err.print(f"[green]✓[/] {title} [dim]({time.monotonic() - start:.1f}s)[/]")


_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F] if c not in (0x09, 0x0A)}
# What can hide, reorder or restyle text around it, by Unicode category, not by a list of code points: controls
# (escape sequences, C1 controls), format characters (bidirectional overrides and isolates, zero-width joiners and
# spaces, invisible operators, tag characters), line and paragraph separators, surrogates (undecodable bytes),
# private-use and unassigned code points. And a combining mark at the very start, which would join the
# character before it: text that is not the guest's.
HIDING = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
# Unicode's Default_Ignorable_Code_Point (DerivedCoreProperties.txt): drawn as nothing whatever their category —
# variation selectors (Mn), Hangul fillers (Lo), the combining grapheme joiner — so a line can carry what is not
# seen. And no more than MARKS combining marks in a row (a stack of them paints over the lines around it).
IGNORABLE = (
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5), (0x180B, 0x180F),
    (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164), (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF),
)  # fmt: skip
MARKS = 3
# What is not what it looks like, in a name above all: every space but the ASCII one (category Zs: no-break,
# ideographic, en/em and the rest); characters drawn blank that are no space (a Braille blank, the object
# replacement character, a null notehead); and look-alikes of the two characters that give a path its shape, `/`
# and `.`, that are no letter of a script: a top-level `src\u2215main.py` reads as `src/main.py`, `\u2025` as `..`,
# `\u0660\u0660/etc` as `../etc`. By property: any character whose compatibility form holds one (fullwidth solidus,
# one dot leader, `‥`, `…`, digit full stops), any non-letter named a solidus or a slash (`⫽`, the combining
# overlays), any punctuation named a dot or a point (a raised dot, a word separator dot); and by the table below.
BLANKS = frozenset({0x2800, 0xFFFC, 0x1D159})
# Unicode's confusables (UTS #39, confusables.txt) of `/` (U+002F), of `.` (U+002E) and of the middle dot `·`
# (U+00B7) that a `.` is read as: every entry of the three, as Debian 12's python3-confusable-homoglyphs 3.2.0
# carries the file (confusables.json). Those that are letters of a script (categories Lu, Ll, Lt, Lo: katakana NO,
# a CJK ideograph, Coptic ESH) are text and stay; every other one is escaped: punctuation, symbols, a combining
# mark, digits (the Arabic-Indic zeros), modifier letters (Lisu MYA TI).
CONFUSABLES = {
    "/": (0x1735, 0x2041, 0x2215, 0x2044, 0x2571, 0x27CB, 0x29F8, 0x1D23A, 0x31D3, 0x3033, 0x2CC6, 0x30CE, 0x4E3F,
          0x2F03),
    ".": (0x1D16D, 0x2024, 0x0701, 0x0702, 0xA60E, 0x10A50, 0x0660, 0x06F0, 0xA4F8),
    "\u00b7": (0x00B7, 0x30FB, 0xFF65, 0x16EB, 0x0387, 0x2E31, 0x10101, 0x2022, 0x2027, 0x2219, 0x22C5, 0xA78F,
               0x1427),
}  # fmt: skip
LETTERS = frozenset({"Lu", "Ll", "Lt", "Lo"})
LOOKALIKES = frozenset(c for cs in CONFUSABLES.values() for c in cs if unicodedata.category(chr(c)) not in LETTERS)
SLASHES = frozenset({"SOLIDUS", "SLASH"})  # a word of the name of a non-letter drawn as `/` (not REVERSE ones)
DOTS = frozenset({"DOT", "POINT"})  # the last word of the name of punctuation drawn as a point


@functools.lru_cache(maxsize=4096)
def _misleads(ch: str) -> bool:
    """Whether a non-ASCII character that hides nothing still reads as what it is not (a space, `/`, `.`)."""
    code = ord(ch)
    category = unicodedata.category(ch)
    if code in BLANKS or code in LOOKALIKES or category == "Zs":
        return True
    words = unicodedata.name(ch, "").split()
    if category not in LETTERS and SLASHES & {*words} and not {"REVERSE", "REVERSED"} & {*words}:
        return True
    if category[0] == "P" and words[-1:] and words[-1] in DOTS:
        return True
    folded = unicodedata.normalize("NFKC", ch)
    return "/" in folded or "." in folded


def _escaped(code: int) -> str:
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def visible(text: str) -> str:
    """Text from the guest as its characters are, and nothing that acts on what surrounds it or reads as what it
    is not: every character that could hide, reorder or restyle text (HIDING, and a combining mark first), every
    space but U+0020 and every blank, and every look-alike of `/` and `.` that is no letter (_misleads: digits and
    dot-like punctuation too) shown as \\xNN, \\uNNNN or \\UNNNNNNNN. Tabs and newlines stay. The one escaping the
    terminal, the page and `diff` show names and lines through."""
    if text.isascii():
        return text.translate(_CONTROL)
    out = []
    marks = 0
    for i, ch in enumerate(text):
        code = ord(ch)
        if code < 0x80:
            out.append(_CONTROL.get(code, ch))
            marks = 0
            continue
        category = unicodedata.category(ch)
        marks = marks + 1 if category in ("Mn", "Me", "Mc") else 0
        hides = (
            category in HIDING
            or (i == 0 and marks)
            or marks > MARKS
            or any(low <= code <= high for low, high in IGNORABLE)
            or _misleads(ch)
        )
        out.append(_escaped(code) if hides else ch)
    return "".join(out)


def printable(text: str, *, markup: bool = True) -> str:
    """Text from the guest made safe for a terminal (visible), and, for rich output, markup brackets escaped."""
    shown = visible(text)
    if not markup:
        return shown
    from rich.markup import escape  # here: a daemon's log (Escaping) never needs it

    return escape(shown)


class Escaping(io.TextIOBase):
    """A text stream that passes on what it is given with control characters escaped, as `printable` shows
    them: a daemon's log file, which holds what a guest said and which a person reads in a terminal."""

    def __init__(self, raw: TextIO) -> None:
        self._raw = raw

    def write(self, text: str) -> int:
        self._raw.write(printable(text, markup=False))
        return len(text)

    def flush(self) -> None:
        self._raw.flush()

    def fileno(self) -> int:
        return self._raw.fileno()


class EscapingFormatter(logging.Formatter):
    """A log line, traceback and all, with what would act on a terminal shown as escapes (visible): a log holds
    what guests said (their stderr in an error, their names), and people read logs in terminals."""

    def format(self, record: logging.LogRecord) -> str:
        return visible(super().format(record))


def log_escaped(stream: TextIO, fmt: str) -> Escaping:
    """This process's log goes to `stream` with control characters escaped (whatever logger wrote it); the
    escaping stream, for what is written there otherwise (tracebacks: make it sys.stderr)."""
    escaped = Escaping(stream)
    handler = logging.StreamHandler(escaped)
    handler.setFormatter(logging.Formatter(fmt))
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.INFO)
    return escaped


def is_interactive() -> bool:
    return sys.stdin.isatty() and sys.stdout.isatty()
