"""The scanner's process: detect-secrets over file contents given on stdin, and a look at whether other
contents are pickles that load code; findings on stdout.

It runs in the jail (credentials.py) when the contents are the guest's: a scanner is a parser of hostile bytes
like any other. Input: JSON `{"scan": [[name, base64 content], …], "pickles": [[name, base64 content], …]}`.
Output: JSON `{"found": [[index, type, line number, secret], …], "pickles": [index, …]}`: the index of each
content that Python's unpickler, reading it from its first byte, would ask for code (a class or a function:
what REDUCE, BUILD, OBJ and NEWOBJ call). It is read by that same unpickler, whose `find_class` — the one way a
pickle reaches code, for GLOBAL, INST, STACK_GLOBAL and the extension registry alike — stops the load and says
so: the parser is the one a real load uses, and nothing it names is ever imported.

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


_DOTTED = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*")


class _NamesCode(Exception):  # noqa: N818 - control flow: the pickle asked for code
    pass


def loads_code(data: bytes) -> bool:
    """Whether Python's unpickler, loading `data` from its first byte, asks for code before it stops or fails.
    A stream that fails later has asked for nothing before its failure (code is only reached through
    find_class, which is asked when the name is read): so a failure is no pickle that runs code."""
    import io
    import pickle

    class Finder(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> object:
            if _DOTTED.fullmatch(module) and _DOTTED.fullmatch(name):
                raise _NamesCode
            raise pickle.UnpicklingError  # no module is called that: a real load fails here, having run nothing

    try:
        Finder(io.BytesIO(data)).load()
    except _NamesCode:
        return True
    except Exception:  # noqa: BLE001 - whatever else the bytes do to the unpickler, they name no code
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
