"""The scanner's process: detect-secrets over file contents given on stdin, and a look at whether other
contents are pickles that load code; findings on stdout.

It runs in the jail (credentials.py) when the contents are the guest's: a scanner is a parser of hostile bytes
like any other. Input: JSON `{"scan": [[name, base64 content], …], "pickles": [[name, base64 content], …]}`.
Output: JSON `{"found": [[index, type, line number, secret], …], "pickles": [index, …]}`: the index of each
content that Python's unpickler would read from its first byte as a pickle naming a global (a class or a
function: loading it calls code), seen by pickletools, which parses and never loads.

detect-secrets' rules (its plugins: the known token formats, keywords, entropy; and its false-positive filters)
run over each file's lines by file name, but only over the lines that could hold a secret at all: a word of
the keyword family or a run of 16 token characters (every plugin's pattern needs one or the other). A line
costs detect-secrets a fraction of a millisecond whatever it holds, and source files are mostly lines like
`return x + 1`: this keeps a 1,000-file review from waiting half a minute for the scanner.
"""

from __future__ import annotations

import base64
import json
import re
import sys

CANDIDATE = re.compile(  # credentials.CANDIDATE, for text (this process imports nothing of vmsandbox)
    r"(?i)key|secret|token|passw|pwd|auth|credential|private|bearer|api|sig|session|cookie|://|[A-Za-z0-9+/=_-]{16}"
)


# Opcodes through which a pickle names code (a class or a function the unpickler imports, then calls through
# REDUCE, BUILD, OBJ or NEWOBJ): pickletools' names. GLOBAL and INST carry the names in the stream (text
# protocols); the others take them from the stack or the extension registry (binary protocols).
NAMES_CODE = frozenset({"GLOBAL", "INST", "STACK_GLOBAL", "EXT1", "EXT2", "EXT4"})
_DOTTED = re.compile(r"[A-Za-z_][\w.]*")


def loads_code(data: bytes) -> bool:
    """Whether `data`, read by Python's unpickler from its first byte, names code before it stops or fails
    (parsed by pickletools, never loaded). The unpickler runs each opcode as it reads it, so a stream cut
    short after a call has made that call: a failure after a name counts as a pickle too."""
    import io
    import pickletools

    try:
        for opcode, arg, _pos in pickletools.genops(io.BytesIO(data)):
            if opcode.name in ("GLOBAL", "INST"):  # "module name": both must be names the unpickler can import
                if all(_DOTTED.fullmatch(part) for part in str(arg).split(" ", 1)) and " " in str(arg):
                    return True
            elif opcode.name in NAMES_CODE:
                return True
            elif opcode.name == "STOP":
                return False
    except Exception:  # noqa: BLE001 - whatever the bytes are, the unpickler fails on them here
        return False
    return False


def main() -> None:
    request = json.load(sys.stdin)
    found: list[list[object]] = []
    if request["scan"]:
        from detect_secrets.core.scan import _process_line_based_plugins
        from detect_secrets.settings import default_settings

        with default_settings():
            for index, (name, data) in enumerate(request["scan"]):
                text = base64.b64decode(data).decode(errors="replace")
                lines = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if CANDIDATE.search(line)]
                if not lines:
                    continue
                for secret in _process_line_based_plugins(lines=lines, filename=name):
                    found.append([index, secret.type, secret.line_number, secret.secret_value or ""])
    pickles = [i for i, (_name, data) in enumerate(request["pickles"]) if loads_code(base64.b64decode(data))]
    json.dump({"found": found, "pickles": pickles}, sys.stdout)


if __name__ == "__main__":
    main()
