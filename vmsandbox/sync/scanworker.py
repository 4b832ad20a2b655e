"""The credential scanner's process: detect-secrets over file contents given on stdin; findings on stdout.

It runs in the jail (credentials.py) when the contents are the guest's: a scanner is a parser of hostile bytes
like any other. Input: JSON `[[name, base64 content], …]`; each content is written under the jail's own /tmp
with its file name (detect-secrets chooses rules by file type) and scanned with its default plugins and filters.
Output: JSON `[[index, type, line number, secret], …]`.
"""

from __future__ import annotations

import base64
import json
import sys
import tempfile
from pathlib import Path


def main() -> None:
    from detect_secrets.core.secrets_collection import SecretsCollection
    from detect_secrets.settings import default_settings

    files = json.load(sys.stdin)
    found: list[list[object]] = []
    with tempfile.TemporaryDirectory() as top, default_settings():
        where: dict[str, int] = {}
        for index, (name, data) in enumerate(files):
            folder = Path(top) / str(index)
            folder.mkdir()
            written = folder / (Path(name).name or "file")
            written.write_bytes(base64.b64decode(data))
            where[str(written)] = index
        collection = SecretsCollection(root=top)
        for path in where:
            collection.scan_file(path)
        for filename, secrets in collection.data.items():
            index = where.get(filename, where.get(str(Path(top) / filename), -1))
            found.extend([index, s.type, s.line_number, s.secret_value or ""] for s in secrets)
    json.dump(found, sys.stdout)


if __name__ == "__main__":
    main()
