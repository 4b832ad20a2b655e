"""What a person sees of a name is what its bytes are: every space but the ASCII one, every blank and every
look-alike of `/` and `.` is escaped by the one function the terminal, the page and `diff` show text through
(ui.visible), by Unicode property — the whole of a category, every compatibility form — not by a list."""

from __future__ import annotations

import unicodedata

import pytest

from vmsandbox import ui

# Every code point below U+20000 (the planes text lives in) whose compatibility form holds `/` or `.`, and every
# space separator: the properties, enumerated, not a list someone wrote.
SPACES = [chr(c) for c in range(0x80, 0x110000) if unicodedata.category(chr(c)) == "Zs"]
COMPATIBLE = [
    chr(c) for c in range(0x80, 0x20000) if {"/", "."} & set(unicodedata.normalize("NFKC", chr(c)))
]  # fmt: skip


def test_every_space_but_the_ascii_one_is_escaped() -> None:
    assert len(SPACES) >= 16 and "\u00a0" in SPACES and "\u3000" in SPACES
    for space in SPACES:
        escaped = f"\\x{ord(space):02x}" if ord(space) < 0x100 else f"\\u{ord(space):04x}"
        assert ui.visible(f"a{space}b") == f"a{escaped}b"


def test_every_compatibility_form_of_a_slash_or_a_dot_is_escaped() -> None:
    assert {"\uff0f", "\uff0e", "\u2024", "\u2025", "\ufe52"} <= set(COMPATIBLE)
    for ch in COMPATIBLE:
        assert ch not in ui.visible(f"src{ch}main"), f"U+{ord(ch):04X} {unicodedata.name(ch, '?')}"


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("src\u2215main.py", "src\\u2215main.py"),  # division slash: `src/main.py` at the top level
        ("src\u2044main.py", "src\\u2044main.py"),  # fraction slash
        ("src\u29f8main.py", "src\\u29f8main.py"),  # big solidus
        ("setup\u2024py", "setup\\u2024py"),  # one dot leader
        ("\u2025", "\\u2025"),  # two dot leader: `..`
        ("a\u2800b", "a\\u2800b"),  # a Braille blank
        ("\ufffcx", "\\ufffcx"),  # the object replacement character
        ("x\u00a0y\u3000z", "x\\xa0y\\u3000z"),  # no-break and ideographic spaces
        ("caf\u00e9 \u65e5\u672c\u8a9e \u30ce\u30fc\u30c8.md", "caf\u00e9 \u65e5\u672c\u8a9e \u30ce\u30fc\u30c8.md"),
    ],
)
def test_a_name_reads_as_its_bytes_in_the_terminal_the_page_and_diff(name: str, shown: str) -> None:
    """The audit's names (issue 57); letters of a script (katakana NO, U+30CE, which confusables.txt also lists as a
    slash) stay letters."""
    from vmsandbox.web import app

    assert ui.printable(name, markup=False) == shown  # the terminal, and `vmsandbox diff` (cli/review/review.py)
    page = app.TEMPLATES.from_string("{{ name }}").render(name=name)
    assert page == shown.replace("&", "&amp;")
    diff = f"--- a/{name}\n+++ b/{name}\n@@ -1 +1 @@\n-x\n+y\n"
    assert ui.printable(diff, markup=False).splitlines()[0] == f"--- a/{shown}"


# Unicode's confusables (confusables.txt) of `.` and of the middle dot that are no letter, and what Unicode
# names a slash or a dot: each shown as its code, wherever it stands in a name (audit F6).
LOOKALIKES = {
    "\u0660": "ARABIC-INDIC DIGIT ZERO",  # a digit: confusables.txt maps it to `.`
    "\u06f0": "EXTENDED ARABIC-INDIC DIGIT ZERO",
    "\ua4f8": "LISU LETTER TONE MYA TI",  # a modifier letter (Lm), drawn as a full stop
    "\u00b7": "MIDDLE DOT",
    "\u16eb": "RUNIC SINGLE PUNCTUATION",
    "\u2e31": "WORD SEPARATOR MIDDLE DOT",
    "\u22c5": "DOT OPERATOR",
    "\u2219": "BULLET OPERATOR",
    "\u2027": "HYPHENATION POINT",
    "\u0387": "GREEK ANO TELEIA",
    "\u2e33": "RAISED DOT",  # (named a dot: by property)
    "\u0338": "COMBINING LONG SOLIDUS OVERLAY",  # (named a solidus: by property)
    "\u2afd": "DOUBLE SOLIDUS OPERATOR",
    "\U0001f67c": "VERY HEAVY SOLIDUS",
}
LETTERS = ["\u30ce", "\u4e3f", "\u2cc6", "\ua78f"]  # confusables too, but letters of a script: text, shown


@pytest.mark.parametrize("ch", sorted(LOOKALIKES))
def test_every_look_alike_of_a_dot_or_a_slash_that_is_no_letter_is_escaped(ch: str) -> None:
    assert unicodedata.name(ch) == LOOKALIKES[ch]
    code = f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}" if ord(ch) < 0x10000 else f"\\U{ord(ch):08x}"
    for name in (f"{ch}{ch}/etc/passwd", f"src{ch}py", f"x{ch}"):
        assert ui.visible(name) == name.replace(ch, code), name


def test_every_punctuation_named_a_dot_is_escaped_and_letters_are_shown() -> None:
    named = [
        chr(c) for c in range(0x80, 0x20000)
        if unicodedata.category(chr(c)).startswith("P") and unicodedata.name(chr(c), "").endswith((" DOT", " POINT"))
    ]  # fmt: skip
    assert len(named) >= 20 and "\u00b7" in named
    for ch in named:
        assert ch not in ui.visible(f"a{ch}b"), f"U+{ord(ch):04X} {unicodedata.name(ch)}"
    for ch in LETTERS:
        assert ui.visible(f"a{ch}b") == f"a{ch}b"
