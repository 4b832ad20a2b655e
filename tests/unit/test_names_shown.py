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
