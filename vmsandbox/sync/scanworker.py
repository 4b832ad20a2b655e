"""The credential scanner's process: detect-secrets over file contents given on stdin; findings on stdout.

It runs in the jail (credentials.py) when the contents are the guest's: a scanner is a parser of hostile bytes
like any other. Input: JSON `[[name, base64 content], …]`. Output: JSON `[[index, type, line number, secret],
…]`.

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


def main() -> None:
    from detect_secrets.core.scan import _process_line_based_plugins
    from detect_secrets.settings import default_settings

    files = json.load(sys.stdin)
    found: list[list[object]] = []
    with default_settings():
        for index, (name, data) in enumerate(files):
            text = base64.b64decode(data).decode(errors="replace")
            lines = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if CANDIDATE.search(line)]
            if not lines:
                continue
            for secret in _process_line_based_plugins(lines=lines, filename=name):
                found.append([index, secret.type, secret.line_number, secret.secret_value or ""])
    json.dump(found, sys.stdout)


if __name__ == "__main__":
    main()
